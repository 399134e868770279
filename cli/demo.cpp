// fax-demo: what `make demo` runs until fax-run exists. A small federated program built on core:
// FedAvg on a synthetic federated regression task over a mesh of executor threads, the FAX
// tutorial values, and a check that the result does not depend on the number of executors.

#include <chrono>
#include <cstdio>
#include <exception>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <fax/fax.h>

namespace {

constexpr int64_t kPopulation = 64;
constexpr int64_t kCohort = 16;
constexpr int64_t kExamples = 32;
constexpr int64_t kDim = 10;
constexpr int kRounds = 20;
constexpr int kLocalSteps = 5;
constexpr double kClientLr = 0.05;
constexpr uint64_t kSeed = 2024;

// Client c's data: x ~ N(0, I), y = x . (w* + shift_c) + noise, all drawn from the client's own
// stream so any executor builds the same data.
at::Tensor client_data(int64_t client) {
  at::Generator g = fax::client_generator(kSeed, -1, client);
  const at::Tensor w_star = at::linspace(-1.0, 1.0, kDim);
  const at::Tensor w = w_star + 0.3 * at::randn({kDim}, g);
  const at::Tensor x = at::randn({kExamples, kDim}, g);
  const at::Tensor y = at::mv(x, w) + 0.1 * at::randn({kExamples}, g);
  return at::cat({x, y.unsqueeze(1)}, 1);  // [examples, dim + 1]
}

// Mean squared error of each client of a chunk: params [k, dim], data [k, examples, dim + 1].
at::Tensor client_losses(const at::Tensor& params, const at::Tensor& data) {
  const at::Tensor x = data.narrow(2, 0, kDim);
  const at::Tensor y = data.narrow(2, kDim, 1);
  return (at::bmm(x, params.unsqueeze(2)) - y).pow(2).mean({1, 2});
}

// A few local gradient steps for a chunk of clients at once.
at::Tensor local_update(const at::Tensor& start, const at::Tensor& data) {
  at::Tensor p = start.detach().requires_grad_(true);
  for (int s = 0; s < kLocalSteps; ++s) {
    const at::Tensor g = torch::autograd::grad({client_losses(p, data).sum()}, {p})[0];
    p = (p - kClientLr * g).detach().requires_grad_(true);
  }
  return p.detach();
}

fax::Cohort sample_cohort(int round) {
  const at::Tensor ids = at::randperm(kPopulation, fax::server_generator(kSeed, round), at::kLong).narrow(0, 0, kCohort);
  return fax::Cohort(std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + kCohort));
}

// One FedAvg round: broadcast, local updates, weighted mean of deltas, server step.
// Returns {new params, mean training loss before the round}.
fax::Server<fax::TensorTree> fedavg_round(fax::Program& p, const at::Tensor& params) {
  const auto data = p.clients_from([](int64_t id, int64_t) { return client_data(id); });
  const auto start = fax::broadcast(fax::Server<at::Tensor>(params));
  const auto loss = fax::mean(fax::map_clients(client_losses, start, data));
  const auto updated = fax::map_clients(local_update, start, data);
  const auto delta = fax::map_clients([](const at::Tensor& a, const at::Tensor& b) { return a - b; }, start, updated);
  const at::Tensor next = params - fax::weighted_mean(delta, p.weights()).value();
  return fax::Server<fax::TensorTree>({{"params", next}, {"loss", loss.value()}});
}

at::Tensor train(fax::Mesh& mesh, bool verbose) {
  at::Tensor params = at::zeros({kDim});
  const at::Tensor w_star = at::linspace(-1.0, 1.0, kDim);
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < kRounds; ++round) {
    const auto out = mesh.run(sample_cohort(round), [&](fax::Program& p) { return fedavg_round(p, params); },
                              {kSeed, round});
    params = out.value().at("params");
    if (verbose && (round % 4 == 0 || round == kRounds - 1)) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("round %2d/%d  train loss %.4f  |w - w*| %.4f  %.2fs\n", round + 1, kRounds,
                  out.value().at("loss").item<double>(), (params - w_star).norm().item<double>(), elapsed);
    }
  }
  return params;
}

void tutorial() {
  fax::Mesh mesh({3, 3});
  const at::Tensor out = mesh.run(fax::Cohort::range(3), [](fax::Program&) {
    const at::Tensor x = at::scalar_tensor(2.0, at::kDouble).requires_grad_(true);
    const at::Tensor total = fax::sum(fax::broadcast(fax::Server<at::Tensor>(x))).value();
    return fax::Server<at::Tensor>(at::stack({total, torch::autograd::grad({total}, {x})[0]}));
  }).value();
  std::printf("FAX tutorial: sum(broadcast(2.0)) over 3 clients = %g, derivative %g\n", out[0].item<double>(),
              out[1].item<double>());
}

}  // namespace

int main() {
  try {
    std::printf("fax %s demo: FedAvg on a synthetic federated regression task\n", fax::version());
    std::printf("population %lld clients (%lld examples, %lld features each), cohort %lld per round, "
                "%d local steps\n",
                static_cast<long long>(kPopulation), static_cast<long long>(kExamples),
                static_cast<long long>(kDim), static_cast<long long>(kCohort), kLocalSteps);
    fax::Mesh two({2, 4});
    std::printf("mesh: 2 executors x 1 thread, 4 logical shards\n");
    const at::Tensor on_two = train(two, true);
    fax::Mesh one({1, 4});
    const at::Tensor on_one = train(one, false);
    std::printf("same run on 1 executor: final parameters bit-identical: %s\n",
                fax::bitwise_equal(on_one, on_two) ? "yes" : "NO");
    tutorial();
    return fax::bitwise_equal(on_one, on_two) ? 0 : 1;
  } catch (const fax::Error& e) {
    std::fprintf(stderr, "fax-demo: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fax-demo: internal error: %s\n", e.what());
    return 1;
  }
}
