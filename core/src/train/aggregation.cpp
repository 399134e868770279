#include <fax/train/aggregation.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <utility>

#include <fax/base/error.h>
#include <fax/base/rng.h>
#include <fax/base/settings.h>
#include <fax/spmd/client_states.h>
#include <fax/spmd/primitives.h>
#include <fax/spmd/secure_sum.h>
#include <fax/train/privacy.h>

namespace fax {

// What a client stage sees of a chunk besides its updates.
struct Aggregation::ClientRound {
  const ClientChunk& chunk;
  const at::Tensor& kept;  // [k]: 0 for a client dropped from the round (its row is zeros)
  ClientStates& states;
  const TensorTree& state;  // the pipeline's server state this round
  TensorTree& stats;  // per-client statistics [k] for the round's metrics
};

struct Aggregation::Stage {
  virtual ~Stage() = default;
  // Client stages: a chunk's updates [k, ...] -> what the clients send.
  virtual TensorTree client(const TensorTree& rows, const ClientRound& /*round*/) const { return rows; }
  // Aggregators: the kept updates, flattened [n, P] -> the statistic [P].
  virtual at::Tensor aggregate(const at::Tensor& rows, int64_t /*round*/) const { return rows; }
  // Server stages: the sum of the updates -> what the server steps with.
  virtual TensorTree server(const TensorTree& sum, uint64_t, int64_t, int64_t, int64_t, const TensorTree& /*state*/,
                            TensorTree&) const {
    return sum;
  }
  // Server state kept across rounds (keys under the stage's name), and the next round's from this
  // round's client statistics (Aggregation::next_state).
  virtual TensorTree initial_state() const { return {}; }
  virtual void check_state(const TensorTree& /*state*/, const std::string& /*where*/) const {}
  virtual TensorTree next_state(const TensorTree& /*state*/, const TensorTree& /*stat_sums*/, double /*kept*/,
                                uint64_t, int64_t, int64_t, TensorTree& /*metrics*/) const {
    return {};
  }
  // The noise std of a count the stage releases besides the sum (adaptive clipping's), which the
  // privacy ledger must charge; none: it releases nothing.
  virtual std::optional<double> released_count_noise() const { return std::nullopt; }
  // Whether the stage adds noise (a round must then release it even without clients).
  virtual bool noised() const { return false; }
  // Refuses, naming `where`, cohorts of `size` clients (Poisson: `size` on average) it cannot use.
  virtual void check_cohort(int64_t /*size*/, bool /*poisson*/, const std::string& /*where*/) const {}
  // Whether a derivative through the stage is the stage's (federated AD through the round).
  virtual bool differentiable() const { return true; }
  // The sum stage: how the updates are summed (secure_sum); none: in the clear.
  virtual const SecureSum* secure() const { return nullptr; }
  // For DP: a bound on the L2 norm of what the stage passes on for one client whose update has
  // norm at most `bound` (the sum's leaves `like` give the sizes), and why there is none if not.
  virtual double norm_bound(double bound, const TensorTree& /*like*/, const TensorTree& /*state*/) const {
    return bound;
  }
  virtual std::string unbounded() const { return ""; }
  // A compressor: the bits one client sends for an update whose leaves hold `sizes` values of
  // `value_bits` each (the same for every client and round).
  virtual std::optional<int64_t> sent_bits(const std::vector<int64_t>& /*sizes*/, int64_t /*value_bits*/) const {
    return std::nullopt;
  }
};

namespace {

using ClientRound = Aggregation::ClientRound;

constexpr const char* kClient = "client";
constexpr const char* kAggregator = "aggregator";
constexpr const char* kSum = "sum";
constexpr const char* kServer = "server";
// The aggregator that is no statistic of its own: the mean a pipeline takes anyway, written out so
// a sweep can set it against robust aggregators.
constexpr const char* kMean = "mean";
// Independent streams: the byzantine draw (server side, once per run), the attackers' noise (per
// client and round) and the DP noise (server, per round; dp_fedavg's stream, so the two agree).
constexpr uint64_t kByzantineStream = 0x62797a;    // "byz"
constexpr uint64_t kAttackStream = 0x61747461636b;  // "attack"
constexpr uint64_t kNoiseStream = 0x6e6f697365;     // "noise"
constexpr uint64_t kCompressStream = 0x636f6d70;    // "comp": stochastic rounding, random-k's coordinates
constexpr uint64_t kCountStream = 0x636f756e74;     // "count": adaptive clipping's noise on its count
// Error feedback's per-client residuals, in ClientStates beside any algorithm's state.
const std::string kErrorState = "aggregation/error/";
// Beside secure_sum's integers in the summed rows, under federated AD: the float rows the
// derivative flows through.
const std::string kPlain = "__secure/plain/";

// --- clip: each update scaled to L2 norm at most C (per_layer: each leaf to C / sqrt(L)). C is
// `norm`, or with `adaptive` (Andrew et al. 2021) server state moved every round toward the
// target quantile of the update norms: with b the noised share of unclipped updates,
//   C <- C exp(-clip_lr (b - target_quantile)),
//   b = (sum_i (unclipped_i - 1/2) + N(0, count_noise^2)) / n + 1/2   (n: the cohort size),
// the centred count having sensitivity 1/2, so gaussian charges both releases at the combined
// noise multiplier (z^-2 + (2 count_noise)^-2)^-1/2 (their Theorem 1).
struct ClipOptions {
  double norm = 1.0;
  bool per_layer = false;
  bool adaptive = false;
  double target_quantile = 0.5;
  double clip_lr = 0.2;
  double count_noise = 0.0;
};

struct Clip final : Aggregation::Stage {
  static const Settings<ClipOptions>& settings() {
    static const Settings<ClipOptions> table = Settings<ClipOptions>()
        .add("norm", &ClipOptions::norm, "C: each client's update is scaled down to L2 norm at most C", positive())
        .add("per_layer", &ClipOptions::per_layer,
             "clip each parameter tensor to C / sqrt(number of tensors) instead (the whole update stays within C)")
        .add("adaptive", &ClipOptions::adaptive,
             "move C every round toward the target quantile of the update norms (norm: its initial value; C is "
             "checkpointed server state)")
        .add("target_quantile", &ClipOptions::target_quantile, "adaptive: share of the updates C should leave unclipped",
             in(0, 1))
        .add("clip_lr", &ClipOptions::clip_lr, "adaptive: geometric step, C <- C exp(-clip_lr (unclipped share - target))",
             positive())
        .add("count_noise", &ClipOptions::count_noise,
             "adaptive: noise std on the unclipped count the server sees (needed > 0 with gaussian: the count is "
             "released too, and charged to the privacy ledger)", at_least(0));
    return table;
  }
  explicit Clip(ClipOptions o) : o(o) {}

