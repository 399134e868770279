// FedSGD (McMahan et al. 2017): every client of the cohort evaluates the loss on all of its data;
// the server gradient is the federated-AD gradient of the example-weighted mean of those losses
// (broadcast's adjoint is the sum over clients), followed by a server SGD step.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <fax/fax.h>

namespace {

class FedSgd final : public fax::Algorithm {
 public:
  static constexpr const char* name = "fedsgd";
  static constexpr const char* description =
      "FedSGD: server SGD on the federated-AD gradient of the cohort's mean loss (one full-batch gradient per client)";

  struct Options {
    double server_lr = 0.1;
  };

  static const fax::Settings<Options>& settings() {
    static const fax::Settings<Options> table =
        fax::Settings<Options>().add("server_lr", &Options::server_lr, "server learning rate", fax::positive());
    return table;
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    server_lr_ = settings().read(config, "algorithm").server_lr;
    return {std::move(params), {}};
  }

  fax::RoundMetrics round(fax::ServerState& state, fax::RoundContext& ctx) const override {
    fax::TensorTree x = fax::detach(state.params);
    fax::requires_grad_(x);
    const auto at_clients = fax::broadcast(fax::Server<fax::TensorTree>(x));
    const auto losses = fax::full_batch_losses(ctx, at_clients);
    const at::Tensor loss = fax::weighted_mean(losses, ctx.example_counts()).value();
    // A model's buffers (BatchNorm statistics) take no part in the loss's graph: no gradient, no step.
    std::vector<at::Tensor> grads = torch::autograd::grad({loss}, x.tensors(), {}, false, false, true);
    const std::vector<at::Tensor> leaves = x.tensors();
    for (size_t i = 0; i < grads.size(); ++i)
      if (!grads[i].defined()) grads[i] = at::zeros_like(leaves[i]);
    const fax::TensorTree gradient = x.with_tensors(grads);
    state.params = fax::axpy(-server_lr_, gradient, fax::detach(x));

    fax::RoundMetrics metrics;
    metrics.server.set("train/loss", loss.detach());
    metrics.server.set("train/grad_norm", fax::squared_norm(gradient).sqrt());
    metrics.clients.emplace_back("train_loss", fax::Clients<at::Tensor>(losses.value().detach()));
    return metrics;
  }

 private:
  double server_lr_ = 0.1;
};

}  // namespace

FAX_PLUGIN(FedSgd)
