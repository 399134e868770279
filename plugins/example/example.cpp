// A minimal algorithm plugin to copy: every client runs local SGD from the server model and the
// server takes the plain (unweighted) mean of the clients' models. Rename the class, `name` and
// the file, declare your settings, write round() with the primitives, and build with
// fax_add_plugin.

#include <ATen/ATen.h>

#include <fax/fax.h>

namespace {

class ModelAverage final : public fax::Algorithm {
 public:
  // algorithm.name in an experiment; the library must be called fax_<name>.so.
  static constexpr const char* name = "example";
  static constexpr const char* description = "template: local SGD, then the unweighted mean of client models";

  // The settings, each a member with its default, stated once.
  struct Options {
    double client_lr = 0.1;
    int64_t batch_size = 10;
  };

  // The keys under "algorithm." in an experiment, bound to the members: fax-run validates types,
  // ranges and names against this table, and `fax-run plugins` lists it.
  static const fax::Settings<Options>& settings() {
    static const fax::Settings<Options> table = fax::Settings<Options>()
        .add("client_lr", &Options::client_lr, "client SGD learning rate", fax::positive())
        .add("batch_size", &Options::batch_size, "client minibatch size; 0: the whole local data set", fax::at_least(0));
    return table;
  }

  // Runs once on the coordinator: read settings, build the state before round 0.
  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    o_ = settings().read(config, "algorithm");
    return {std::move(params), {}};
  }

  // What a client computes on in a round, for the simulated clock: one epoch of batch_size steps.
  int64_t local_examples(int64_t examples) const override {
    fax::ClientTraining training;
    training.epochs = 1;
    training.batch_size = o_.batch_size;
    return fax::local_examples(training, examples);
  }

  // Runs on every executor at once (SPMD) on its own clients; combine clients only through the
  // primitives (broadcast, map_clients, sum, mean, weighted_mean).
  fax::RoundMetrics round(fax::ServerState& state, fax::RoundContext& ctx) const override {
    const auto start = fax::broadcast(fax::Server<fax::TensorTree>(state.params));
    // map_clients runs a batched function on chunks of clients: each row is one client.
    const auto trained = fax::map_clients([&](const fax::ClientChunk& chunk, const fax::TensorTree& params) {
      const fax::ClientBatches batches(chunk, ctx.data, 1, o_.batch_size);
      // A 0-dim double keeps full precision without changing the parameters' dtype.
      return fax::local_sgd(ctx.model, batches, params, at::scalar_tensor(o_.client_lr, at::kDouble)).params;
    }, start);
    state.params = fax::mean(trained).value();

    fax::RoundMetrics metrics;
    metrics.server.set("train/param_norm", fax::squared_norm(state.params).sqrt());
    return metrics;
  }

 private:
  Options o_;
};

}  // namespace

FAX_PLUGIN(ModelAverage)
