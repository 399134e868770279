// A minimal algorithm plugin to copy: every client runs local SGD from the server model and the
// server takes the plain (unweighted) mean of the clients' models. Rename the class, `name` and
// the file, declare your keys, write round() with the primitives, and build with fax_add_plugin.

#include <ATen/ATen.h>

#include <fax/fax.h>

namespace {

class ModelAverage final : public fax::Algorithm {
 public:
  // algorithm.name in an experiment; the library must be called fax_<name>.so.
  static constexpr const char* name = "example";
  static constexpr const char* description = "template: local SGD, then the unweighted mean of client models";

  // Settings under "algorithm." in an experiment; fax-run validates types, ranges and names.
  static std::vector<fax::ConfigKey> keys() {
    return {fax::positive_float_key("client_lr", "0.1", "client SGD learning rate"),
            fax::int_key("batch_size", "10", "client minibatch size; 0: the whole local data set", 0)};
  }

  // Runs once on the coordinator: read settings, build the state before round 0.
  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    client_lr_ = config.get_float("algorithm.client_lr");
    batch_size_ = config.get_int("algorithm.batch_size");
    return {std::move(params), {}};
  }

  // Runs on every executor at once (SPMD) on its own clients; combine clients only through the
  // primitives (broadcast, map_clients, sum, mean, weighted_mean).
  fax::RoundMetrics round(fax::ServerState& state, fax::RoundContext& ctx) const override {
    const auto start = fax::broadcast(fax::Server<fax::TensorTree>(state.params));
    // map_clients runs a batched function on chunks of clients: each row is one client.
    const auto trained = fax::map_clients([&](const fax::ClientChunk& chunk, const fax::TensorTree& params) {
      const fax::ClientBatches batches(chunk, ctx.data, 1, batch_size_);
      // A 0-dim double keeps full precision without changing the parameters' dtype.
      return fax::local_sgd(ctx.model, batches, params, at::scalar_tensor(client_lr_, at::kDouble)).params;
    }, start);
    state.params = fax::mean(trained).value();

    fax::RoundMetrics metrics;
    metrics.server.set("train/param_norm", fax::squared_norm(state.params).sqrt());
    return metrics;
  }

 private:
  double client_lr_ = 0.1;
  int64_t batch_size_ = 10;
};

}  // namespace

FAX_PLUGIN(ModelAverage)