  static constexpr const char* kNorm = "clip/norm";
  double bound(const TensorTree& state) const { return o.adaptive ? state.at(kNorm).item<double>() : o.norm; }

  TensorTree initial_state() const override {
    if (!o.adaptive) return {};
    return TensorTree{{kNorm, at::scalar_tensor(o.norm, at::kDouble)}};
  }

  void check_state(const TensorTree& state, const std::string& where) const override {
    if (!o.adaptive) return;
    const double clip = bound(state);
    FAX_CHECK(std::isfinite(clip) && clip > 0, "{}: the adaptive clip norm (aggregation/{}) is {}; it must be finite and "
              "positive", where, kNorm, clip);
  }

  TensorTree next_state(const TensorTree& state, const TensorTree& stat_sums, double kept, uint64_t seed,
                        int64_t round, int64_t cohort, TensorTree& metrics) const override {
    if (!o.adaptive) return {};
    const double clip = bound(state);
    const double unclipped = kept - stat_sums.at(kClippedShare).item<double>();
    at::Generator g = server_generator(seed, round, kCountStream);
    const double noise = o.count_noise > 0 ? o.count_noise * at::randn({1}, g, at::kDouble).item<double>() : 0.0;
    const double share = (unclipped - kept / 2 + noise) / static_cast<double>(cohort) + 0.5;
    metrics.set("aggregation/clip_norm", at::scalar_tensor(clip, at::kDouble));
    metrics.set("aggregation/unclipped_estimate", at::scalar_tensor(share, at::kDouble));
    const double next = clip * std::exp(-o.clip_lr * (share - o.target_quantile));
    // A huge count noise can drive C to 0 (every update zeroed from then on) or to infinity.
    FAX_CHECK(std::isfinite(next) && next > 0,
              "round {}: the adaptive clip norm moved from {} to {} (unclipped estimate {}); lower aggregation.clip.clip_lr "
              "or aggregation.clip.count_noise",
              round + 1, clip, next, share);
    return TensorTree{{kNorm, at::scalar_tensor(next, at::kDouble)}};
  }

  std::optional<double> released_count_noise() const override {
    return o.adaptive ? std::optional<double>(o.count_noise) : std::nullopt;
  }

  TensorTree client(const TensorTree& rows, const ClientRound& round) const override {
    TensorTree& stats = round.stats;
    const double clip = bound(round.state);
    const auto factor = [](const at::Tensor& norms, double bound) {
      return (bound / norms.clamp_min(1e-12)).clamp_max(1.0);
    };
    const at::Tensor norms = row_sums(rows.map([](const at::Tensor& t) { return t * t; })).sqrt();
    if (!o.per_layer) {
      stats.set(kClippedShare, norms.gt(clip).to(at::kDouble));
      stats.set("aggregation/update_norm", norms.detach().to(at::kDouble));
      return scale_rows(rows, factor(norms, clip));
    }
    const double bound = clip / std::sqrt(static_cast<double>(rows.size()));
    at::Tensor clipped = at::zeros({leading_size(rows)}, at::kDouble);
    TensorTree out;
    for (const auto& [name, t] : rows) {
      const at::Tensor leaf_norms = t.flatten(1).norm(2, {1});
      clipped = clipped.logical_or(leaf_norms.gt(bound)).to(at::kDouble);
      out.set(name, scale_rows(TensorTree{{name, t}}, factor(leaf_norms, bound)).at(name));
    }
    stats.set(kClippedShare, clipped);
    stats.set("aggregation/update_norm", norms.detach().to(at::kDouble));
    return out;
  }

  double norm_bound(double bound, const TensorTree&, const TensorTree& state) const override {
    return std::min(bound, this->bound(state));
  }

  static constexpr const char* kClippedShare = "aggregation/clipped_fraction";

  ClipOptions o;
};

// --- compression: what a client sends instead of its update, with the bits it takes (float
// values count their dtype's width). With error feedback (Karimireddy et al. 2019) a client adds
// what compression lost in its earlier rounds before compressing, and keeps the new loss.
struct Compressor : Aggregation::Stage {
  explicit Compressor(bool error_feedback) : error_feedback(error_feedback) {}
  bool differentiable() const override { return false; }
  std::string unbounded() const override {
    return error_feedback ? "with error_feedback a client adds its earlier remainders, so what it sends has no norm bound "
                            "(and the remainders are private state the noise does not cover)"
                          : "";
  }

  TensorTree client(const TensorTree& rows, const ClientRound& round) const override {
    at::Tensor flat = flatten_rows(rows, at::kDouble);
    TensorTree residual;
    if (error_feedback) {
      TensorTree zeros;
      for (const auto& [name, t] : rows) zeros.set(Aggregation::error_state(name), at::zeros(t.sizes().slice(1), t.options()));
      residual = round.states.gather(round.chunk, zeros);
      flat = flat + flatten_rows(residual, at::kDouble);
    }
    std::vector<int64_t> sizes;
    for (const auto& [name, t] : rows) sizes.push_back(c10::multiply_integers(t.sizes().slice(1)));
    const int64_t value_bits = static_cast<int64_t>(rows.begin()->second.element_size()) * 8;
    const at::Tensor sent = compress(flat, rows, round.chunk);
    if (error_feedback) {
      // A dropped client sent nothing: its residual stays.
      const at::Tensor kept = round.kept.to(at::kBool).view({-1, 1});
      const at::Tensor left = at::where(kept, flat - sent, flatten_rows(residual, at::kDouble));
      round.states.scatter(round.chunk, unflatten_rows(left, residual));
    }
    round.stats.set("aggregation/bits_sent",
                    at::full({flat.size(0)}, static_cast<double>(*sent_bits(sizes, value_bits)), at::kDouble));
    return unflatten_rows(sent, rows);
  }
  // flat [k, P] (double; `like`: the leaves) -> what is sent [k, P].
  virtual at::Tensor compress(const at::Tensor& flat, const TensorTree& like, const ClientChunk& chunk) const = 0;

