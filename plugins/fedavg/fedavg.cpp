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

  struct Options {
    fax::ClientTrainingOptions client;
    double server_lr = 1.0;
    double server_momentum = 0.0;
  };

  static const fax::Settings<Options>& settings() {
    static const fax::Settings<Options> table = fax::Settings<Options>()
        .include(&Options::client, fax::client_training_settings())
        .add("server_lr", &Options::server_lr, "server learning rate on the averaged update", fax::positive())
        .add("server_momentum", &Options::server_momentum, "server momentum (FedAvgM); 0: plain FedAvg", fax::in(0, 0.999));
    return table;
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    const Options o = settings().read(config, "algorithm");
    training_ = fax::client_training(o.client);
    server_lr_ = o.server_lr;
    momentum_ = o.server_momentum;
    fax::ServerState state{std::move(params), {}};
    if (momentum_ > 0) state.extra = fax::zeros_like(state.params);
    return state;
  }

  int64_t local_examples(int64_t examples) const override { return fax::local_examples(training_, examples); }
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
