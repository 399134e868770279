// FedProx (Li et al. 2020): FedAvg whose clients minimise their loss plus a proximal term
// mu / 2 |w - w_start|^2, which keeps heterogeneous clients near the server model.

#include <ATen/ATen.h>

#include <fax/fax.h>

namespace {

class FedProx final : public fax::Algorithm {
 public:
  static constexpr const char* name = "fedprox";
  static constexpr const char* description = "FedProx: FedAvg with a proximal term mu/2 |w - w_server|^2 in each client's loss";

  struct Options {
    fax::ClientTrainingOptions client;
    double mu = 0.01;
    double server_lr = 1.0;
  };

  static const fax::Settings<Options>& settings() {
    static const fax::Settings<Options> table = fax::Settings<Options>()
        .include(&Options::client, fax::client_training_settings())
        .add("mu", &Options::mu, "proximal term weight; 0: FedAvg", fax::at_least(0))
        .add("server_lr", &Options::server_lr, "server learning rate on the averaged update", fax::positive());
    return table;
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    const Options o = settings().read(config, "algorithm");
    training_ = fax::client_training(o.client);
    server_lr_ = o.server_lr;
    const double mu = o.mu;
    training_.customize = [mu](const fax::ClientChunk&, const fax::TensorTree& start) {
      const fax::TensorTree anchor = fax::detach(start);
      fax::LocalSgdOptions options;
      options.penalty = [mu, anchor](const fax::TensorTree& w, const at::Tensor& clients) {
        const fax::TensorTree rows = clients.defined() ? anchor.map([&](const at::Tensor& a) { return a.index_select(0, clients); }) : anchor;
        return 0.5 * mu * fax::row_sums(fax::sub(w, rows).map([](const at::Tensor& d) { return d * d; }));
      };
      return options;
    };
    return {std::move(params), {}};
  }

  int64_t local_examples(int64_t examples) const override { return fax::local_examples(training_, examples); }
  fax::RoundMetrics round(fax::ServerState& state, fax::RoundContext& ctx) const override {
    const fax::RoundUpdate update = fax::mean_client_update(ctx, state.params, training_);
    state.params = fax::axpy(-server_lr_, update.mean, state.params);
    return fax::round_metrics(ctx, update);
  }

 private:
  fax::ClientTraining training_;
  double server_lr_ = 1.0;
};

}  // namespace

FAX_PLUGIN(FedProx)
