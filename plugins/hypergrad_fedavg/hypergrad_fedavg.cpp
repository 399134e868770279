// FedAvg whose server learning rate is learned online by hypergradient descent through federated
// AD ("FedOpt with hypergradient descent", Rush et al., Federated Automatic Differentiation, 2023).
// After the round's mean client update Delta, the server takes the candidate step
// x+ = x - eta Delta, evaluates the cohort's federated loss L(x+) (each client's mean loss on its
// local data, example-weighted), and differentiates it with federated AD:
//   dL/d eta = -grad L(x+) . Delta
// (a broadcast, per-client gradients, a weighted mean). eta is learned in log space, so it stays
// positive and the step is scale-free: log eta <- log eta - hyper_lr * eta * dL/d eta; the round
// then steps with the updated eta. With learn_client_lr the client learning rate is learned the
// same way, by differentiating L(x+) through every local step (create_graph).

#include <cmath>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <fax/fax.h>

namespace {

class HypergradFedAvg final : public fax::Algorithm {
 public:
  static constexpr const char* name = "hypergrad_fedavg";
  static constexpr const char* description =
      "FedAvg with the server (and optionally client) learning rate learned by federated-AD hypergradient descent";

  struct Options {
    fax::ClientTrainingOptions client;
    double server_lr = 1.0;
    double hyper_lr = 0.2;
    bool learn_client_lr = false;
    double client_hyper_lr = 0.05;
  };

  static const fax::Settings<Options>& settings() {
    static const fax::Settings<Options> table = fax::Settings<Options>()
        .include(&Options::client, fax::client_training_settings())
        .add("server_lr", &Options::server_lr, "initial server learning rate", fax::positive())
        .add("hyper_lr", &Options::hyper_lr, "hypergradient step size on log(server_lr)", fax::at_least(0))
        .add("learn_client_lr", &Options::learn_client_lr, "also learn the client learning rate (through the local steps)")
        .add("client_hyper_lr", &Options::client_hyper_lr, "hypergradient step size on log(client_lr)", fax::at_least(0));
    return table;
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    o_ = settings().read(config, "algorithm");
    training_ = fax::client_training(o_.client);
    fax::TensorTree rates{{"log_server_lr", at::scalar_tensor(std::log(o_.server_lr), at::kDouble)},
                          {"log_client_lr", at::scalar_tensor(std::log(o_.client.client_lr), at::kDouble)}};
    return {std::move(params), std::move(rates)};
  }

  int64_t local_examples(int64_t examples) const override { return fax::local_examples(training_, examples); }
  fax::RoundMetrics round(fax::ServerState& state, fax::RoundContext& ctx) const override {
    const at::Tensor log_eta = state.extra.at("log_server_lr").detach().requires_grad_(true);
    const at::Tensor log_lr = state.extra.at("log_client_lr").detach().requires_grad_(o_.learn_client_lr);
    fax::ClientTraining training = training_;
    training.lr = fax::Server<at::Tensor>(log_lr.exp());
    training.create_graph = o_.learn_client_lr;

    const auto weights = ctx.example_counts();
    const fax::RoundUpdate round_update = fax::mean_client_update(ctx, state.params, training);
    const fax::TensorTree& update = round_update.mean;
    const fax::TensorTree candidate = fax::axpy(-log_eta.exp(), update, state.params);
    const at::Tensor post_loss =
        fax::weighted_mean(fax::full_batch_losses(ctx, fax::broadcast(fax::Server<fax::TensorTree>(candidate))), weights)
            .value();
    std::vector<at::Tensor> wrt{log_eta};
    if (o_.learn_client_lr) wrt.push_back(log_lr);
    const auto grads = torch::autograd::grad({post_loss}, wrt);

    // d L / d log(rate) = rate * d L / d rate.
    const at::Tensor next_log_eta = (log_eta - o_.hyper_lr * grads[0]).detach();
    const at::Tensor next_log_lr = o_.learn_client_lr ? (log_lr - o_.client_hyper_lr * grads[1]).detach() : log_lr.detach();
    state.params = fax::axpy(-next_log_eta.exp(), fax::detach(update), state.params);
    state.extra = fax::TensorTree{{"log_server_lr", next_log_eta}, {"log_client_lr", next_log_lr}};

    fax::RoundMetrics metrics = fax::round_metrics(ctx, round_update);
    metrics.server.set("hyper/post_round_loss", post_loss.detach());
    metrics.server.set("hyper/server_lr_grad", (grads[0] / log_eta.exp()).detach());
    if (o_.learn_client_lr) metrics.server.set("hyper/client_lr_grad", (grads[1] / log_lr.exp()).detach());
    metrics.server.set("server/lr", next_log_eta.exp());
    metrics.server.set("client/lr", next_log_lr.exp());
    return metrics;
  }

 private:
  fax::ClientTraining training_;
  Options o_;
};

}  // namespace

FAX_PLUGIN(HypergradFedAvg)
