#include <torch/csrc/autograd/autograd.h>

#include "helpers.h"

namespace fax {
namespace {

using test::bytes_of;

// Several FedAvg rounds of a two-layer tanh network in float32: client data drawn from each
// client's own stream, local SGD on minibatches sampled from it, a weighted mean of deltas, a
// server step. Returns the final parameters and the per-round losses, flattened.
at::Tensor fedavg_trace(Mesh& mesh, int rounds) {
  const Cohort cohort({3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43}, {5, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9});
  TensorTree params{{"w1", at::randn({8, 16}, client_generator(0, -1, 0)) * 0.3},
                    {"w2", at::randn({16, 1}, client_generator(0, -1, 1)) * 0.3}};
  std::vector<at::Tensor> trace;
  for (int round = 0; round < rounds; ++round) {
    const auto out = mesh.run(cohort, [&](Program& p) {
      const auto data = p.clients_from([&](int64_t id, int64_t) {
        return at::randn({32, 9}, client_generator(7, round, id));
      });
      const auto server = broadcast(Server<TensorTree>(params));
      const auto updated = map_clients([](const ClientChunk& c, const TensorTree& start, const at::Tensor& d) {
        TensorTree theta = clone(detach(start));
        requires_grad_(theta);
        for (int step = 0; step < 4; ++step) {
          std::vector<at::Tensor> batches;
          for (int64_t i = 0; i < c.size; ++i) {
            batches.push_back(d[i].index_select(0, at::randint(0, 32, {8}, c.generator(i))));
          }
          const at::Tensor batch = at::stack(batches);  // [k, 8, 9]
          const at::Tensor x = batch.narrow(2, 0, 8);
          const at::Tensor target = batch.narrow(2, 8, 1);
          const at::Tensor pred = at::bmm(at::tanh(at::bmm(x, theta.at("w1"))), theta.at("w2"));
          const at::Tensor loss = (pred - target).pow(2).mean({1, 2}).sum();
          const auto g = torch::autograd::grad({loss}, theta.tensors());
          theta = detach(axpy(-0.1, theta.with_tensors(g), theta));
          requires_grad_(theta);
        }
        return detach(theta);
      }, server, data);
      const auto deltas = map_clients([](const TensorTree& a, const TensorTree& b) { return sub(a, b); }, server, updated);
      const TensorTree avg = weighted_mean(deltas, p.weights()).value();
      const at::Tensor spread = mean(map_clients([](const TensorTree& d) {
        return at::cat({d.at("w1").flatten(1), d.at("w2").flatten(1)}, 1).pow(2).sum(1);
      }, deltas)).value().unsqueeze(0);
      return Server<TensorTree>({{"params", flatten(sub(params, avg))}, {"spread", spread}});
    }, {7, round}).value();
    params = unflatten(out.at("params"), params);
    trace.push_back(out.at("spread"));
  }
  trace.push_back(flatten(params));
  return at::cat(trace);
}

TEST(Determinism, BitIdenticalForAnyExecutorCountAtFixedLogicalShards) {
  for (int64_t vectorize : {0, 2}) {
    Mesh one({1, 4, 1, vectorize});
    const auto reference = bytes_of(fedavg_trace(one, 3));
    for (int executors : {2, 3, 4}) {
      Mesh mesh({executors, 4, 1, vectorize});
      EXPECT_EQ(bytes_of(fedavg_trace(mesh, 3)), reference)
          << executors << " executors differ from 1 (vectorize " << vectorize << ")";
    }
  }
}

TEST(Determinism, EveryExecutorHoldsTheSameServerBits) {
  Mesh mesh({4, 4});
  const at::Tensor data = at::randn({9, 1000});
  const auto replicas = mesh.run_replicas(Cohort::range(9), [&](Program& p) {
    const at::Tensor x = at::randn({1000}).requires_grad_(true);
    const auto scaled = map_clients([](const at::Tensor& a, const at::Tensor& d) { return at::sin(a * d); },
                                    broadcast(Server<at::Tensor>(x)), p.local_rows(data));
    const at::Tensor m = mean(scaled).value();
    const at::Tensor g = torch::autograd::grad({m.pow(2).sum()}, {x})[0];
    return Server<at::Tensor>(at::cat({m, g}));
  });
  for (const auto& r : replicas) EXPECT_EQ(bytes_of(r.value()), bytes_of(replicas.front().value()));
}

// fax's own reductions (the primitives' sums) do not depend on the intra-op thread count; the
// client function's kernels may, which is why threads_per_executor is part of the run's key.
TEST(Determinism, PrimitiveReductionsDoNotDependOnThreadCount) {
  const at::Tensor data = at::randn({6, 200003});
  auto reduce = [&](int threads) {
    Mesh mesh({2, 3, threads});
    return mesh.run(Cohort::range(6), [&](Program& p) {
      return Server<at::Tensor>(at::cat({sum(p.local_rows(data)).value(),
                                         weighted_mean(p.local_rows(data), p.weights()).value()}));
    }).value();
  };
  EXPECT_EQ(bytes_of(reduce(1)), bytes_of(reduce(2)));
}

}  // namespace
}  // namespace fax
