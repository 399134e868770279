// FedAsync (Xie, Koyejo, Gupta 2019, "Asynchronous Federated Optimization"): the server mixes each
// arriving client model x_i, trained from the version x_tau it was dispatched with, into the
// current one with a staleness-weighted rate:
//   x = (1 - alpha s(t - tau)) x + alpha s(t - tau) x_i
// With cohort.size 1 this is the paper's update, one server step per arrival; with a buffer of K
// arrivals the step mixes their example-weighted mean:
//   x = x - alpha (sum_i n_i s_i ((x - x_tau_i) + Delta_i)) / (sum_i n_i),  Delta_i = x_tau_i - x_i
// The timeline (who arrives when, from which version) is the simulated clock's.

#include <ATen/ATen.h>

#include <fax/fax.h>

namespace {

class FedAsync final : public fax::Algorithm {
 public:
  static constexpr const char* name = "fedasync";
  static constexpr const char* description =
      "FedAsync: asynchronous; each arriving client model mixed into the server's at a staleness-weighted rate";

  struct Options {
    fax::ClientTrainingOptions client;
    fax::StalenessOptions staleness;
    double alpha = 0.6;
  };

  static const fax::Settings<Options>& settings() {
    static const fax::Settings<Options> table = fax::Settings<Options>()
        .include(&Options::client, fax::client_training_settings())
        .include(&Options::staleness, fax::staleness_settings())
        .add("alpha", &Options::alpha, "mixing rate: the weight of a fresh client model", fax::in(0, 1));
    return table;
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    o_ = settings().read(config, "algorithm");
    training_ = fax::client_training(o_.client);
    return {std::move(params), {}};
  }

  bool asynchronous() const override { return true; }
  int64_t local_examples(int64_t examples) const override { return fax::local_examples(training_, examples); }

  fax::RoundMetrics round(fax::ServerState& state, fax::RoundContext& ctx) const override {
    const auto start = fax::async_start(ctx);
    const auto factors = fax::staleness_factors(ctx, o_.staleness);
    const fax::RoundUpdate update = fax::mean_client_update(ctx, start, state.params, training_, factors);
    // Weighed as the mean weighs the updates: by example count, or with a uniform pipeline (DP) by
    // the nominal cohort.
    const bool uniform = ctx.aggregation != nullptr && ctx.aggregation->uniform();
    const fax::Clients<at::Tensor>& weights = uniform ? update.kept : update.weights;
    // The versions' drift sum_i n_i s_i (x - x_tau_i) = (sum_i n_i s_i) x - sum_i n_i s_i x_tau_i.
    const auto weighted = fax::map_clients([](const fax::ClientChunk&, const fax::TensorTree& from,
                                              const at::Tensor& n, const at::Tensor& s) {
      const at::Tensor ns = n * s.to(n.scalar_type());
      fax::TensorTree rows = fax::prefixed(fax::scale_rows(from, ns), "start/");
      rows.set("weight", ns);
      return rows;
    }, start, weights, factors);
    const fax::TensorTree sums = fax::sum(weighted).value();
    const double divisor = uniform ? static_cast<double>(ctx.nominal_cohort())
                                   : fax::sum(weights).value().item<double>();
    const fax::TensorTree drift = fax::axpy(sums.at("weight").item<double>(), state.params,
                                            fax::scale(fax::unprefixed(sums, "start/"), -1.0));
    state.params = fax::axpy(-o_.alpha, fax::axpy(1.0 / divisor, drift, update.mean), state.params);
    return fax::round_metrics(ctx, update);
  }

 private:
  fax::ClientTraining training_;
  Options o_;
};

}  // namespace

FAX_PLUGIN(FedAsync)