  // A generator per client and round, so a client's draws do not depend on its chunk.
  static at::Generator generator(const ClientChunk& chunk, int64_t i) {
    return client_generator(chunk.program.seed() ^ kCompressStream, chunk.program.round(), chunk.client_id(i));
  }

  bool error_feedback;
};

const char* const kErrorFeedbackHelp =
    "keep what compression lost on each client (checkpointed) and add it to its next update";

// quantize: each tensor of an update to 2^b levels spread evenly over its [min, max] (which are
// sent too, as two values); stochastic rounding is unbiased, deterministic rounds to nearest.
struct QuantizeOptions {
  int64_t bits = 8;
  bool stochastic = true;
  bool error_feedback = false;
};

struct Quantize final : Compressor {
  static const Settings<QuantizeOptions>& settings() {
    static const Settings<QuantizeOptions> table = Settings<QuantizeOptions>()
        .add("bits", &QuantizeOptions::bits, "b: 2^b levels per tensor", in(1, 16))
        .add("stochastic", &QuantizeOptions::stochastic,
             "round up with probability the distance to the level below (unbiased); false: to the nearest level")
        .add("error_feedback", &QuantizeOptions::error_feedback, kErrorFeedbackHelp);
    return table;
  }
  explicit Quantize(QuantizeOptions o) : Compressor(o.error_feedback), o(o) {}

  // Each tensor: b bits per value, and its minimum and maximum.
  std::optional<int64_t> sent_bits(const std::vector<int64_t>& sizes, int64_t value_bits) const override {
    int64_t bits = 0;
    for (int64_t size : sizes) bits += size * o.bits + 2 * value_bits;
    return bits;
  }

  at::Tensor compress(const at::Tensor& flat, const TensorTree& like, const ClientChunk& chunk) const override {
    const int64_t k = flat.size(0);
    at::Tensor uniform;
    if (o.stochastic) {
      std::vector<at::Tensor> draws;
      for (int64_t i = 0; i < k; ++i) {
        at::Generator g = generator(chunk, i);
        draws.push_back(at::rand({flat.size(1)}, g, at::kDouble));
      }
      uniform = k > 0 ? at::stack(draws) : at::empty({0, flat.size(1)}, at::kDouble);
    }
    const double levels = std::ldexp(1.0, static_cast<int>(o.bits)) - 1;
    std::vector<at::Tensor> parts;
    int64_t offset = 0;
    for (const auto& [name, t] : like) {
      const int64_t size = c10::multiply_integers(t.sizes().slice(1));
      const at::Tensor x = flat.narrow(1, offset, size);
      const at::Tensor lo = x.amin(1, true), hi = x.amax(1, true);
      // A constant tensor is its minimum: any step reproduces it.
      const at::Tensor step = ((hi - lo) / levels).masked_fill(hi.eq(lo), 1.0);
      const at::Tensor v = (x - lo) / step;
      const at::Tensor q = (o.stochastic ? (v + uniform.narrow(1, offset, size)).floor() : v.round()).clamp(0, levels);
      parts.push_back(lo + q * step);
      offset += size;
    }
    return at::cat(parts, 1);
  }

  // Rounding a tensor of n values moves each by less than its step (stochastic; half of it when
  // deterministic), and the step is at most 2 max|x| / (2^b - 1) <= 2 |x|_2 / (2^b - 1): so the
  // error is below 2 sqrt(n) |x| / (2^b - 1) (n: the largest tensor) and the bound grows by that.
  double norm_bound(double bound, const TensorTree& like, const TensorTree&) const override {
    int64_t largest = 0;
    for (const auto& [name, t] : like) largest = std::max(largest, t.numel());
    const double levels = std::ldexp(1.0, static_cast<int>(o.bits)) - 1;
    return bound * (1 + (o.stochastic ? 2.0 : 1.0) * std::sqrt(static_cast<double>(largest)) / levels);
  }

  QuantizeOptions o;
};

// top_k / random_k: keep k = ceil(fraction P) of an update's P values, the largest in magnitude
// (sent with their indices) or drawn from the client's seed (which the server shares: values
// only). random_k scales what it keeps by P / k, unbiased, unless error feedback carries the rest.
struct SparsifyOptions {
  double fraction = 0.01;
  bool error_feedback = false;
};

const Settings<SparsifyOptions>& sparsify_settings() {
  static const Settings<SparsifyOptions> table = Settings<SparsifyOptions>()
      .add("fraction", &SparsifyOptions::fraction, "share of each update's values sent (k = ceil(fraction P))",
           above(0, 1))
      .add("error_feedback", &SparsifyOptions::error_feedback, kErrorFeedbackHelp);
  return table;
}

template <bool Random>
struct Sparsify final : Compressor {
  explicit Sparsify(SparsifyOptions o) : Compressor(o.error_feedback), o(o) {}
  // top_k only drops values; random_k's P / k scaling multiplies the bound by P / k.
  std::string unbounded() const override {
    if (Random && !error_feedback)
      return "its P / k rescaling multiplies the clip bound by P / k (use top_k, which only drops values)";
    return Compressor::unbounded();
  }

