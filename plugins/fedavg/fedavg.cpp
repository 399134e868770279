// FedAvg (McMahan et al. 2017) and, with server momentum, FedAvgM (Hsu et al. 2019), written only
// with the federated primitives: broadcast the model, run local SGD on every client (batched over
// chunks of clients), average the clients' updates weighted by their example counts, take a server
// step with the averaged update as pseudo-gradient.

#include <ATen/ATen.h>

#include <fax/fax.h>

namespace {

class FedAvg final : public fax::Algorithm {
 public:
  static constexpr const char* name = "fedavg";
  static constexpr const char* description =
      "FedAvg: local SGD on each client, example-weighted mean of updates, server SGD (momentum: FedAvgM)";

  static std::vector<fax::ConfigKey> keys() {
    auto keys = fax::client_training_keys();
    keys.push_back(fax::positive_float_key("server_lr", "1.0", "server learning rate on the averaged update"));
    keys.push_back(fax::float_key("server_momentum", "0.0", "server momentum (FedAvgM); 0: plain FedAvg", 0, 0.999));
    return keys;
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    training_ = fax::client_training(config);
    server_lr_ = config.get_float("algorithm.server_lr");
    momentum_ = config.get_float("algorithm.server_momentum");
    fax::ServerState state{std::move(params), {}};
    if (momentum_ > 0) state.extra = fax::zeros_like(state.params);
    return state;
  }

  fax::RoundMetrics round(fax::ServerState& state, fax::RoundContext& ctx) const override {
    const fax::RoundUpdate update = fax::mean_client_update(ctx, state.params, training_);
    fax::TensorTree step = update.mean;
    if (momentum_ > 0) {
      state.extra = fax::axpy(momentum_, state.extra, update.mean);  // v = momentum * v + update
      step = state.extra;
    }
    state.params = fax::axpy(-server_lr_, step, state.params);
    return fax::round_metrics(ctx, update);
  }

 private:
  fax::ClientTraining training_;
  double server_lr_ = 1.0;
  double momentum_ = 0.0;
};

}  // namespace

FAX_PLUGIN(FedAvg)
