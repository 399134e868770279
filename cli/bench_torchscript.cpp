#include "bench_torchscript.h"

#include <memory>

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/script.h>

namespace fax::cli {

void save_torchscript_mlp(const std::string& path) {
  torch::jit::Module module("Mlp");
  const int64_t sizes[] = {784, 200, 200, 10};
  for (int l = 0; l < 3; ++l) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(sizes[l]));
    module.register_parameter(fmt::format("w{}", l),
                              at::empty({sizes[l + 1], sizes[l]}).uniform_(-bound, bound).requires_grad_(true), false);
    module.register_parameter(fmt::format("b{}", l), at::empty({sizes[l + 1]}).uniform_(-bound, bound).requires_grad_(true),
                              false);
  }
  module.define(R"(
def forward(self, x):
    h = torch.relu(torch.linear(x.flatten(1), self.w0, self.b0))
    h = torch.relu(torch.linear(h, self.w1, self.b1))
    return torch.linear(h, self.w2, self.b2)
)");
  module.save(path);
}

std::function<void()> torchscript_loop_round(const FederatedDataset& data, const Cohort& cohort,
                                             const std::string& path, int64_t batch, double lr) {
  struct Loop {
    torch::jit::Module module;
    std::vector<at::Tensor> params, server;
    std::unique_ptr<torch::optim::SGD> optimizer;
  };
  auto loop = std::make_shared<Loop>();
  loop->module = torch::jit::load(path);
  loop->module.train();
  for (const at::Tensor& p : loop->module.parameters()) {
    loop->params.push_back(p);
    loop->server.push_back(p.detach().clone());
  }
  loop->optimizer = std::make_unique<torch::optim::SGD>(loop->params, torch::optim::SGDOptions(lr));
  return [loop, &data, cohort, batch] {
    std::vector<at::Tensor> total;
    for (const at::Tensor& s : loop->server) total.push_back(at::zeros_like(s));
    for (int64_t i = 0; i < cohort.size(); ++i) {
      const Examples ex = data.client(cohort.id(i));
      {
        const at::NoGradGuard no_grad;
        for (size_t j = 0; j < loop->params.size(); ++j) loop->params[j].copy_(loop->server[j]);
      }
      const at::Tensor order = at::randperm(ex.size(), at::kLong);
      for (int64_t b = 0; b < ex.size(); b += batch) {
        const at::Tensor idx = order.narrow(0, b, std::min(batch, ex.size() - b));
        loop->optimizer->zero_grad();
        const at::Tensor logits = loop->module.forward({ex.x.index_select(0, idx)}).toTensor();
        torch::nn::functional::cross_entropy(logits, ex.y.index_select(0, idx)).backward();
        loop->optimizer->step();
      }
      const at::NoGradGuard no_grad;
      for (size_t j = 0; j < total.size(); ++j)
        total[j].add_(loop->server[j] - loop->params[j], static_cast<double>(ex.size()));
    }
  };
}

}  // namespace fax::cli