  // k values, with their indices unless drawn from the shared seed.
  std::optional<int64_t> sent_bits(const std::vector<int64_t>& sizes, int64_t value_bits) const override {
    const int64_t p = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    const int64_t index_bits = Random ? 0 : static_cast<int64_t>(std::ceil(std::log2(static_cast<double>(p))));
    return kept_values(p) * (value_bits + index_bits);
  }
  int64_t kept_values(int64_t p) const {
    return std::min(p, static_cast<int64_t>(std::ceil(o.fraction * static_cast<double>(p))));
  }

  at::Tensor compress(const at::Tensor& flat, const TensorTree&, const ClientChunk& chunk) const override {
    const int64_t k = flat.size(0), p = flat.size(1);
    const int64_t kept = kept_values(p);
    at::Tensor index;
    if constexpr (Random) {
      std::vector<at::Tensor> rows;
      for (int64_t i = 0; i < k; ++i) {
        at::Generator g = generator(chunk, i);
        rows.push_back(at::randperm(p, g, at::kLong).narrow(0, 0, kept));
      }
      index = k > 0 ? at::stack(rows) : at::empty({0, kept}, at::kLong);
    } else {
      index = std::get<1>(flat.abs().topk(kept, 1));
    }
    const double factor = Random && !error_feedback ? static_cast<double>(p) / static_cast<double>(kept) : 1.0;
    return at::zeros_like(flat).scatter(1, index, flat.gather(1, index) * factor);
  }

  SparsifyOptions o;
};

// --- secure_sum: the updates summed as integers modulo 2^b (fax/spmd/secure_sum.h).
struct SecureSumStage final : Aggregation::Stage {
  static const Settings<SecureSumOptions>& settings() {
    static const Settings<SecureSumOptions> table = Settings<SecureSumOptions>()
        .add("bits", &SecureSumOptions::bits, "b: every value and the sum are integers modulo 2^b", in(2, 32))
        .add("range", &SecureSumOptions::range,
             "R: the fixed-point grid covers [-R, R) in steps of 2R / 2^b; a value outside is clipped to it, a sum "
             "outside wraps around (both counted)", positive())
        .add("masks", &SecureSumOptions::masks,
             "add per-pair masks that cancel in the sum (each client's message alone is uniform mod 2^b)")
        .add("neighbors", &SecureSumOptions::neighbors,
             "with masks: pair each client with this many cohort neighbours on a ring (SecAgg+; costs neighbors x "
             "update size draws a client); 0: with every other client (cohort x update size)", at_least(0));
    return table;
  }
  explicit SecureSumStage(SecureSumOptions o) : sum(o) {}
  const SecureSum* secure() const override { return &sum; }
  // Rounding to the grid moves each of the P values by at most half a step; clipping to the
  // range only shrinks them.
  double norm_bound(double bound, const TensorTree& like, const TensorTree&) const override {
    return bound + std::sqrt(static_cast<double>(like.numel())) * sum.step() / 2;
  }

  SecureSum sum;
};

// --- gaussian: N(0, (z S)^2) on the sum of the clipped updates, with the RDP or PLD ledger.
struct GaussianOptions {
  double noise_multiplier = 1.0;
  double delta = 1e-5;
  std::string accountant = "rdp";
  double pld_interval = kPldInterval;
};

struct Gaussian final : Aggregation::Stage {
  static const Settings<GaussianOptions>& settings() {
    static const Settings<GaussianOptions> table = Settings<GaussianOptions>()
        .add("noise_multiplier", &GaussianOptions::noise_multiplier,
             "z: the noise on the sum has standard deviation z S (S: the bound on one client's contribution: "
             "the clip norm C, grown by the rounding of quantize or secure_sum after it); 0: no noise (an "
             "ablation: the clipped, uniformly weighted mean, epsilon infinite)", at_least(0))
        .add("delta", &GaussianOptions::delta, "delta of the (epsilon, delta) the ledger reports", above(0, 1))
        .add("accountant", &GaussianOptions::accountant,
             "rdp: the Renyi bound of the sampled Gaussian mechanism; pld: its privacy loss distribution "
             "(tighter, a few FFTs a round)", one_of({"rdp", "pld"}))
        .add("pld_interval", &GaussianOptions::pld_interval,
             "the pld accountant's grid of losses: finer is tighter and slower (epsilon pessimistic by the "
             "order of steps x interval^2; a round's ledger costs about log2(rounds) FFTs of (loss range / "
             "interval) points)", in(1e-4, 0.1));
    return table;
  }
  // `before`: the stages before it, which bound what one client contributes.
  Gaussian(GaussianOptions o, std::vector<std::shared_ptr<const Aggregation::Stage>> before)
      : o(o), before(std::move(before)), ledger_noise(o.noise_multiplier) {
    FAX_CHECK(o.delta < 1, "aggregation.gaussian.delta is 1: an (epsilon, 1) guarantee promises nothing; take delta "
                           "below 1 / population (e.g. 1e-5)");
    // The PLD's cut tails (about 1e-15 a round) must stay far below delta for 10^4 rounds.
    FAX_CHECK(o.accountant != "pld" || o.delta >= 1e-9,
              "aggregation.gaussian.delta {} is below what the pld accountant resolves (1e-9): use accountant: rdp",
              o.delta);
    // A count released beside the sum shares the budget: the pair is one Gaussian mechanism.
    if (o.noise_multiplier == 0) return;  // nothing private: the ledger says infinity
    for (const auto& stage : this->before) {
      const std::optional<double> sigma = stage->released_count_noise();
      if (!sigma) continue;
      FAX_CHECK(*sigma > 0, "aggregation.clip.count_noise is 0 with adaptive clipping and gaussian: the unclipped count "
                            "is released every round, so it needs noise too (Andrew et al. take about cohort / 20)");
      ledger_noise = combined_noise_multiplier(ledger_noise, *sigma);
    }
  }

  bool noised() const override { return o.noise_multiplier > 0; }

