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
    return {fax::positive_float_key("client_lr", "0.1", "client SGD learning rate"),
            fax::int_key("local_epochs", "1", "passes over each client's data per round (E)", 1),
            fax::int_key("batch_size", "10", "client minibatch size (B); 0: the whole local data set", 0),
            fax::positive_float_key("server_lr", "1.0", "server learning rate on the averaged update"),
            fax::float_key("server_momentum", "0.0", "server momentum (FedAvgM); 0: plain FedAvg", 0, 0.999)};
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    client_lr_ = config.get_float("algorithm.client_lr");
    epochs_ = config.get_int("algorithm.local_epochs");
    batch_size_ = config.get_int("algorithm.batch_size");
    server_lr_ = config.get_float("algorithm.server_lr");
    momentum_ = config.get_float("algorithm.server_momentum");
    fax::ServerState state{std::move(params), {}};
    if (momentum_ > 0) state.extra = fax::zeros_like(state.params);
    return state;
  }

  fax::RoundMetrics round(fax::ServerState& state, fax::RoundContext& ctx) const override {
    const auto start = fax::broadcast(fax::Server<fax::TensorTree>(state.params));
    // A 0-dim double keeps full precision without changing the parameters' dtype.
    const at::Tensor lr = at::scalar_tensor(client_lr_, at::kDouble);
    // One tree per chunk: the clients' updates (start - trained) and their mean training loss.
    const auto trained = fax::map_clients([&](const fax::ClientChunk& chunk, const fax::TensorTree& params) {
      const fax::ClientBatches batches(chunk, ctx.data, epochs_, batch_size_);
      const fax::LocalSgdResult local = fax::local_sgd(ctx.model, batches, params, lr);
      fax::TensorTree out = fax::sub(params, local.params);
      out.set(kLoss, local.loss);
      return out;
    }, start);
    fax::TensorTree deltas = trained.value();
    const fax::Clients<at::Tensor> losses(deltas.at(kLoss));
    deltas = deltas_only(deltas);

    const auto weights = ctx.example_counts();
    const fax::TensorTree update = fax::weighted_mean(fax::Clients<fax::TensorTree>(deltas), weights).value();
    fax::TensorTree step = update;
    if (momentum_ > 0) {
      state.extra = fax::axpy(momentum_, state.extra, update);  // v = momentum * v + update
      step = state.extra;
    }
    state.params = fax::axpy(-server_lr_, step, state.params);

    fax::RoundMetrics metrics;
    metrics.server.set("train/loss", fax::weighted_mean(losses, weights).value());
    metrics.server.set("train/update_norm", fax::squared_norm(update).sqrt());
    metrics.clients.emplace_back("train_loss", losses);
    return metrics;
  }

 private:
  static constexpr const char* kLoss = "__loss";

  static fax::TensorTree deltas_only(const fax::TensorTree& tree) {
    fax::TensorTree out;
    for (const auto& [leaf, t] : tree)
      if (leaf != kLoss) out.set(leaf, t);
    return out;
  }

  double client_lr_ = 0.1;
  int64_t epochs_ = 1;
  int64_t batch_size_ = 10;
  double server_lr_ = 1.0;
  double momentum_ = 0.0;
};

}  // namespace

FAX_PLUGIN(FedAvg)
