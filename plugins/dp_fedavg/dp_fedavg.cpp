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

  struct Options {
    fax::ClientTrainingOptions client;
    double server_lr = 1.0;
    double clip_norm = 1.0;
    double noise_multiplier = 1.0;
    bool adaptive_clipping = false;
    double target_quantile = 0.5;
    double clip_lr = 0.2;
    double count_noise = 0.0;
    double delta = 1e-5;
  };

  static const fax::Settings<Options>& settings() {
    static const fax::Settings<Options> table = fax::Settings<Options>()
        .include(&Options::client, fax::client_training_settings())
        .add("server_lr", &Options::server_lr, "server learning rate on the noised mean update", fax::positive())
        .add("clip_norm", &Options::clip_norm, "L2 norm each client update is clipped to (initial C)", fax::positive())
        .add("noise_multiplier", &Options::noise_multiplier, "z: noise std on the sum is z * C; 0: no noise",
             fax::at_least(0))
        .add("adaptive_clipping", &Options::adaptive_clipping, "move C toward a quantile of the update norms")
        .add("target_quantile", &Options::target_quantile, "adaptive clipping: share of updates left unclipped",
             fax::in(0, 1))
        .add("clip_lr", &Options::clip_lr, "adaptive clipping: geometric step on C", fax::positive())
        .add("count_noise", &Options::count_noise, "adaptive clipping: noise std on the unclipped count", fax::at_least(0))
        .add("delta", &Options::delta, "delta of the reported (epsilon, delta)", fax::above(0, 1));
    return table;
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    o_ = settings().read(config, "algorithm");
    training_ = fax::client_training(o_.client);
    FAX_CHECK(!o_.adaptive_clipping || o_.noise_multiplier == 0 || o_.count_noise > 0,
              "{}: adaptive clipping with noise needs algorithm.count_noise > 0: the unclipped count is released too",
              config.origin("algorithm.count_noise").str());
    // With adaptive clipping both queries share the privacy budget (Andrew et al. 2021, section 3).
    const double z = o_.noise_multiplier, c = o_.count_noise;
    effective_noise_ = o_.adaptive_clipping && z > 0 ? 1.0 / std::sqrt(1.0 / (z * z) + 1.0 / (4 * c * c)) : z;
    fax::TensorTree extra{{"clip_norm", at::scalar_tensor(o_.clip_norm, at::kDouble)}};
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
      const at::Tensor noise = at::randn(t.sizes(), g, t.options().dtype(at::kDouble)).to(t.scalar_type());
      return t + noise * (o_.noise_multiplier * clip);
    });
    state.params = fax::axpy(-o_.server_lr / n, noised, state.params);

    const at::Tensor unclipped = fax::sum(fax::map_clients([clip](const at::Tensor& norm, const at::Tensor& kept) {
      return norm.le(clip).to(at::kDouble) * kept.to(at::kDouble);
    }, norms, local.kept)).value();
    const double fraction = (unclipped.item<double>() + o_.count_noise * at::randn({1}, g, at::kDouble).item<double>()) / n;
    const double next_clip = o_.adaptive_clipping ? clip * std::exp(-o_.clip_lr * (fraction - o_.target_quantile)) : clip;
    state.extra = fax::TensorTree{{"clip_norm", at::scalar_tensor(next_clip, at::kDouble)}};

    const double q = n / static_cast<double>(ctx.data.num_clients());
    const double epsilon = effective_noise_ > 0 ? fax::sgm_epsilon(q, effective_noise_, ctx.round + 1, o_.delta).epsilon
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
  Options o_;
  double effective_noise_ = 1.0;
};

}  // namespace

FAX_PLUGIN(DpFedAvg)