  TensorTree server(const TensorTree& sum, uint64_t seed, int64_t round, int64_t cohort, int64_t population,
                    const TensorTree& state, TensorTree& metrics) const override {
    double sensitivity = std::numeric_limits<double>::infinity();
    for (const auto& stage : before) sensitivity = stage->norm_bound(sensitivity, sum, state);
    at::Generator g = server_generator(seed, round, kNoiseStream);
    const TensorTree noised = sum.map([&](const at::Tensor& t) {
      const at::Tensor noise = at::randn(t.sizes(), g, t.options().dtype(at::kDouble)).to(t.scalar_type());
      return t + noise * (o.noise_multiplier * sensitivity);
    });
    metrics.set("privacy/sensitivity", at::scalar_tensor(sensitivity, at::kDouble));
    // Cohorts are drawn without replacement at a fixed size and accounted as Poisson sampling at
    // rate cohort / population (as TensorFlow Privacy does); README "Aggregation" says so.
    const double q = static_cast<double>(cohort) / static_cast<double>(population);
    metrics.set("privacy/epsilon", at::scalar_tensor(epsilon(q, round + 1), at::kDouble));
    return noised;
  }

  // Every executor holds the server's value and runs this; the ledger is a pure function of
  // (q, rounds), so the first executor to ask computes it (the PLD's FFTs) and the others read it.
  double epsilon(double q, int64_t rounds) const {
    if (ledger_noise == 0) return std::numeric_limits<double>::infinity();
    std::lock_guard<std::mutex> lock(ledger_mutex);
    if (ledger_key != std::make_pair(q, rounds)) {
      ledger_value = o.accountant == "pld" ? sgm_epsilon_pld(q, ledger_noise, rounds, o.delta, o.pld_interval)
                                           : sgm_epsilon(q, ledger_noise, rounds, o.delta).epsilon;
      ledger_key = {q, rounds};
    }
    return ledger_value;
  }

  GaussianOptions o;
  std::vector<std::shared_ptr<const Aggregation::Stage>> before;
  double ledger_noise;  // the multiplier the ledger charges: z, or combined with a released count's
  mutable std::mutex ledger_mutex;
  mutable std::pair<double, int64_t> ledger_key{-1, -1};
  mutable double ledger_value = 0;
};

// --- median: the coordinate-wise median (the mean of the two middle values for an even count).
struct NoOptions {};

struct Median final : Aggregation::Stage {
  at::Tensor aggregate(const at::Tensor& rows, int64_t) const override {
    const at::Tensor sorted = std::get<0>(rows.sort(0));
    const int64_t n = rows.size(0);
    return (sorted[(n - 1) / 2] + sorted[n / 2]) / 2;
  }
};

// --- trimmed_mean: per coordinate, the mean without the floor(trim n) largest and smallest.
struct TrimmedMeanOptions {
  double trim = 0.1;
};

struct TrimmedMean final : Aggregation::Stage {
  static const Settings<TrimmedMeanOptions>& settings() {
    static const Settings<TrimmedMeanOptions> table = Settings<TrimmedMeanOptions>().add(
        "trim", &TrimmedMeanOptions::trim, "share of the updates dropped at each end, per coordinate", in(0, 0.499));
    return table;
  }
  explicit TrimmedMean(TrimmedMeanOptions o) : o(o) {}

  at::Tensor aggregate(const at::Tensor& rows, int64_t round) const override {
    const int64_t n = rows.size(0);
    const auto k = static_cast<int64_t>(std::floor(o.trim * static_cast<double>(n)));
    FAX_CHECK(n - 2 * k > 0, "round {}: aggregation.trimmed_mean.trim {} leaves none of the {} updates", round + 1,
              o.trim, n);
    return std::get<0>(rows.sort(0)).narrow(0, k, n - 2 * k).mean(0);
  }

  TrimmedMeanOptions o;
};

// --- krum (Blanchard et al. 2017): score each update by its squared distances to its n - f - 2
// nearest others; the mean of the `select` best (select 1: Krum; more: multi-Krum).
struct KrumOptions {
  int64_t byzantine = 1;
  int64_t select = 1;
};

struct Krum final : Aggregation::Stage {
  static const Settings<KrumOptions>& settings() {
    static const Settings<KrumOptions> table = Settings<KrumOptions>()
        .add("byzantine", &KrumOptions::byzantine, "f: byzantine updates tolerated (needs n > 2 f + 2)", at_least(0))
        .add("select", &KrumOptions::select, "m: updates averaged, best scores first (1: Krum; more: multi-Krum)",
             at_least(1));
    return table;
  }
  explicit Krum(KrumOptions o) : o(o) {}

  void check_cohort(int64_t size, bool poisson, const std::string& where) const override {
    FAX_CHECK(!poisson, "{}: krum scores a fixed number of updates (it needs more than 2 byzantine + 2 in every "
              "round), which Poisson sampling does not give: use cohort.sampling: uniform, or median or trimmed_mean",
              where);
    FAX_CHECK(size > 2 * o.byzantine + 2 && o.select <= size,
              "{}: krum with aggregation.krum.byzantine = {} and select = {} needs more than {} updates a round; "
              "cohort.size is {}", where, o.byzantine, o.select, std::max(2 * o.byzantine + 2, o.select - 1), size);
  }

  at::Tensor aggregate(const at::Tensor& rows, int64_t round) const override {
    const int64_t n = rows.size(0);
    FAX_CHECK(n > 2 * o.byzantine + 2 && o.select <= n,
              "round {}: krum with aggregation.krum.byzantine = {} and select = {} needs more than {} updates, got {}",
              round + 1, o.byzantine, o.select, std::max(2 * o.byzantine + 2, o.select - 1), n);
    // Direct differences, not the |a|^2 + |b|^2 - 2 a.b shortcut, which cancels for close updates.
    const at::Tensor d = at::cdist(rows.unsqueeze(0), rows.unsqueeze(0), 2.0, /*donot_use_mm_for_euclid_dist=*/2).squeeze(0).pow(2);
    // Each row's own zero distance sorts first: skip it.
    const at::Tensor scores = std::get<0>(d.sort(1)).narrow(1, 1, n - o.byzantine - 2).sum(1);
    // Ties go to the lower index (a stable sort), so every executor picks the same updates.
    const at::Tensor best = std::get<1>(scores.sort(/*stable=*/true, 0, false)).narrow(0, 0, o.select);
    return rows.index_select(0, std::get<0>(best.sort())).mean(0);
  }

