// Adaptive federated optimisation (Reddi et al. 2021, "Adaptive Federated Optimization"): clients
// run local SGD as in FedAvg; the server treats the example-weighted mean of their updates as a
// pseudo-gradient and steps with Adam, Yogi, Adagrad or SGD with momentum:
//   m = beta1 m + (1 - beta1) g
//   v = v + g^2                                  (adagrad)
//   v = beta2 v + (1 - beta2) g^2                (adam)
//   v = v - (1 - beta2) g^2 sign(v - g^2)        (yogi)
//   x = x - server_lr m / (sqrt(v) + tau)
// with v starting at tau^2 and no bias correction, as in the paper. sgdm: x = x - server_lr m with
// m = beta1 m + g (FedAvgM).

#include <ATen/ATen.h>

#include <fax/fax.h>

namespace {

class FedOpt final : public fax::Algorithm {
 public:
  static constexpr const char* name = "fedopt";
  static constexpr const char* description =
      "FedAdam / FedYogi / FedAdagrad / FedAvgM: an adaptive server optimizer on the mean client update (Reddi et al. 2021)";

  struct Options {
    fax::ClientTrainingOptions client;
    std::string server_optimizer = "adam";
    double server_lr = 0.01;
    double beta1 = 0.9;
    double beta2 = 0.99;
    double tau = 1e-3;
  };

  static const fax::Settings<Options>& settings() {
    static const fax::Settings<Options> table = fax::Settings<Options>()
        .include(&Options::client, fax::client_training_settings())
        .add("server_optimizer", &Options::server_optimizer, "the server optimizer",
             fax::one_of({"adam", "yogi", "adagrad", "sgdm"}))
        .add("server_lr", &Options::server_lr, "server learning rate (eta)", fax::positive())
        .add("beta1", &Options::beta1, "first-moment decay (momentum)", fax::in(0, 0.999))
        .add("beta2", &Options::beta2, "second-moment decay (adam, yogi)", fax::in(0, 0.9999))
        .add("tau", &Options::tau, "adaptivity: added to sqrt(v); v starts at tau^2", fax::positive());
    return table;
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    o_ = settings().read(config, "algorithm");
    training_ = fax::client_training(o_.client);
    fax::TensorTree moments = fax::prefixed(fax::zeros_like(params), "m/");
    if (o_.server_optimizer != "sgdm") {
      moments = fax::join({moments, fax::prefixed(params.map([&](const at::Tensor& t) {
                                                    return at::full_like(t, o_.tau * o_.tau);
                                                  }), "v/")});
    }
    return {std::move(params), std::move(moments)};
  }

  int64_t local_examples(int64_t examples) const override { return fax::local_examples(training_, examples); }
  fax::RoundMetrics round(fax::ServerState& state, fax::RoundContext& ctx) const override {
    const fax::RoundUpdate update = fax::mean_client_update(ctx, state.params, training_);
    const fax::TensorTree& g = update.mean;

    fax::TensorTree m = fax::unprefixed(state.extra, "m/");
    fax::TensorTree step;
    if (o_.server_optimizer == "sgdm") {
      m = fax::axpy(o_.beta1, m, g);
      step = m;
    } else {
      m = fax::add(fax::scale(m, o_.beta1), fax::scale(g, 1 - o_.beta1));
      fax::TensorTree v = fax::unprefixed(state.extra, "v/");
      const fax::TensorTree g2 = g.map([](const at::Tensor& t) { return t * t; });
      if (o_.server_optimizer == "adagrad") {
        v = fax::add(v, g2);
      } else if (o_.server_optimizer == "adam") {
        v = fax::add(fax::scale(v, o_.beta2), fax::scale(g2, 1 - o_.beta2));
      } else {  // yogi
        v = fax::zip_map(v, g2, [&](const at::Tensor& vt, const at::Tensor& s) {
          return vt - (1 - o_.beta2) * s * at::sign(vt - s);
        });
      }
      step = fax::zip_map(m, v, [&](const at::Tensor& mt, const at::Tensor& vt) { return mt / (vt.sqrt() + o_.tau); });
      state.extra = fax::join({fax::prefixed(m, "m/"), fax::prefixed(v, "v/")});
    }
    if (o_.server_optimizer == "sgdm") state.extra = fax::prefixed(m, "m/");
    state.params = fax::axpy(-o_.server_lr, step, state.params);
    return fax::round_metrics(ctx, update);
  }

 private:
  fax::ClientTraining training_;
  Options o_;
};

}  // namespace

FAX_PLUGIN(FedOpt)
