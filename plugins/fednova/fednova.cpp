// FedNova (Wang et al. 2020, "Tackling the Objective Inconsistency Problem in Heterogeneous
// Federated Optimization"): clients that take more local steps move further, so plain averaging
// pulls the model towards them. FedNova divides each client's update by its local progress a_i
// (tau_i SGD steps: a_i = tau_i; with momentum rho: a_i = sum_{t=1..tau_i} (1 - rho^t) / (1 - rho)),
// averages those normalised updates with the example weights p_i = n_i / n, and steps by the
// effective progress tau_eff = sum_i p_i a_i:  x <- x - server_lr * tau_eff * sum_i p_i (x - y_i) / a_i.

#include <ATen/ATen.h>

#include <fax/fax.h>

namespace {

class FedNova final : public fax::Algorithm {
 public:
  static constexpr const char* name = "fednova";
  static constexpr const char* description =
      "FedNova: client updates normalised by their local progress (steps, momentum), then averaged (Wang et al. 2020)";

  struct Options {
    fax::ClientTrainingOptions client;
    double server_lr = 1.0;
  };

  static const fax::Settings<Options>& settings() {
    static const fax::Settings<Options> table = fax::Settings<Options>()
        .include(&Options::client, fax::client_training_settings())
        .add("server_lr", &Options::server_lr, "server learning rate on the normalised update", fax::positive());
    return table;
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    const Options o = settings().read(config, "algorithm");
    training_ = fax::client_training(o.client);
    server_lr_ = o.server_lr;
    return {std::move(params), {}};
  }

  int64_t local_examples(int64_t examples) const override { return fax::local_examples(training_, examples); }
  fax::RoundMetrics round(fax::ServerState& state, fax::RoundContext& ctx) const override {
    fax::ClientTraining training = training_;
    const double rho = training_.momentum;
    // Each client's local progress a_i from its own step count tau_i.
    training.after = [rho](const fax::ClientChunk&, const fax::TensorTree&, const fax::TensorTree&,
                           const at::Tensor& steps) {
      if (rho == 0.0) return fax::TensorTree{{"a", steps}};
      return fax::TensorTree{{"a", (steps - rho * (1 - at::pow(rho, steps)) / (1 - rho)) / (1 - rho)}};
    };
    const fax::ClientUpdates local =
        fax::train_clients(ctx, fax::broadcast(fax::Server<fax::TensorTree>(state.params)), training);
    const auto progress = fax::map_clients([](const fax::TensorTree& e) { return e.at("a"); }, local.extras);
    // sum_i p_i d_i / a_i = weighted_mean(d, n / a) * sum(n / a) / sum(n); dropped clients have n = 0.
    const auto weight_by_progress =
        fax::map_clients([](const at::Tensor& n, const at::Tensor& a) { return n / a; }, local.weights, progress);
    const fax::TensorTree normalised = fax::weighted_mean(local.deltas, weight_by_progress).value();
    const at::Tensor share = fax::sum(weight_by_progress).value() / fax::sum(local.weights).value();
    const at::Tensor tau_eff = fax::weighted_mean(progress, local.weights).value();
    const fax::RoundUpdate update{local.losses, local.weights, local.kept, fax::scale(normalised, tau_eff * share)};
    state.params = fax::axpy(-server_lr_, update.mean, state.params);

    fax::RoundMetrics metrics = fax::round_metrics(ctx, update);
    metrics.server.set("train/tau_eff", tau_eff);
    return metrics;
  }

 private:
  fax::ClientTraining training_;
  double server_lr_ = 1.0;
};

}  // namespace

FAX_PLUGIN(FedNova)