  KrumOptions o;
};

struct StageEntry {
  AggregationStageInfo info;
  // Builds the stage from the config and the stages before it.
  using Before = std::vector<std::shared_ptr<const Aggregation::Stage>>;
  std::function<std::shared_ptr<const Aggregation::Stage>(const Config&, const std::string& prefix, const Before&)> make;
};

template <class S, class O>
StageEntry entry(const char* name, const char* role, const char* description, const Settings<O>& settings) {
  StageEntry e{{name, role, description, settings.keys()}, {}};
  e.make = [&settings](const Config& config, const std::string& prefix,
                       const StageEntry::Before& before) -> std::shared_ptr<const Aggregation::Stage> {
    if constexpr (std::is_same_v<S, Gaussian>) return std::make_shared<S>(settings.read(config, prefix), before);
    else if constexpr (std::is_same_v<O, NoOptions>) return std::make_shared<S>();
    else return std::make_shared<S>(settings.read(config, prefix));
  };
  return e;
}

// The mean: the pipeline's own sum, nothing to compute.
struct Mean final : Aggregation::Stage {};

const std::vector<StageEntry>& registry() {
  static const Settings<NoOptions> none;
  static const std::vector<StageEntry> stages = [] {
    std::vector<StageEntry> s;
    s.push_back(entry<Clip>("clip", kClient, "scale each client's update to L2 norm at most C", Clip::settings()));
    s.push_back(entry<Quantize>("quantize", kClient, "each tensor of an update to 2^b evenly spaced levels",
                                Quantize::settings()));
    s.push_back(entry<Sparsify<false>>("top_k", kClient, "send only the largest share of each update's values",
                                       sparsify_settings()));
    s.push_back(entry<Sparsify<true>>("random_k", kClient, "send a random share of each update's values (scaled by P / k)",
                                      sparsify_settings()));
    s.push_back(entry<Mean>(kMean, kAggregator,
                            "the example-weighted mean (uniform with gaussian): what a pipeline without an aggregator "
                            "takes, to set against the robust ones", none));
    s.push_back(entry<Median>("median", kAggregator, "coordinate-wise median of the updates, instead of their mean", none));
    s.push_back(entry<TrimmedMean>("trimmed_mean", kAggregator,
                                   "coordinate-wise mean without the largest and smallest share", TrimmedMean::settings()));
    s.push_back(entry<Krum>("krum", kAggregator, "Krum / multi-Krum: the mean of the updates closest to their neighbours",
                            Krum::settings()));
    s.push_back(entry<SecureSumStage>("secure_sum", kSum,
                                      "secure aggregation, simulated: updates on a fixed-point grid summed modulo "
                                      "2^b (wrapping on overflow), optionally pair-masked; the server sees the sum only",
                                      SecureSumStage::settings()));
    s.push_back(entry<Gaussian>("gaussian", kServer,
                                "Gaussian noise on the sum of the clipped updates (DP), epsilon logged every round",
                                Gaussian::settings()));
    return s;
  }();
  return stages;
}

bool robust(const StageEntry& e) { return e.info.role == kAggregator && e.info.name != kMean; }

bool compresses(const StageEntry& e) {
  return e.info.name == "quantize" || e.info.name == "top_k" || e.info.name == "random_k";
}

std::vector<std::string> split_stages(const std::string& text) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= text.size() && !text.empty()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    std::string name = text.substr(start, comma - start);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    names.push_back(name);
    start = comma + 1;
  }
  return names;
}

const StageEntry& find_stage(const std::string& name, const std::string& where) {
  std::vector<std::string> known;
  for (const StageEntry& e : registry()) {
    if (e.info.name == name) return e;
    known.push_back(e.info.name);
  }
  throw Error(fmt::format("{}: unknown aggregation stage '{}' (known: {})", where, name, fmt::join(known, ", ")));
}

// The stages `text` names, checked to compose.
std::vector<const StageEntry*> parse_stages(const std::string& text, const std::string& where) {
  std::vector<const StageEntry*> out;
  const StageEntry* aggregator = nullptr;
  const StageEntry* compressor = nullptr;
  const StageEntry* summer = nullptr;
  bool clipped = false, server = false;
  for (const std::string& name : split_stages(text)) {
    FAX_CHECK(!name.empty(), "{}: aggregation.stages '{}' has an empty stage name", where, text);
    const StageEntry& e = find_stage(name, where);
    for (const StageEntry* before : out)
      FAX_CHECK(before != &e, "{}: aggregation stage '{}' is listed twice", where, name);
    const std::string& role = e.info.role;
    if (role == kClient) {
      FAX_CHECK(aggregator == nullptr && summer == nullptr && !server,
                "{}: '{}' transforms each client's update, so it comes before '{}'", where, name,
                aggregator != nullptr ? aggregator->info.name
                                      : summer != nullptr ? summer->info.name : "the server stages");
      FAX_CHECK(compressor == nullptr || !compresses(e),
                "{}: '{}' and '{}' both compress the update; a pipeline has one compression stage (the bits one "
                "counts are not what the other sends)", where, compressor == nullptr ? "" : compressor->info.name, name);
      FAX_CHECK(compressor == nullptr, "{}: '{}' comes before '{}': a client sends its update compressed, so it is "
                                       "transformed before it is compressed", where, name,
                compressor == nullptr ? "" : compressor->info.name);
      if (compresses(e)) compressor = &e;
      clipped = clipped || name == "clip";
    } else if (role == kAggregator) {
      FAX_CHECK(aggregator == nullptr, "{}: '{}' and '{}' both replace the mean; a pipeline has one aggregator", where,
                aggregator == nullptr ? "" : aggregator->info.name, name);
      FAX_CHECK(!server, "{}: '{}' comes before the server stages, which act on what it makes of the updates", where,
                name);
      FAX_CHECK(summer == nullptr || !robust(e),
                "{}: '{}' needs every client's update, and after '{}' the server sees only their sum", where, name,
                summer == nullptr ? "" : summer->info.name);
      aggregator = &e;
    } else if (role == kSum) {
      FAX_CHECK(aggregator == nullptr || !robust(*aggregator),
                "{}: '{}' sums the updates, but '{}' before it already replaced their sum with a robust statistic "
                "(which needs every update in the clear)", where, name, aggregator == nullptr ? "" : aggregator->info.name);
      FAX_CHECK(!server, "{}: '{}' comes before the server stages, which act on the sum it produces", where, name);
      summer = &e;
    } else {
      FAX_CHECK(aggregator == nullptr || !robust(*aggregator),
                "{}: '{}' is calibrated to a sum of clipped updates; after '{}' (a robust statistic, not a sum) its "
                "noise would protect nothing it can account for",
                where, name, aggregator == nullptr ? "" : aggregator->info.name);
      FAX_CHECK(clipped, "{}: '{}' needs a clip stage before it: without a bound on each update the noise protects "
                         "nothing", where, name);
      server = true;
    }
    out.push_back(&e);
  }
  return out;
}

}  // namespace

