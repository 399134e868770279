#include "bench_loop.h"

#include <memory>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/optim/sgd.h>
#include <torch/script.h>

#include <fax/runtime/experiment.h>

namespace fax::cli {

LoopModel torch_nn_model(LoopNet arch) {
  namespace nn = torch::nn;
  nn::Sequential net;
  switch (arch) {
    case LoopNet::mlp:
      net = nn::Sequential(nn::Flatten(), nn::Linear(784, 200), nn::ReLU(), nn::Linear(200, 200), nn::ReLU(),
                           nn::Linear(200, 10));
      break;
    case LoopNet::cnn:
      net = nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 32, 5).padding(2)), nn::ReLU(), nn::MaxPool2d(2),
                           nn::Conv2d(nn::Conv2dOptions(32, 64, 5).padding(2)), nn::ReLU(), nn::MaxPool2d(2),
                           nn::Flatten(), nn::Linear(64 * 7 * 7, 512), nn::ReLU(), nn::Linear(512, 10));
      break;
    case LoopNet::lenet:
      net = nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 6, 5)), nn::ReLU(), nn::MaxPool2d(2),
                           nn::Conv2d(nn::Conv2dOptions(6, 16, 5)), nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(),
                           nn::Linear(16 * 4 * 4, 120), nn::ReLU(), nn::Linear(120, 84), nn::ReLU(), nn::Linear(84, 10));
      break;
  }
  net->train();
  return {net->parameters(), [net](const at::Tensor& x) mutable { return net->forward(x); }};
}

LoopModel torchscript_model(const std::string& path) {
  auto module = std::make_shared<torch::jit::Module>(torch::jit::load(path));
  module->train();
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : module->parameters()) params.push_back(p);
  return {params, [module](const at::Tensor& x) { return module->forward({x}).toTensor(); }};
}

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

std::function<void(int64_t)> loop_rounds(const FederatedDataset& data, int64_t cohort, LoopModel model, int64_t batch,
                                         double lr, int64_t epochs, double momentum) {
  struct Loop {
    LoopModel model;
    std::vector<at::Tensor> server;
  };
  auto loop = std::make_shared<Loop>();
  loop->model = std::move(model);
  for (const at::Tensor& p : loop->model.params) loop->server.push_back(p.detach().clone());
  return [loop, &data, cohort, batch, lr, epochs, momentum](int64_t round) {
    std::vector<at::Tensor>& params = loop->model.params;
    std::vector<at::Tensor> total;
    for (const at::Tensor& s : loop->server) total.push_back(at::zeros_like(s));
    double examples = 0;
    const Cohort clients = sample_cohort(data, cohort, 0, round);
    for (int64_t i = 0; i < clients.size(); ++i) {
      const Examples ex = data.client(clients.id(i));
      {
        const at::NoGradGuard no_grad;
        for (size_t j = 0; j < params.size(); ++j) params[j].copy_(loop->server[j]);
      }
      torch::optim::SGD optimizer(params, torch::optim::SGDOptions(lr).momentum(momentum));
      for (int64_t e = 0; e < epochs; ++e) {
        const at::Tensor order = at::randperm(ex.size(), at::kLong);
        for (int64_t b = 0; b < ex.size(); b += batch) {
          const at::Tensor idx = order.narrow(0, b, std::min(batch, ex.size() - b));
          optimizer.zero_grad();
          torch::nn::functional::cross_entropy(loop->model.forward(ex.x.index_select(0, idx)), ex.y.index_select(0, idx))
              .backward();
          optimizer.step();
        }
      }
      const at::NoGradGuard no_grad;
      for (size_t j = 0; j < total.size(); ++j)
        total[j].add_(loop->server[j] - params[j], static_cast<double>(ex.size()));
      examples += static_cast<double>(ex.size());
    }
    for (size_t j = 0; j < total.size(); ++j) loop->server[j].sub_(total[j] / examples);
  };
}

}  // namespace fax::cli
