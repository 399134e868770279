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

  static std::vector<fax::ConfigKey> keys() {
    auto keys = fax::client_training_keys();
    keys.push_back(fax::string_key("server_optimizer", "adam", "the server optimizer", {"adam", "yogi", "adagrad", "sgdm"}));
    keys.push_back(fax::positive_float_key("server_lr", "0.01", "server learning rate (eta)"));
    keys.push_back(fax::float_key("beta1", "0.9", "first-moment decay (momentum)", 0, 0.999));
    keys.push_back(fax::float_key("beta2", "0.99", "second-moment decay (adam, yogi)", 0, 0.9999));
    keys.push_back(fax::positive_float_key("tau", "0.001", "adaptivity: added to sqrt(v); v starts at tau^2"));
    return keys;
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    training_ = fax::client_training(config);
    optimizer_ = config.get_string("algorithm.server_optimizer");
    server_lr_ = config.get_float("algorithm.server_lr");
    beta1_ = config.get_float("algorithm.beta1");
    beta2_ = config.get_float("algorithm.beta2");
    tau_ = config.get_float("algorithm.tau");
    fax::TensorTree moments = fax::prefixed(fax::zeros_like(params), "m/");
    if (optimizer_ != "sgdm") {
      moments = fax::join({moments, fax::prefixed(params.map([&](const at::Tensor& t) {
                                                    return at::full_like(t, tau_ * tau_);
                                                  }), "v/")});
    }
    return {std::move(params), std::move(moments)};
  }

  fax::RoundMetrics round(fax::ServerState& state, fax::RoundContext& ctx) const override {
    const fax::RoundUpdate update = fax::mean_client_update(ctx, state.params, training_);
    const fax::TensorTree& g = update.mean;

    fax::TensorTree m = fax::unprefixed(state.extra, "m/");
    fax::TensorTree step;
    if (optimizer_ == "sgdm") {
      m = fax::axpy(beta1_, m, g);
      step = m;
    } else {
      m = fax::add(fax::scale(m, beta1_), fax::scale(g, 1 - beta1_));
      fax::TensorTree v = fax::unprefixed(state.extra, "v/");
      const fax::TensorTree g2 = g.map([](const at::Tensor& t) { return t * t; });
      if (optimizer_ == "adagrad") {
        v = fax::add(v, g2);
      } else if (optimizer_ == "adam") {
        v = fax::add(fax::scale(v, beta2_), fax::scale(g2, 1 - beta2_));
      } else {  // yogi
        v = fax::zip_map(v, g2, [&](const at::Tensor& vt, const at::Tensor& s) {
          return vt - (1 - beta2_) * s * at::sign(vt - s);
        });
      }
      step = fax::zip_map(m, v, [&](const at::Tensor& mt, const at::Tensor& vt) { return mt / (vt.sqrt() + tau_); });
      state.extra = fax::join({fax::prefixed(m, "m/"), fax::prefixed(v, "v/")});
    }
    if (optimizer_ == "sgdm") state.extra = fax::prefixed(m, "m/");
    state.params = fax::axpy(-server_lr_, step, state.params);
    return fax::round_metrics(ctx, update);
  }

 private:
  fax::ClientTraining training_;
  std::string optimizer_ = "adam";
  double server_lr_ = 0.01;
  double beta1_ = 0.9;
  double beta2_ = 0.99;
  double tau_ = 1e-3;
};

}  // namespace

FAX_PLUGIN(FedOpt)
