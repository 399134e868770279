// FedProx (Li et al. 2020): FedAvg whose clients minimise their loss plus a proximal term
// mu / 2 |w - w_start|^2, which keeps heterogeneous clients near the server model.

#include <ATen/ATen.h>

#include <fax/fax.h>

namespace {

class FedProx final : public fax::Algorithm {
 public:
  static constexpr const char* name = "fedprox";
  static constexpr const char* description = "FedProx: FedAvg with a proximal term mu/2 |w - w_server|^2 in each client's loss";

  static std::vector<fax::ConfigKey> keys() {
    auto keys = fax::client_training_keys();
    keys.push_back(fax::float_key("mu", "0.01", "proximal term weight; 0: FedAvg", 0));
    keys.push_back(fax::positive_float_key("server_lr", "1.0", "server learning rate on the averaged update"));
    return keys;
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    training_ = fax::client_training(config);
    server_lr_ = config.get_float("algorithm.server_lr");
    const double mu = config.get_float("algorithm.mu");
    training_.customize = [mu](const fax::ClientChunk&, const fax::TensorTree& start) {
      const fax::TensorTree anchor = fax::detach(start);
      fax::LocalSgdOptions options;
      options.penalty = [mu, anchor](const fax::TensorTree& w) {
        return 0.5 * mu * fax::row_sums(fax::sub(w, anchor).map([](const at::Tensor& d) { return d * d; }));
      };
      return options;
    };
    return {std::move(params), {}};
  }

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
