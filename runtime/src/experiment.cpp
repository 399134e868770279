#include <fax/runtime/experiment.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <thread>

#include <ATen/ATen.h>
#include <torch/version.h>

#include <fax/base/error.h>
#include <fax/base/interrupt.h>
#include <fax/base/rng.h>
#include <fax/base/version.h>
#include <fax/spmd/primitives.h>

namespace fax {
namespace {

constexpr int64_t kEvalBatch = 1024;
// The log is committed (rewritten, fsynced, renamed) with its first row, every checkpoint and the
// last round, and otherwise at most this often: short rounds (asynchronous steps of a few clients)
// would spend their time rewriting it. Rows after the last checkpoint are recomputed by a resume.
constexpr double kCommitInterval_s = 1.0;

// Writes rows appended but not committed when a run leaves by an exception (a failed round), so
// the log shows every round that finished.
struct CommitPending {
  RunLog* log;
  bool pending = false;
  ~CommitPending() {
    if (log == nullptr || !pending) return;
    try {
      log->commit();
    } catch (const std::exception&) {  // the run's own error is the one to report
    }
  }
};

bool due(int64_t every, int64_t completed, int64_t rounds) {
  return completed == rounds || (every > 0 && completed % every == 0);
}

std::string host_name() {
  char buffer[256] = {0};
  return gethostname(buffer, sizeof(buffer) - 1) == 0 ? buffer : "unknown";
}

}  // namespace

Schema experiment_schema() {
  Schema s;
  s.add(int_key("seed", "0", "seed of every random stream (cohorts, client shuffles, data, init)", 0));
  s.add(int_key("rounds", "100", "federated rounds to run", 1));
  s.add(int_key("cohort.size", "10",
                "clients sampled per round (uniform: exactly this many, without replacement; poisson: this many "
                "on average)", 1));
  s.add(string_key("cohort.sampling", "uniform",
                   "uniform: a fixed-size cohort; poisson: each client of the population joins a round independently "
                   "with probability cohort.size / population (what DP accounting assumes), so a round may have "
                   "none", {"uniform", "poisson"}));
  s.add(string_key("data.name", "synthetic", "the federated data set"));
  s.add(string_key("model.name", "softmax_regression", "the model"));
  s.add(string_key("algorithm.name", "fedavg", "the algorithm plugin (fax_<name>.so), or a path to one"));
  s.add(int_key("execution.executors", "0",
                "executor threads; 0: as many as the machine's cores allow, at most logical_shards", 0));
  s.add(int_key("execution.logical_shards", "4",
                "logical shards of the cohort (at most cohort.size); results depend on this, never on executors", 1));
  s.add(int_key("execution.threads", "1",
                "LibTorch intra-op threads per executor (part of the reproducibility key); 0: hardware threads / "
                "logical_shards (at least 1), resolved when the experiment is loaded and recorded",
                0, 1 << 20));
  s.add(int_key("execution.vectorize", "0", "clients per batched map_clients chunk; 0: a whole logical shard", 0));
  s.add(string_key("execution.nonfinite", "stop",
                   "a client update with NaN or Inf: stop the run naming round and client, or drop the client",
                   {"stop", "drop"}));
  s.add(bool_key("execution.factor_input_layer", "true",
                 "local SGD steps the first dense layer of mlp, softmax_regression and cnn in factored form: large "
                 "shared matrix products instead of small per-client ones and no per-client weight updates (same "
                 "maths, other rounding); false: plain autograd steps"));
  s.add(bool_key("execution.flush_denormals", "true",
                 "client work (executors, remote workers, the coordinator's sums) flushes subnormal numbers to "
                 "zero (FTZ/DAZ, as TensorFlow does): a saturated model's gradients are full of them, which some "
                 "x86 cores run several times slower; false: IEEE gradual underflow (may round otherwise where a "
                 "result is subnormal)"));
  for (ConfigKey& key : aggregation_schema()) s.add(std::move(key));
  for (ConfigKey& key : clock_schema()) s.add(std::move(key));
  s.add(int_key("logging.eval_every", "10", "evaluate on the test split every K rounds (and after the last); 0: last only", 0));
  s.add(int_key("logging.progress_every", "10", "when stdout is not a terminal, print a progress line every K rounds", 1));
  s.add(bool_key("logging.per_client", "false", "log per-client metrics (round x cohort) under /clients"));
  s.add(int_key("logging.checkpoint_every", "10",
                "checkpoint the whole state every K rounds and after the last (fax-run resume starts there); 0: last only", 0));
  s.add(int_key("logging.keep_checkpoints", "3",
                "keep the newest K checkpoints; older files are removed once the log no longer links them; 0: keep all",
                0));
  return s;
}

int automatic_threads(int64_t logical_shards) {
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(std::max<int64_t>(1, cores / std::max<int64_t>(1, logical_shards)));
}

MeshOptions mesh_options(const Config& config) {
  MeshOptions o;
  o.vectorize = config.get_int("execution.vectorize");
  o.flush_denormals = config.get_bool("execution.flush_denormals");
  o.logical_shards = config.get_int("execution.logical_shards");
  o.threads_per_executor = static_cast<int>(config.get_int("execution.threads"));
  if (o.threads_per_executor == 0) o.threads_per_executor = automatic_threads(o.logical_shards);
  o.executors = static_cast<int>(config.get_int("execution.executors"));
  if (o.executors == 0) {
    const int cores = std::max(1u, std::thread::hardware_concurrency());
    o.executors = static_cast<int>(std::min<int64_t>(std::max(1, cores / o.threads_per_executor), o.logical_shards));
  }
  // Poisson cohorts of any size leave shards empty at times, which the engine allows.
  FAX_CHECK(sampling(config) == Sampling::poisson || o.logical_shards <= config.get_int("cohort.size"),
            "{}: execution.logical_shards ({}) exceeds cohort.size ({}): every logical shard needs a client",
            config.origin("execution.logical_shards").str(), o.logical_shards, config.get_int("cohort.size"));
  FAX_CHECK(o.executors <= o.logical_shards,
            "{}: execution.executors ({}) exceeds execution.logical_shards ({}): every executor needs a logical shard",
            config.origin("execution.executors").str(), o.executors, o.logical_shards);
  return o;
}

void check_asynchronous(const Config& config, const Algorithm& algorithm) {
  const int64_t concurrency = config.get_int("cohort.concurrency");
  const std::string algorithm_origin = config.origin("algorithm.name").str();
  if (algorithm.asynchronous()) {
    FAX_CHECK(config.get_string("clients.speed.distribution") != "none",
              "{}: algorithm {} trains asynchronously, on the simulated clock: set clients.speed.distribution and "
              "cohort.concurrency", algorithm_origin, config.get_string("algorithm.name"));
    FAX_CHECK(concurrency > 0, "{}: algorithm {} trains asynchronously: set cohort.concurrency, the clients training "
              "at once", algorithm_origin, config.get_string("algorithm.name"));
    FAX_CHECK(sampling(config) == Sampling::uniform,
              "{}: cohort.sampling poisson draws whole rounds; asynchronous training dispatches clients one at a time "
              "(use uniform)", config.origin("cohort.sampling").str());
  } else {
    FAX_CHECK(concurrency == 0, "{}: cohort.concurrency is for asynchronous algorithms (fedbuff, fedasync); {} runs "
              "synchronous rounds", config.origin("cohort.concurrency").str(), config.get_string("algorithm.name"));
  }
}

Sampling sampling(const Config& config) {
  return config.get_string("cohort.sampling") == "poisson" ? Sampling::poisson : Sampling::uniform;
}

std::vector<int64_t> draw_clients(int64_t population, int64_t size, uint64_t seed, int64_t round, Sampling sampling) {
  at::Tensor picked;
  if (sampling == Sampling::poisson) {
    const double q = static_cast<double>(size) / static_cast<double>(population);
    picked = (at::rand({population}, server_generator(seed, round), at::kDouble) < q).nonzero().view({-1});
  } else {
    picked = at::randperm(population, server_generator(seed, round), at::kLong);
  }
  return {picked.data_ptr<int64_t>(), picked.data_ptr<int64_t>() + picked.numel()};
}

Cohort weighted_cohort(const FederatedDataset& data, std::vector<int64_t> ids) {
  std::vector<double> weights;
  weights.reserve(ids.size());
  for (int64_t id : ids) weights.push_back(static_cast<double>(data.num_examples(id)));
  return Cohort(std::move(ids), std::move(weights));
}

Cohort sample_cohort(const FederatedDataset& data, int64_t size, uint64_t seed, int64_t round, Sampling sampling) {
  const int64_t population = data.num_clients();
  FAX_CHECK(size <= population, "cohort.size ({}) is larger than the population of {} ({} clients)", size,
            data.describe(), population);
  std::vector<int64_t> ids = draw_clients(population, size, seed, round, sampling);
  if (sampling == Sampling::uniform) ids.resize(static_cast<size_t>(size));
  return weighted_cohort(data, std::move(ids));
}

Experiment::Experiment(const Config& config, Algorithm& algorithm, const Model& model, const FederatedDataset& data,
                       Coordinator* remote)
    : config_(config),
      algorithm_(algorithm),
      model_(model),
      data_(data),
      remote_(remote),
      mesh_options_(fax::mesh_options(config)),
      aggregation_(config, data.num_clients(), static_cast<uint64_t>(config.get_int("seed"))),
      sampling_(sampling(config)),
      asynchronous_(algorithm.asynchronous()) {
  // execution.vectorize 0 leaves the chunk to the model: a whole logical shard for batched models.
  if (mesh_options_.vectorize == 0) mesh_options_.vectorize = model.preferred_chunk();
  // Checked before any round (and before a run log is written).
  FAX_CHECK(config.get_int("cohort.size") <= data.num_clients(),
            "{}: cohort.size ({}) is larger than the population of {}", config.origin("cohort.size").str(),
            config.get_int("cohort.size"), data.describe());
  check_asynchronous(config, algorithm);
  FAX_CHECK(!asynchronous_ || config.get_int("cohort.concurrency") <= data.num_clients(),
            "{}: cohort.concurrency ({}) is larger than the population of {}", config.origin("cohort.concurrency").str(),
            config.get_int("cohort.concurrency"), data.describe());
  if (remote_ != nullptr) {
    mesh_options_.executors = static_cast<int>(std::clamp<int64_t>(remote_->ready_workers(), 1, mesh_options_.logical_shards));
  }
}

StringPairs Experiment::environment() const {
  const MeshOptions& o = mesh_options_;
  StringPairs env{{"fax_version", FAX_VERSION},
          {"torch_version", TORCH_VERSION},
          {"host", host_name()},
          {"seed", std::to_string(config_.get_int("seed"))},
          {"executors", std::to_string(o.executors)},
          {"logical_shards", std::to_string(o.logical_shards)},
          {"threads_per_executor", std::to_string(o.threads_per_executor)},
          {"vectorize", std::to_string(o.vectorize)},
          {"hardware_threads", std::to_string(std::thread::hardware_concurrency())},
          {"data", data_.describe()},
          {"model", model_.describe()},
          {"cohort_sampling",
           sampling_ == Sampling::poisson
               ? "poisson: each client joins a round with probability cohort.size / population, as the privacy "
                 "ledger assumes"
               : "uniform: cohort.size clients without replacement; a privacy ledger accounts this as Poisson "
                 "sampling at rate cohort.size / population, an approximation, not a bound"}};
  if (remote_ != nullptr) env.emplace_back("remote", fmt::format("coordinator at {}", remote_->address()));
  if (clock() != nullptr) env.emplace_back("clock", clock()->describe());
  return env;
}

Metrics Experiment::evaluate(const TensorTree& params) {
  const Examples& test = data_.test();
  FAX_CHECK(test.size() > 0, "{} has no test examples to evaluate on", data_.describe());
  // The test split is cut into one pseudo-client per logical shard, so evaluation is spread over
  // the executors and, like training, independent of their number (a split smaller than the
  // shards leaves some parts empty).
  const int64_t parts = mesh_options_.logical_shards;
  const at::Tensor totals =
      run_task(TaskKind::evaluate, {}, Cohort::range(parts), parts, params).at("totals");
  const double n = totals[2].item<double>();
  return {{"eval/loss", totals[0].item<double>() / n}, {"eval/accuracy", totals[1].item<double>() / n}};
}

Server<TensorTree> Experiment::program(Program& p, TaskKind kind, const TensorTree& input) {
  if (kind == TaskKind::evaluate) {
    const Examples& test = data_.test();
    const int64_t parts = p.cohort_size();
    const auto sums = map_clients(MapOptions{1}, [&](const ClientChunk& c) {
      at::NoGradGuard no_grad;
      const int64_t part = c.client_id(0);
      const int64_t begin = test.size() * part / parts;
      const int64_t end = test.size() * (part + 1) / parts;
      at::Tensor acc = at::zeros({3}, at::kDouble);
      for (int64_t b = begin; b < end; b += kEvalBatch) {
        check_interrupt();
        const int64_t n = std::min(kEvalBatch, end - b);
        const at::Tensor logits = model_.forward_eval(input, test.x.narrow(0, b, n));
        const at::Tensor y = test.y.narrow(0, b, n);
        acc[0] += per_example(model_.loss(logits, y), 1).sum().to(at::kDouble);
        acc[1] += per_example(correct(logits, y), 1).sum().to(at::kDouble);
        acc[2] += static_cast<double>(n);
      }
      return acc.unsqueeze(0);
    });
    return Server<TensorTree>(TensorTree{{"totals", sum(sums).value()}});
  }
  // Each executor works on its own copy: the algorithm's updates never touch shared tensors.
  ServerState state{clone(unprefixed(input, "params/")), clone(unprefixed(input, "extra/"))};
  const NonFinite nonfinite = config_.get_string("execution.nonfinite") == "drop" ? NonFinite::drop : NonFinite::stop;
  RoundContext ctx{p, model_, data_, p.round(), client_states_, nonfinite,
                   config_.get_bool("execution.factor_input_layer"), &aggregation_};
  ctx.drawn_cohort = config_.get_int("cohort.size");
  AsyncRound async;
  if (asynchronous_) {
    async = {unprefixed(input, "async/versions/"), input.at("async/version"), input.at("async/staleness")};
    ctx.async = &async;
  }
  RoundMetrics metrics = aggregated_round(algorithm_, state, ctx);
  FAX_CHECK(aggregation_.plain() || ctx.aggregated,
            "{}: algorithm {} combines its clients' updates itself, not through mean_client_update, so the "
            "aggregation stages ({}) and clients.byzantine would do nothing; they apply to fedavg, fedopt, fedprox "
            "and hypergrad_fedavg", config_.origin("algorithm.name").str(), config_.get_string("algorithm.name"),
            aggregation_.describe());
  // Everything the coordinator needs travels as one server value.
  TensorTree out = join({prefixed(state.params, "params/"), prefixed(state.extra, "extra/"),
                         prefixed(metrics.server, "metrics/")});
  if (config_.get_bool("logging.per_client")) {
    for (const auto& [name, values] : metrics.clients) out.set("clients/" + name, collect(values).value());
  }
  return Server<TensorTree>(std::move(out));
}

namespace {
constexpr const char* kClientStates = "client_states/";
}  // namespace

TensorTree Experiment::run_task(TaskKind kind, RoundInfo info, const Cohort& cohort, int64_t logical_shards,
                                const TensorTree& input) {
  const auto start = std::chrono::steady_clock::now();
  struct Timed {
    double& total;
    std::chrono::steady_clock::time_point start;
    ~Timed() { total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
  } timed{task_seconds_, start};
  if (remote_ == nullptr) {
    if (!mesh_) mesh_ = std::make_unique<Mesh>(mesh_options_);
    return mesh_->run(cohort, [&](Program& p) { return program(p, kind, input); }, info).value();
  }
  // Client states live here; each worker gets its clients' states and returns them updated.
  const auto replies = remote_->run(kind, info, cohort, logical_shards, [&](int e, const ShardLayout& layout) {
    const Range mine = layout.executor_clients(e);
    const std::vector<int64_t> ids(cohort.ids().begin() + mine.begin, cohort.ids().begin() + mine.end);
    return join({input, prefixed(client_states_.subset(ids), kClientStates)});
  });
  for (const auto& reply : replies) client_states_.merge(unprefixed(reply, kClientStates));
  return without_prefix(replies.front(), kClientStates);
}

ServerState Experiment::init() {
  return with_aggregation_state(
      algorithm_.init(config_, model_, model_.init(server_generator(static_cast<uint64_t>(config_.get_int("seed")), -1))),
      aggregation_);
}

TensorTree Experiment::serve(Program& p, TaskKind kind, const TensorTree& input) {
  client_states_.restore(unprefixed(input, kClientStates));
  const TensorTree out = detach(program(p, kind, without_prefix(input, kClientStates)).value());
  // Every executor holds the same server value; one copy is enough.
  return join({p.executor() == 0 ? out : TensorTree{}, prefixed(client_states_.stacked(), kClientStates)});
}

namespace {
constexpr const char* kNowUs = "now_us";
// A resumed simulated time leaves room for the rounds to come (2^62 us: 146,000 years).
constexpr SimTime kMaxResumedTime = SimTime{1} << 62;
}  // namespace

TensorTree checkpoint_tree(const ServerState& state, const ClientStates& clients, std::optional<SimTime> now,
                           const TensorTree& async) {
  TensorTree clock;
  if (now) clock.set(kNowUs, at::scalar_tensor(*now, at::kLong));
  return join({prefixed(state.params, "params/"), prefixed(state.extra, "extra/"),
               prefixed(clients.stacked(), "client_states/"), prefixed(clock, "clock/"), prefixed(async, "async/")});
}

ResumePoint resume_point(int64_t round, const TensorTree& checkpoint) {
  return {round, {unprefixed(checkpoint, "params/"), unprefixed(checkpoint, "extra/")},
          unprefixed(checkpoint, "client_states/"), unprefixed(checkpoint, "clock/"), unprefixed(checkpoint, "async/")};
}

namespace {
// Asynchronous training keeps the model versions that clients in flight started from (a step
// trains its clients lazily, from theirs), keyed by version.
using Versions = std::map<int64_t, TensorTree>;

std::string version_prefix(int64_t version) { return fmt::format("v{}/", version); }

// The versions older than `current` (the server's own parameters), as a checkpoint keeps them.
TensorTree versions_tree(const Versions& versions, int64_t current) {
  std::vector<TensorTree> parts;
  for (const auto& [v, params] : versions)
    if (v != current) parts.push_back(prefixed(params, version_prefix(v)));
  return join(parts);
}

// The version numbers of a checkpoint's async/ tree (keys v<N>/<param>), refusing other keys.
std::vector<int64_t> versions_in(const TensorTree& async, const std::string& where) {
  std::vector<int64_t> versions;
  for (const auto& [name, t] : async) {
    const size_t slash = name.find('/');
    int64_t v = -1;
    const bool ok = name.size() > 1 && name[0] == 'v' && slash != std::string::npos && slash > 1 && slash < 20 &&
                    name.find_first_not_of("0123456789", 1) == slash && (v = std::stoll(name.substr(1, slash - 1)), true);
    FAX_CHECK(ok, "{}: the state has async/{}, which this experiment does not keep", where, name);
    if (versions.empty() || versions.back() != v) versions.push_back(v);
  }
  std::sort(versions.begin(), versions.end());
  versions.erase(std::unique(versions.begin(), versions.end()), versions.end());
  return versions;
}

// An asynchronous step's task input: the distinct versions its clients started from, and each
// client's among them and its staleness.
TensorTree async_input(const AsyncStep& step, const Versions& versions) {
  std::vector<int64_t> used;
  for (const AsyncUpdate& u : step.updates) used.push_back(u.start_version);
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  // Not stacked here: the step's clients take their rows from these (no copy on the coordinator).
  std::vector<TensorTree> parts;
  for (size_t j = 0; j < used.size(); ++j) parts.push_back(prefixed(versions.at(used[j]), fmt::format("{}/", j)));
  std::vector<int64_t> row, staleness;
  for (const AsyncUpdate& u : step.updates) {
    row.push_back(std::lower_bound(used.begin(), used.end(), u.start_version) - used.begin());
    staleness.push_back(u.staleness);
  }
  TensorTree input = prefixed(join(parts), "versions/");
  input.set("version", at::tensor(row, at::kLong));
  input.set("staleness", at::tensor(staleness, at::kLong));
  return input;
}
}  // namespace

const SimulatedClock* Experiment::clock() const {
  if (!clock_) clock_ = SimulatedClock::from_config(config_);
  return clock_->get();
}

std::unique_ptr<AsyncSchedule> Experiment::async_schedule(int64_t steps, int64_t down_bits, int64_t up_bits) const {
  const SimulatedClock* c = clock();
  const AsyncSchedule::Options o{c->options().concurrency, config_.get_int("cohort.size"), c->options().max_staleness};
  auto schedule = std::make_unique<AsyncSchedule>(
      *c, o, data_.num_clients(), static_cast<uint64_t>(config_.get_int("seed")),
      [this, c, down_bits, up_bits](int64_t client, int64_t dispatch) {
        return c->duration(client, dispatch, algorithm_.local_examples(data_.num_examples(client)), down_bits, up_bits);
      });
  for (int64_t i = 0; i < steps; ++i) schedule->next();
  return schedule;
}

SyncRound Experiment::clock_round(int64_t round, SimTime start, int64_t down_bits, int64_t up_bits) const {
  const SimulatedClock& c = *clock();
  const int64_t size = config_.get_int("cohort.size");
  const std::vector<int64_t> candidates =
      draw_clients(data_.num_clients(), size, static_cast<uint64_t>(config_.get_int("seed")), round, sampling_);
  int64_t dispatch = static_cast<int64_t>(candidates.size()), keep = dispatch;
  if (sampling_ == Sampling::uniform) {
    keep = size;
    // ceil(size x over_selection), robust to the rounding of the product (10 x 0.3).
    const auto extra = static_cast<int64_t>(std::ceil(static_cast<double>(size) * c.options().over_selection - 1e-9));
    dispatch = std::min(dispatch, size + extra);
  }
  return c.sync_round(candidates, dispatch, keep, start, [&](int64_t client) {
    return c.duration(client, round, algorithm_.local_examples(data_.num_examples(client)), down_bits, up_bits);
  });
}

namespace {
// A checkpoint's tree must have the leaves, shapes and dtypes of the state the experiment starts
// from: anything else is another run's, or edited (it would fail later inside a plugin's round).
// With `finite`, values too (parameters are; an algorithm's extra state may hold infinities).
void check_like(const TensorTree& got, const TensorTree& expected, const std::string& prefix, const std::string& where,
                bool finite = false) {
  for (const auto& [name, t] : got)
    FAX_CHECK(expected.contains(name), "{}: the state has {}{}, which this experiment does not keep", where, prefix, name);
  for (const auto& [name, t] : expected) {
    FAX_CHECK(got.contains(name), "{}: the state lacks {}{}, which this experiment keeps", where, prefix, name);
    const at::Tensor& value = got.at(name);
    FAX_CHECK(value.sizes() == t.sizes() && value.scalar_type() == t.scalar_type(),
              "{}: {}{} is a {} tensor of shape [{}]; this experiment keeps a {} of shape [{}]", where, prefix, name,
              c10::toString(value.scalar_type()), fmt::join(value.sizes(), ", "), c10::toString(t.scalar_type()),
              fmt::join(t.sizes(), ", "));
    FAX_CHECK(!finite || !value.is_floating_point() || at::isfinite(value).all().item<bool>(),
              "{}: {}{} holds NaN or infinite values", where, prefix, name);
  }
}

// Client states (ClientStates::stacked()): one row per id, ids distinct and of this population's
// clients, and a parameter's state (SCAFFOLD's under its name, error feedback's under
// aggregation/error/) shaped and typed like it.
void check_client_states(const TensorTree& states, const TensorTree& params, int64_t population,
                         const std::string& where) {
  if (states.empty()) return;
  FAX_CHECK(states.contains("id") && states.at("id").dim() == 1 && states.at("id").scalar_type() == at::kLong,
            "{}: client_states/id is missing or not an int64 vector", where);
  const at::Tensor ids = states.at("id");
  const int64_t n = ids.numel();
  if (n > 0) {
    FAX_CHECK(ids.min().item<int64_t>() >= 0 && ids.max().item<int64_t>() < population,
              "{}: client_states/id holds ids outside the population's 0..{}", where, population - 1);
    FAX_CHECK(std::get<0>(at::_unique(ids)).numel() == n, "{}: client_states/id names a client twice", where);
  }
  for (const auto& [name, t] : states) {
    if (name == "id") continue;
    FAX_CHECK(t.dim() >= 1 && t.size(0) == n, "{}: client_states/{} does not have one row per client id ({})", where,
              name, n);
    for (const auto& [param, p] : params) {
      if (name != param && name != Aggregation::error_state(param)) continue;
      FAX_CHECK(t.sizes().slice(1) == p.sizes() && t.scalar_type() == p.scalar_type(),
                "{}: client_states/{} has {} rows of shape [{}]; parameter {} is a {} of shape [{}]", where, name,
                c10::toString(t.scalar_type()), fmt::join(t.sizes().slice(1), ", "), param,
                c10::toString(p.scalar_type()), fmt::join(p.sizes(), ", "));
    }
  }
}
}  // namespace

void Experiment::check_resume(const ResumePoint& resume, const std::string& where) {
  check_resume(resume, init(), where);
}

void Experiment::check_resume(const ResumePoint& resume, const ServerState& fresh, const std::string& where) const {
  if (clock() != nullptr) {
    TensorTree expected;
    expected.set(kNowUs, at::scalar_tensor(0, at::kLong));
    check_like(resume.clock, expected, "clock/", where);
    const int64_t now = resume.clock.at(kNowUs).item<int64_t>();
    FAX_CHECK(now >= 0 && now <= kMaxResumedTime, "{}: clock/now_us ({}) is not in [0, {}]", where, now, kMaxResumedTime);
  } else {
    FAX_CHECK(resume.clock.empty(), "{}: the checkpoint holds a simulated time (clock/) but this experiment has no "
              "simulated clock (clients.speed.distribution none)", where);
  }
  check_like(resume.state.params, fresh.params, "params/", where, /*finite=*/true);
  check_like(resume.state.extra, fresh.extra, "extra/", where);
  if (asynchronous_) {
    // The timeline is replayed, never stored: the checkpoint's time and versions must be its.
    const std::vector<int64_t> kept = versions_in(resume.async, where);
    const auto schedule = async_schedule(resume.round, Aggregation().upload_bits(fresh.params),
                                         aggregation_.upload_bits(fresh.params));
    const int64_t now = resume.clock.at(kNowUs).item<int64_t>();
    FAX_CHECK(now == schedule->now(), "{}: clock/now_us ({}) is not the simulated time after {} server steps ({}): "
              "the checkpoint is not this experiment's", where, now, resume.round, schedule->now());
    const std::vector<int64_t> live = schedule->live_versions();
    FAX_CHECK(kept == live, "{}: the checkpoint keeps model versions [{}]; the clients in flight after server step {} "
              "started from [{}]", where, fmt::join(kept, ", "), resume.round, fmt::join(live, ", "));
    for (int64_t v : kept)
      check_like(unprefixed(resume.async, version_prefix(v)), fresh.params, "async/" + version_prefix(v), where, true);
  } else {
    FAX_CHECK(resume.async.empty(), "{}: the checkpoint holds model versions (async/) of asynchronous training, but "
              "algorithm {} is synchronous", where, config_.get_string("algorithm.name"));
  }
  check_server_state(algorithm_, resume.state, aggregation_, where);
  check_client_states(resume.client_states, fresh.params, data_.num_clients(), where);
}

RunResult Experiment::run(RunLog* log, const ProgressFn& progress, const ResumePoint* resume,
                          const std::function<bool()>& stop) {
  const uint64_t seed = static_cast<uint64_t>(config_.get_int("seed"));
  const int64_t rounds = config_.get_int("rounds");
  const int64_t cohort_size = config_.get_int("cohort.size");
  const int64_t eval_every = config_.get_int("logging.eval_every");
  const int64_t checkpoint_every = config_.get_int("logging.checkpoint_every");
  const int64_t keep_checkpoints = config_.get_int("logging.keep_checkpoints");
  const bool per_client = config_.get_bool("logging.per_client");

  RunResult result;
  // init reads the algorithm's settings even when the state then comes from a checkpoint.
  result.state = init();
  const int64_t first = resume != nullptr ? resume->round : 0;
  if (resume != nullptr) {
    check_resume(*resume, result.state, fmt::format("the checkpoint of round {}", resume->round));
    result.state = resume->state;
    client_states_.restore(resume->client_states);
  }
  const SimulatedClock* const clock = this->clock();
  SimTime now = clock != nullptr && resume != nullptr ? resume->clock.at(kNowUs).item<int64_t>() : 0;
  // What a client downloads (the parameters at their width: what the plain mean's upload is) and
  // uploads, for its simulated duration.
  const int64_t down_bits = Aggregation().upload_bits(result.state.params);
  const int64_t up_bits = aggregation_.upload_bits(result.state.params);
  // Asynchronous training: the timeline, and the versions its clients in flight started from.
  std::unique_ptr<AsyncSchedule> schedule;
  Versions versions;
  if (asynchronous_) {
    schedule = async_schedule(first, down_bits, up_bits);
    for (int64_t v : schedule->live_versions())
      versions[v] = resume != nullptr ? unprefixed(resume->async, version_prefix(v)) : result.state.params;
    versions[first] = result.state.params;
  }
  result.rounds_done = first;
  const auto start = std::chrono::steady_clock::now();
  int64_t checkpointed = first;
  int64_t clients_trained = 0;  // drawn clients (Poisson sampling draws any number) since `start`
  CommitPending commits{log};
  const double tasks_before = task_seconds_;
  auto committed_at = std::chrono::steady_clock::now();
  std::optional<SimTime> clock_now = clock != nullptr ? std::optional<SimTime>(now) : std::nullopt;  // checkpointed
  for (int64_t r = first; r < rounds; ++r) {
    const auto round_start = std::chrono::steady_clock::now();
    // A round interrupted mid-way (SIGTERM) is abandoned: the run keeps the state before it.
    const ServerState before = result.state;
    const ClientStates::Saved states_before = client_states_.save();
    Metrics metrics;
    SyncRound timed;
    TensorTree async;  // the step's task input
    std::vector<double> staleness;
    std::vector<int64_t> live;  // the older versions clients in flight started from, after the step
    if (schedule) {
      const AsyncStep step = schedule->next();
      live = schedule->live_versions();
      timed.length = step.time - now;
      for (const AsyncUpdate& u : step.updates) {
        timed.clients.push_back(u.client);
        timed.durations.push_back(u.finish - u.start);
        staleness.push_back(static_cast<double>(u.staleness));
      }
      async = prefixed(async_input(step, versions), "async/");
      metrics.emplace_back("async/staleness_mean",
                           std::accumulate(staleness.begin(), staleness.end(), 0.0) / static_cast<double>(staleness.size()));
      metrics.emplace_back("async/staleness_max", *std::max_element(staleness.begin(), staleness.end()));
      metrics.emplace_back("async/concurrency", step.concurrency);
      metrics.emplace_back("async/stale_dropped", static_cast<double>(step.stale_dropped));
      metrics.emplace_back("async/dispatched", static_cast<double>(schedule->dispatches()));
      metrics.emplace_back("async/versions_kept", static_cast<double>(live.size() + 1));
      metrics.emplace_back("clock/lost", static_cast<double>(step.lost));
    } else if (clock != nullptr) {
      timed = clock_round(r, now, down_bits, up_bits);
      FAX_CHECK(now <= kForever - timed.length, "round {}: the simulated time passes 292,000 years", r + 1);
      metrics.emplace_back("clock/selected", static_cast<double>(timed.selected));
      metrics.emplace_back("clock/late", static_cast<double>(timed.late));
      metrics.emplace_back("clock/lost", static_cast<double>(timed.lost));
      metrics.emplace_back("clock/unused", static_cast<double>(timed.unused));
    }
    const Cohort cohort =
        clock != nullptr ? weighted_cohort(data_, timed.clients) : sample_cohort(data_, cohort_size, seed, r, sampling_);
    TensorTree packed;
    if (sampling_ == Sampling::poisson) metrics.emplace_back("cohort/size", static_cast<double>(cohort.size()));
    try {
      // Nobody drawn: nothing to combine, and the state stays, unless the round releases noise
      // (skipping it would tell that nobody took part).
      if (cohort.size() > 0 || aggregation_.adds_noise() || algorithm_.adds_noise()) {
        packed = run_task(TaskKind::round, {seed, r}, cohort, mesh_options_.logical_shards,
                          join({prefixed(result.state.params, "params/"), prefixed(result.state.extra, "extra/"), async}));
        result.state = {unprefixed(packed, "params/"), unprefixed(packed, "extra/")};
      }
      for (const auto& [name, t] : unprefixed(packed, "metrics/")) {
        FAX_CHECK(t.numel() == 1, "round {}: metric '{}' has {} values; a server metric is one number", r + 1, name,
                  t.numel());
        metrics.emplace_back(name, t.item<double>());
      }
      metrics.emplace_back("time/round_s",
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - round_start).count());
      if (clock != nullptr) {
        metrics.emplace_back("time/round_simulated_s", to_seconds(timed.length));
        metrics.emplace_back("time/simulated_s", to_seconds(now + timed.length));
      }
      if (due(eval_every, r + 1, rounds)) {
        for (auto& m : evaluate(algorithm_.eval_params(result.state))) metrics.push_back(m);
      }
    } catch (const Interrupted&) {
      result.state = before;
      client_states_.roll_back(states_before);
      if (log != nullptr && r > checkpointed) {
        log->checkpoint(r, checkpoint_tree(result.state, client_states_, clock_now, versions_tree(versions, r)),
                        keep_checkpoints);
      }
      if (log != nullptr && r > checkpointed) {
        log->commit();
        commits.pending = false;
      }
      result.stopped = true;
      break;
    }
    const int64_t completed = r + 1;
    result.rounds_done = completed;
    now += timed.length;
    clock_now = clock != nullptr ? std::optional<SimTime>(now) : std::nullopt;
    if (schedule) {
      // The new version, and only the versions clients in flight still train from.
      versions[completed] = result.state.params;
      for (auto it = versions.begin(); it != versions.end();)
        it = it->first == completed || std::binary_search(live.begin(), live.end(), it->first) ? std::next(it)
                                                                                              : versions.erase(it);
    }
    clients_trained += cohort.size();
    const bool stopping = stop && stop() && completed < rounds;
    if (log != nullptr) {
      if (per_client) {
        std::vector<std::pair<std::string, at::Tensor>> values;
        for (const auto& [name, t] : unprefixed(packed, "clients/")) values.emplace_back(name, t);
        if (clock != nullptr) {
          std::vector<double> seconds;
          for (SimTime d : timed.durations) seconds.push_back(to_seconds(d));
          values.emplace_back("simulated_s", at::tensor(seconds, at::kDouble));
        }
        if (schedule) values.emplace_back("staleness", at::tensor(staleness, at::kDouble));
        log->append_clients(at::tensor(cohort.ids(), at::kLong), values);
      }
      // The checkpoint file is written first and linked by the append that commits the round: a
      // crash in between leaves a file no log links to, which a resume discards.
      const bool checkpoint = stopping || due(checkpoint_every, completed, rounds);
      if (checkpoint) {
        log->checkpoint(completed,
                        checkpoint_tree(result.state, client_states_, clock_now, versions_tree(versions, completed)),
                        keep_checkpoints);
        checkpointed = completed;
      }
      const auto now_wall = std::chrono::steady_clock::now();
      const bool commit = checkpoint || completed == first + 1 || completed == rounds ||
                          std::chrono::duration<double>(now_wall - committed_at).count() >= kCommitInterval_s;
      log->append(completed, metrics, commit);
      commits.pending = !commit;
      if (commit) committed_at = now_wall;
    }
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    result.last = metrics;
    result.seconds = elapsed;
    result.task_seconds = task_seconds_ - tasks_before;
    if (progress) {
      const int64_t done_here = completed - first;
      progress({completed, rounds, elapsed, elapsed / done_here * (rounds - completed),
                static_cast<double>(clients_trained) / std::max(elapsed, 1e-9), metrics});
    }
    if (stopping) {
      result.stopped = true;
      break;
    }
  }
  return result;
}

}  // namespace fax
