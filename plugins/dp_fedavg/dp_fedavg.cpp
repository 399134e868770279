// DP-FedAvg (McMahan et al. 2018) with optional adaptive clipping (Andrew et al. 2021): each
// client's update is clipped to L2 norm C, the clipped updates are summed, Gaussian noise of
// standard deviation z C is added to the sum on the server, and the result is divided by the
// cohort size. Adaptive clipping moves C toward the target quantile of update norms:
//   C <- C exp(-clip_lr (b - target_quantile)),  b = (#{norm <= C} + N(0, count_noise^2)) / n.
// The privacy spent is tracked with the Rényi accountant of the sampled Gaussian mechanism
// (sampling rate cohort / population, noise multiplier z, or with adaptive clipping the combined
// (z^-2 + (2 count_noise)^-2)^-1/2 of Andrew et al.) and logged as epsilon at `delta` every round.

#include <cmath>
#include <limits>

#include <ATen/ATen.h>

#include <fax/fax.h>

namespace {

// The server's noise comes from a sub-stream of its own, apart from the cohort draw.
constexpr uint64_t kNoiseStream = 0x6e6f697365;  // "noise"

class DpFedAvg final : public fax::Algorithm {
 public:
  static constexpr const char* name = "dp_fedavg";
  static constexpr const char* description =
      "DP-FedAvg: clipped client updates, Gaussian noise on their sum, Rényi accounting (adaptive clipping optional)";

  static std::vector<fax::ConfigKey> keys() {
    auto keys = fax::client_training_keys();
    keys.push_back(fax::positive_float_key("server_lr", "1.0", "server learning rate on the noised mean update"));
    keys.push_back(fax::positive_float_key("clip_norm", "1.0", "L2 norm each client update is clipped to (initial C)"));
    keys.push_back(fax::float_key("noise_multiplier", "1.0", "z: noise std on the sum is z * C; 0: no noise", 0));
    keys.push_back(fax::bool_key("adaptive_clipping", "false", "move C toward a quantile of the update norms"));
    keys.push_back(fax::float_key("target_quantile", "0.5", "adaptive clipping: share of updates left unclipped", 0, 1));
    keys.push_back(fax::positive_float_key("clip_lr", "0.2", "adaptive clipping: geometric step on C"));
    keys.push_back(fax::float_key("count_noise", "0.0", "adaptive clipping: noise std on the unclipped count", 0));
    keys.push_back(fax::float_key("delta", "1e-5", "delta of the reported (epsilon, delta)", 0, 1, true));
    return keys;
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    training_ = fax::client_training(config);
    server_lr_ = config.get_float("algorithm.server_lr");
    noise_ = config.get_float("algorithm.noise_multiplier");
    adaptive_ = config.get_bool("algorithm.adaptive_clipping");
    target_ = config.get_float("algorithm.target_quantile");
    clip_lr_ = config.get_float("algorithm.clip_lr");
    count_noise_ = config.get_float("algorithm.count_noise");
    delta_ = config.get_float("algorithm.delta");
    FAX_CHECK(!adaptive_ || noise_ == 0 || count_noise_ > 0,
              "{}: adaptive clipping with noise needs algorithm.count_noise > 0: the unclipped count is released too",
              config.origin("algorithm.count_noise").str());
    // With adaptive clipping both queries share the privacy budget (Andrew et al. 2021, section 3).
    effective_noise_ = adaptive_ && noise_ > 0
                           ? 1.0 / std::sqrt(1.0 / (noise_ * noise_) + 1.0 / (4 * count_noise_ * count_noise_))
                           : noise_;
    fax::TensorTree extra{{"clip_norm", at::scalar_tensor(config.get_float("algorithm.clip_norm"), at::kDouble)}};
    return {std::move(params), std::move(extra)};
  }

  fax::RoundMetrics round(fax::ServerState& state, fax::RoundContext& ctx) const override {
    const double clip = state.extra.at("clip_norm").item<double>();
    const fax::ClientUpdates local =
        fax::train_clients(ctx, fax::broadcast(fax::Server<fax::TensorTree>(state.params)), training_);
    const auto norms = fax::map_clients([](const fax::TensorTree& d) {
      return fax::row_sums(d.map([](const at::Tensor& t) { return t * t; })).sqrt();
    }, local.deltas);
    const auto clipped = fax::map_clients([clip](const fax::TensorTree& d, const at::Tensor& norm) {
      return fax::scale_rows(d, (clip / norm.clamp_min(1e-12)).clamp_max(1.0));
    }, local.deltas, norms);
    const fax::TensorTree total = fax::sum(clipped).value();

    const double n = static_cast<double>(ctx.program.cohort_size());
    at::Generator g = fax::server_generator(ctx.program.seed(), ctx.round, kNoiseStream);
    const fax::TensorTree noised = total.map([&](const at::Tensor& t) {
      return t + at::randn(t.sizes(), g, t.options().dtype(at::kDouble)).to(t.scalar_type()) * (noise_ * clip);
    });
    state.params = fax::axpy(-server_lr_ / n, noised, state.params);

    const at::Tensor unclipped = fax::sum(fax::map_clients([clip](const at::Tensor& norm, const at::Tensor& kept) {
      return norm.le(clip).to(at::kDouble) * kept.to(at::kDouble);
    }, norms, local.kept)).value();
    const double fraction = (unclipped.item<double>() + count_noise_ * at::randn({1}, g, at::kDouble).item<double>()) / n;
    const double next_clip = adaptive_ ? clip * std::exp(-clip_lr_ * (fraction - target_)) : clip;
    state.extra = fax::TensorTree{{"clip_norm", at::scalar_tensor(next_clip, at::kDouble)}};

    const double q = n / static_cast<double>(ctx.data.num_clients());
    const double epsilon = effective_noise_ > 0 ? fax::sgm_epsilon(q, effective_noise_, ctx.round + 1, delta_).epsilon
                                                : std::numeric_limits<double>::infinity();
    fax::RoundMetrics metrics;
    metrics.server.set("train/loss", fax::weighted_mean(local.losses, local.weights).value());
    metrics.server.set("privacy/epsilon", at::scalar_tensor(epsilon, at::kDouble));
    metrics.server.set("dp/clip_norm", at::scalar_tensor(clip, at::kDouble));
    metrics.server.set("dp/unclipped_fraction", at::scalar_tensor(fraction, at::kDouble));
    metrics.clients.emplace_back("update_norm", norms);
    return metrics;
  }

 private:
  fax::ClientTraining training_;
  double server_lr_ = 1.0;
  double noise_ = 1.0;
  bool adaptive_ = false;
  double target_ = 0.5;
  double clip_lr_ = 0.2;
  double count_noise_ = 0.0;
  double delta_ = 1e-5;
  double effective_noise_ = 1.0;
};

}  // namespace

FAX_PLUGIN(DpFedAvg)