const std::vector<AggregationStageInfo>& aggregation_stages() {
  static const std::vector<AggregationStageInfo> infos = [] {
    std::vector<AggregationStageInfo> out;
    for (const StageEntry& e : registry()) out.push_back(e.info);
    return out;
  }();
  return infos;
}

std::vector<ConfigKey> aggregation_keys(const std::string& stages, const std::string& where) {
  std::vector<ConfigKey> keys;
  for (const StageEntry* e : parse_stages(stages, where)) {
    for (ConfigKey k : e->info.keys) {
      k.name = "aggregation." + e->info.name + "." + k.name;
      keys.push_back(std::move(k));
    }
  }
  return keys;
}

std::vector<ConfigKey> aggregation_schema() {
  return {string_key("aggregation.stages", "",
                     "how client updates are combined: stages in order, e.g. clip,gaussian (in YAML a list: "
                     "aggregation: [{clip: {norm: 1}}, {gaussian: {noise_multiplier: 1}}]); empty: the "
                     "example-weighted mean"),
          float_key("clients.byzantine.fraction", "0",
                    "share of the population (drawn from the seed) sending corrupted updates", 0, 1),
          string_key("clients.byzantine.kind", "sign_flip",
                     "what they send: sign_flip (-update), scale (scale x update), random (N(0, scale^2) per coordinate)",
                     {"sign_flip", "scale", "random"}),
          float_key("clients.byzantine.scale", "10", "the factor of kind scale; the standard deviation of kind random")};
}

bool aggregation_gathers(const std::string& stages) {
  const auto parsed = parse_stages(stages, "aggregation.stages");
  return std::any_of(parsed.begin(), parsed.end(), [](const StageEntry* e) { return robust(*e); });
}

Aggregation::Aggregation(const Config& config, int64_t population, uint64_t seed) {
  const std::string where = config.origin("aggregation.stages").str();
  std::vector<std::string> made;  // the names of stages_
  for (const StageEntry* e : parse_stages(config.get_string("aggregation.stages"), where)) {
    const std::string prefix = "aggregation." + e->info.name;
    names_.push_back(e->info.name);
    if (e->info.name == kMean) continue;
    if (e->info.role == kServer) {
      for (size_t s = 0; s < stages_.size(); ++s) {
        const std::string why = stages_[s]->unbounded();
        FAX_CHECK(why.empty(), "{}: '{}' needs a bound on what one client contributes, and '{}' gives none: {}", where,
                  e->info.name, made[s], why);
      }
    }
    stages_.push_back(e->make(config, prefix, stages_));
    made.push_back(e->info.name);
    roles_.push_back(e->info.role);
    if (stages_.back()->secure() != nullptr) secure_ = stages_.back()->secure();
    if (config.has("cohort.size"))
      stages_.back()->check_cohort(config.get_int("cohort.size"),
                                   config.has("cohort.sampling") && config.get_string("cohort.sampling") == "poisson",
                                   where);
  }
  const double fraction = config.get_float("clients.byzantine.fraction");
  if (fraction > 0) {
    attack_ = config.get_string("clients.byzantine.kind");
    attack_scale_ = config.get_float("clients.byzantine.scale");
    const auto count = static_cast<int64_t>(std::llround(fraction * static_cast<double>(population)));
    const at::Tensor order =
        at::randperm(population, server_generator(seed, -1, kByzantineStream), at::kLong);
    byzantine_.assign(static_cast<size_t>(population), false);
    const int64_t* picked = order.data_ptr<int64_t>();
    for (int64_t i = 0; i < count; ++i) byzantine_[static_cast<size_t>(picked[i])] = true;
  }
}

bool Aggregation::uniform() const { return std::find(roles_.begin(), roles_.end(), kServer) != roles_.end(); }

bool Aggregation::adds_noise() const {
  return std::any_of(stages_.begin(), stages_.end(), [](const auto& s) { return s->noised(); });
}

bool Aggregation::gathers() const { return std::find(roles_.begin(), roles_.end(), kAggregator) != roles_.end(); }

// What travels is b bits per value, whatever a compressor made of the values before.
int64_t Aggregation::secure_bits(int64_t values) const { return values * secure_->options().bits; }

int64_t Aggregation::upload_bits(const TensorTree& params) const {
  const int64_t values = params.numel();
  if (secure_ != nullptr) return secure_bits(values);
  const int64_t value_bits = params.empty() ? 0 : static_cast<int64_t>(params.begin()->second.element_size()) * 8;
  std::vector<int64_t> sizes;
  for (const auto& [name, t] : params) sizes.push_back(t.numel());
  for (const auto& stage : stages_) {
    if (const auto bits = stage->sent_bits(sizes, value_bits)) return *bits;
  }
  int64_t bits = 0;
  for (const auto& [name, t] : params) bits += t.numel() * static_cast<int64_t>(t.element_size()) * 8;
  return bits;
}

