// FedBuff (Nguyen et al. 2022, "Federated Learning with Buffered Asynchronous Aggregation"): up to
// cohort.concurrency clients train at once, each from the model version current when it was
// dispatched; the server steps once cohort.size updates (the buffer K) have arrived, each scaled by
// its staleness weight s(tau):
//   x = x - server_lr (sum_i n_i s(tau_i) Delta_i) / (sum_i n_i)
// (with a uniform pipeline, e.g. DP: (1 / K) sum_i s(tau_i) Delta_i, the paper's form), with
// optional server momentum. The timeline (who arrives when, from which version) is the simulated
// clock's; this file is the server's arithmetic only.

#include <ATen/ATen.h>

#include <fax/fax.h>

namespace {

class FedBuff final : public fax::Algorithm {
 public:
  static constexpr const char* name = "fedbuff";
  static constexpr const char* description =
      "FedBuff: asynchronous, buffered; a server step every cohort.size arrivals, updates weighted by staleness";

  struct Options {
    fax::ClientTrainingOptions client;
    fax::StalenessOptions staleness;
    double server_lr = 1.0;
    double server_momentum = 0.0;
  };

  static const fax::Settings<Options>& settings() {
    static const fax::Settings<Options> table = fax::Settings<Options>()
        .include(&Options::client, fax::client_training_settings())
        .include(&Options::staleness, fax::staleness_settings())
        .add("server_lr", &Options::server_lr, "server learning rate on the buffered update", fax::positive())
        .add("server_momentum", &Options::server_momentum, "server momentum; 0: plain SGD", fax::in(0, 0.999));
    return table;
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    o_ = settings().read(config, "algorithm");
    training_ = fax::client_training(o_.client);
    fax::ServerState state{std::move(params), {}};
    if (o_.server_momentum > 0) state.extra = fax::zeros_like(state.params);
    return state;
  }

  bool asynchronous() const override { return true; }
  int64_t local_examples(int64_t examples) const override { return fax::local_examples(training_, examples); }

  fax::RoundMetrics round(fax::ServerState& state, fax::RoundContext& ctx) const override {
    const fax::RoundUpdate update = fax::mean_client_update(ctx, fax::async_start(ctx), state.params, training_,
                                                            fax::staleness_factors(ctx, o_.staleness));
    fax::TensorTree step = update.mean;
    if (o_.server_momentum > 0) {
      state.extra = fax::axpy(o_.server_momentum, state.extra, update.mean);
      step = state.extra;
    }
    state.params = fax::axpy(-o_.server_lr, step, state.params);
    return fax::round_metrics(ctx, update);
  }

 private:
  fax::ClientTraining training_;
  Options o_;
};

}  // namespace

FAX_PLUGIN(FedBuff)