std::string Aggregation::describe() const { return names_.empty() ? "mean" : fmt::format("{}", fmt::join(names_, ", ")); }

std::string Aggregation::error_state(const std::string& param) { return kErrorState + param; }

bool Aggregation::byzantine(int64_t client) const {
  return !byzantine_.empty() && byzantine_.at(static_cast<size_t>(client));
}

bool Aggregation::differentiable() const {
  return std::all_of(stages_.begin(), stages_.end(), [](const auto& s) { return s->differentiable(); });
}

TensorTree Aggregation::client_side(const ClientChunk& chunk, const TensorTree& rows, const at::Tensor& kept,
                                    ClientStates& states, const TensorTree& state, TensorTree& stats) const {
  TensorTree out = rows;
  if (!byzantine_.empty()) {
    at::Tensor flags = at::zeros({chunk.size}, at::kDouble);
    std::vector<TensorTree> sent{narrow(rows, 0, 0)};  // a chunk may have no clients
    for (int64_t i = 0; i < chunk.size; ++i) {
      TensorTree row = narrow(rows, i, 1);
      if (byzantine(chunk.client_id(i))) {
        flags[i] = 1.0;
        if (attack_ == "sign_flip") {
          row = scale(row, -1.0);
        } else if (attack_ == "scale") {
          row = scale(row, attack_scale_);
        } else {
          at::Generator g = client_generator(chunk.program.seed() ^ kAttackStream, chunk.program.round(), chunk.client_id(i));
          row = row.map([&](const at::Tensor& t) {
            return (at::randn(t.sizes(), g, t.options().dtype(at::kDouble)) * attack_scale_).to(t.scalar_type());
          });
        }
      }
      sent.push_back(std::move(row));
    }
    out = cat(sent);
    stats.set("aggregation/byzantine_share", flags);
  }
  const ClientRound round{chunk, kept, states, state, stats};
  for (size_t s = 0; s < stages_.size(); ++s)
    if (roles_[s] == kClient) out = stages_[s]->client(out, round);
  return out;
}

TensorTree Aggregation::send(const ClientChunk& chunk, const TensorTree& weighted, TensorTree& stats) const {
  if (secure_ == nullptr) return weighted;
  at::Tensor clipped = at::zeros({chunk.size}, at::kDouble);
  TensorTree out = secure_->encode(chunk, weighted, clipped, /*reduce=*/false);
  const auto tensors = weighted.tensors();
  if (at::GradMode::is_enabled() && std::any_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) { return t.requires_grad(); })) {
    for (const auto& [name, t] : weighted) out.set(kPlain + name, t);
  }
  stats.set("aggregation/secure_clipped", clipped);
  const int64_t values = chunk.size > 0 ? weighted.numel() / chunk.size : 0;
  stats.set("aggregation/bits_sent", at::full({chunk.size}, static_cast<double>(secure_bits(values)), at::kDouble));
  return out;
}

TensorTree Aggregation::receive(const TensorTree& sums, const TensorTree& like, TensorTree& metrics) const {
  TensorTree summed;
  for (const auto& [name, p] : like) summed.set(name, sums.at(name));
  if (secure_ == nullptr) return summed;
  TensorTree plain;
  for (const auto& [name, p] : like)
    if (sums.contains(kPlain + name)) plain.set(name, sums.at(kPlain + name));
  metrics.set("aggregation/secure_overflows", at::scalar_tensor(static_cast<double>(secure_->overflows(summed)), at::kDouble));
  const TensorTree decoded = secure_->decode(summed, like);
  return plain.empty() ? decoded : with_sum_derivative(decoded, plain);
}

TensorTree Aggregation::aggregate(const TensorTree& rows, int64_t round) const {
  for (size_t s = 0; s < stages_.size(); ++s) {
    if (roles_[s] != kAggregator) continue;
    const at::Tensor statistic = stages_[s]->aggregate(flatten_rows(rows, at::kDouble), round);
    return unflatten_rows(statistic.unsqueeze(0), narrow(rows, 0, 1)).map([](const at::Tensor& t) { return t[0]; });
  }
  throw Error("Aggregation::aggregate: the pipeline has no aggregator");
}

TensorTree Aggregation::server_side(const TensorTree& sum, uint64_t seed, int64_t round, int64_t cohort,
                                    int64_t population, const TensorTree& state, TensorTree& metrics) const {
  TensorTree out = sum;
  bool noised = false;
  for (size_t s = 0; s < stages_.size(); ++s) {
    if (roles_[s] != kServer) continue;
    out = stages_[s]->server(out, seed, round, cohort, population, state, metrics);
    noised = true;
  }
  // Noise on a secure sum is added inside the modulus, as clients adding shares of it to their
  // integers would (distributed DP): on the grid, then wrapped. Post-processing of the noised sum,
  // so a wrap cannot undo the privacy the noise gives.
  if (!noised || secure_ == nullptr) return out;
  const auto leaves = out.tensors();
  const bool graph = std::any_of(leaves.begin(), leaves.end(), [](const at::Tensor& t) { return t.requires_grad(); });
  return graph ? with_sum_derivative(secure_->wrap(out), out) : secure_->wrap(out);
}

TensorTree Aggregation::initial_state() const {
  std::vector<TensorTree> parts;
  for (const auto& stage : stages_) parts.push_back(stage->initial_state());
  return join(parts);
}

bool Aggregation::stateful() const {
  return std::any_of(stages_.begin(), stages_.end(), [](const auto& stage) { return !stage->initial_state().empty(); });
}

void Aggregation::check_state(const TensorTree& state, const std::string& where) const {
  for (const auto& stage : stages_) stage->check_state(state, where);
}

TensorTree Aggregation::next_state(const TensorTree& state, const TensorTree& stat_sums, double kept, uint64_t seed,
                                   int64_t round, int64_t cohort, TensorTree& metrics) const {
  std::vector<TensorTree> parts;
  for (const auto& stage : stages_) parts.push_back(stage->next_state(state, stat_sums, kept, seed, round, cohort, metrics));
  return join(parts);
}

}  // namespace fax
