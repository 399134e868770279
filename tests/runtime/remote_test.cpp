// Remote executors in one process: a Coordinator on loopback and workers on threads, each serving
// a test program. Results must have the bits of the same program on local executors. The suite
// Communicators runs once per backend (local threads, TensorPipe, Gloo); RemoteCollectives once
// per backend of the remote workers' allreduce (through the coordinator, and Gloo).

#include <mutex>
#include <thread>

#include <torch/csrc/autograd/autograd.h>

#include <fax/runtime/coordinator.h>
#include <fax/runtime/worker.h>

#include "helpers.h"

namespace fax {
namespace {

using test::error_of;

constexpr const char* kToken = "remote-test-token";

// A program exercising every collective, forward and backward: per-client rows keyed by
// (seed, round, client), their sum and mean, every row (allgather), and the gradient of
// sum(broadcast(w) * x) in w (broadcast's backward is an allreduce).
TensorTree exercise(Program& p, const TensorTree& input) {
  const at::Tensor scale = input.at("scale");
  const Clients<at::Tensor> x = p.clients_from([&](int64_t, int64_t position) {
    return at::randn({5}, p.client_generator(position), at::kDouble) * scale;
  });
  const at::Tensor w = at::ones({5}, at::kDouble).requires_grad_(true);
  const Server<at::Tensor> loss(sum(Clients<at::Tensor>(broadcast(Server<at::Tensor>(w)).value() * x.value())).value().sum());
  const at::Tensor grad = torch::autograd::grad({loss.value()}, {w})[0];
  return TensorTree{{"sum", sum(x).value()}, {"mean", mean(x).value()}, {"all", collect(x).value()}, {"grad", grad}};
}

// A coordinator with `n` workers on threads, all serving `fn`.
class Workers {
 public:
  Workers(int n, TaskFn fn, Collectives collectives = Collectives::tensorpipe, double timeout_s = 30) {
    CoordinatorOptions o;
    o.collectives = collectives;
    o.workers = n;
    o.token = kToken;
    o.timeout_s = timeout_s;
    o.heartbeat_s = std::min(1.0, timeout_s / 4);
    coordinator_ = std::make_unique<Coordinator>(o);
    errors_.resize(n);
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this, i, fn] {
        WorkerOptions w;
        w.connect = coordinator_->address();
        w.token = kToken;
        w.name = "w" + std::to_string(i);
        try {
          run_worker(w, [fn](const std::string&) {
            WorkerSetup ws;
            ws.run = fn;
            return ws;
          });
        } catch (const std::exception& e) {
          errors_[i] = e.what();
        }
      });
    }
    coordinator_->wait_for_workers();
  }

  ~Workers() {
    coordinator_.reset();  // says goodbye: the workers return
    for (auto& t : threads_) t.join();
    for (const auto& e : errors_) EXPECT_EQ(e, "");
  }

  Coordinator& coordinator() { return *coordinator_; }

 private:
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<std::thread> threads_;
  std::vector<std::string> errors_;
};

TaskFn exercise_fn() {
  return [](Program& p, TaskKind, const TensorTree& input) { return exercise(p, input); };
}

void expect_same_bits(const TensorTree& a, const TensorTree& b) {
  ASSERT_EQ(a.names(), b.names());
  for (const auto& [name, t] : a) {
    const at::Tensor& u = b.at(name);
    ASSERT_EQ(t.sizes(), u.sizes()) << name;
    ASSERT_EQ(t.scalar_type(), u.scalar_type()) << name;
    if (t.numel() == 0) continue;  // an empty tensor may have no memory to compare
    EXPECT_EQ(std::memcmp(t.contiguous().data_ptr(), u.contiguous().data_ptr(), t.nbytes()), 0) << name;
  }
}

// The communicator contract, one suite instantiated per backend: local executor threads, remote
// workers reducing through the coordinator (TensorPipe), and remote workers reducing over Gloo.
// Every collective, forward and backward, must give each executor the bits of one local executor.
enum class Backend { local, tensorpipe, gloo };

// Every executor's result of `program` on `executors` executors of `backend`.
std::vector<TensorTree> run_on(Backend backend, int executors, const Cohort& cohort, int64_t logical_shards,
                               RoundInfo info, const std::function<TensorTree(Program&)>& program) {
  if (backend == Backend::local) {
    Mesh mesh(MeshOptions{executors, logical_shards});
    std::vector<TensorTree> out(executors);
    std::mutex mutex;
    mesh.run(cohort, [&](Program& p) {
      TensorTree result = program(p);
      std::lock_guard<std::mutex> lock(mutex);
      out[p.executor()] = result;
      return Server<TensorTree>(result);
    }, info);
    return out;
  }
  Workers workers(executors, [program](Program& p, TaskKind, const TensorTree&) { return program(p); },
                  backend == Backend::gloo ? Collectives::gloo : Collectives::tensorpipe);
  return workers.coordinator().run(TaskKind::round, info, cohort, logical_shards,
                                   [](int, const ShardLayout&) { return TensorTree{}; });
}

class Communicators : public ::testing::TestWithParam<Backend> {};

INSTANTIATE_TEST_SUITE_P(Backends, Communicators, ::testing::Values(Backend::local, Backend::tensorpipe, Backend::gloo),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return std::string(info.param == Backend::local        ? "Local"
                                              : info.param == Backend::tensorpipe ? "TensorPipe"
                                                                                  : "Gloo");
                         });

TEST_P(Communicators, EveryCollectiveHasTheBitsOfOneLocalExecutor) {
  const Cohort cohort({11, 3, 42, 7, 19, 23, 5}, {1, 2, 3, 4, 5, 6, 7});
  const TensorTree input{{"scale", at::tensor(1.5, at::kDouble)}};
  const RoundInfo info{7, 2};
  const auto program = [&](Program& p) { return exercise(p, input); };
  Mesh mesh(MeshOptions{1, 3});
  const TensorTree local = mesh.run(cohort, [&](Program& p) { return Server<TensorTree>(program(p)); }, info).value();
  for (int n : {2, 3}) {
    const auto results = run_on(GetParam(), n, cohort, 3, info, program);
    ASSERT_EQ(results.size(), static_cast<size_t>(n));
    for (const auto& result : results) expect_same_bits(local, result);
  }
}

// Values of several dtypes and sizes in one allreduce, including an empty one and sizes that do
// not divide by the executor count (Gloo pads the slices each executor owns).
TEST_P(Communicators, AllreduceOfMixedValuesHasTheBitsOfOneLocalExecutor) {
  const auto program = [](Program& p) {
    std::vector<ShardPartial> partials;
    const Range shards = p.local_shards();
    for (int64_t s = shards.begin; s < shards.end; ++s) {
      at::Generator g = p.client_generator(s);
      partials.push_back({s,
                          {at::randn({7}, g, at::kFloat), at::randint(1000, {3}, g, at::kLong),
                           at::empty({0}, at::kDouble), at::randn({2, 3}, g, at::kFloat) * 1e-3,
                           at::randn({1}, g, at::kDouble)}});
    }
    const std::vector<at::Tensor> sums = p.communicator().allreduce_sum(partials);
    TensorTree out;
    for (size_t j = 0; j < sums.size(); ++j) out.set("v" + std::to_string(j), sums[j]);
    return out;
  };
  const Cohort cohort = Cohort::range(9);
  Mesh mesh(MeshOptions{1, 5});
  const TensorTree local = mesh.run(cohort, [&](Program& p) { return Server<TensorTree>(program(p)); }, {}).value();
  for (int n : {2, 3}) {
    for (const auto& result : run_on(GetParam(), n, cohort, 5, {}, program)) expect_same_bits(local, result);
  }
}

// What only remote workers do, per backend of their allreduce.
class RemoteCollectives : public ::testing::TestWithParam<Collectives> {};

INSTANTIATE_TEST_SUITE_P(Backends, RemoteCollectives, ::testing::Values(Collectives::tensorpipe, Collectives::gloo),
                         [](const ::testing::TestParamInfo<Collectives>& info) {
                           return std::string(info.param == Collectives::gloo ? "Gloo" : "TensorPipe");
                         });

TEST_P(RemoteCollectives, ExtraWorkersAreSpares) {
  Workers workers(3, exercise_fn(), GetParam());
  const auto replies = workers.coordinator().run(TaskKind::round, {}, Cohort::range(4), 2, [](int, const ShardLayout&) {
    return TensorTree{{"scale", at::tensor(1.0, at::kDouble)}};
  });
  EXPECT_EQ(replies.size(), 2u);
}

TEST_P(RemoteCollectives, TaskKindsBeyondTheExperimentsReachTheTaskFn) {
  // fax-run bench's allreduce probe is such a kind: the worker runs whatever its TaskFn does for it.
  constexpr auto kProbe = static_cast<TaskKind>(100);
  Workers workers(
      2,
      [](Program& p, TaskKind kind, const TensorTree& input) -> TensorTree {
        if (kind != kProbe) throw Error("not the probe");
        std::vector<ShardPartial> partials;
        for (int64_t s = p.local_shards().begin; s < p.local_shards().end; ++s)
          partials.push_back({s, {at::full({input.at("elements").item<int64_t>()}, static_cast<double>(s + 1))}});
        return TensorTree{{"sum", p.communicator().allreduce_sum(partials).at(0)}};
      },
      GetParam());
  const TensorTree input{{"elements", at::tensor(int64_t{1000})}};
  const auto replies = workers.coordinator().run(kProbe, {}, Cohort::range(3), 3, [&](int, const ShardLayout&) { return input; });
  ASSERT_EQ(replies.size(), 2u);
  for (const auto& reply : replies) EXPECT_TRUE(at::equal(reply.at("sum"), at::full({1000}, 6.0)));
}

TEST_P(RemoteCollectives, ProgramErrorNamesWorkerAndRoundAndTheNextTaskRuns) {
  Workers workers(
      2,
      [](Program& p, TaskKind, const TensorTree& input) {
        if (p.executor() == 1 && input.at("fail").item<int64_t>() != 0) throw Error("client 3 diverged");
        return exercise(p, input);
      },
      GetParam());
  auto input = [](bool fail) {
    return [fail](int, const ShardLayout&) {
      return TensorTree{{"scale", at::tensor(1.0, at::kDouble)}, {"fail", at::tensor(static_cast<int64_t>(fail))}};
    };
  };
  EXPECT_THAT(error_of([&] { workers.coordinator().run(TaskKind::round, {0, 4}, Cohort::range(4), 2, input(true)); }),
              ::testing::ContainsRegex("worker w[01] \\(executor 1 of 2\\) failed in round 5: client 3 diverged"));
  // Executor 0 waited in an allreduce for executor 1: it leaves at once (executor 1 left the
  // group when it failed), and the next task runs in a new group.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(workers.coordinator().run(TaskKind::round, {0, 5}, Cohort::range(4), 2, input(false)).size(), 2u);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  if (GetParam() == Collectives::gloo) {
    EXPECT_EQ(workers.coordinator().gloo_generations(), 2);
  }
}

TEST_P(RemoteCollectives, DisagreeingCollectivesFail) {
  Workers workers(
      2,
      [](Program& p, TaskKind, const TensorTree&) {
        if (p.executor() == 0) {
          p.communicator().barrier();
        } else {
          p.communicator().allgather(at::zeros({1}));
        }
        return TensorTree{};
      },
      GetParam());
  EXPECT_THAT(error_of([&] {
                workers.coordinator().run(TaskKind::round, {}, Cohort::range(2), 2,
                                          [](int, const ShardLayout&) { return TensorTree{}; });
              }),
              ::testing::HasSubstr("executors disagree on collective #0: executor 0 called barrier(0) but executor 1 "
                                   "called allgather(1)"));
}

TEST_P(RemoteCollectives, AnExecutorThatReturnsWhileAnotherWaitsFailsTheTask) {
  Workers workers(
      2,
      [](Program& p, TaskKind, const TensorTree&) {
        if (p.executor() == 0) p.communicator().allreduce_sum({{0, {at::ones({3})}}});
        return TensorTree{};
      },
      GetParam());
  EXPECT_THAT(error_of([&] {
                workers.coordinator().run(TaskKind::round, {}, Cohort::range(2), 2,
                                          [](int, const ShardLayout&) { return TensorTree{}; });
              }),
              ::testing::HasSubstr("round 1: executor 1 returned while executor 0 waits in collective #0 "
                                   "(allreduce_sum)"));
  EXPECT_EQ(workers.coordinator().run(TaskKind::round, {}, Cohort::range(2), 1, [](int, const ShardLayout&) {
    return TensorTree{};
  }).size(), 1u);
}

// Gloo groups: one per set of executors, a new one when the set changes.
TEST(RemoteGloo, ANewGroupWhenTheExecutorsChange) {
  Workers workers(3, exercise_fn(), Collectives::gloo);
  const auto input = [](int, const ShardLayout&) { return TensorTree{{"scale", at::tensor(1.0, at::kDouble)}}; };
  Coordinator& c = workers.coordinator();
  c.run(TaskKind::round, {}, Cohort::range(6), 2, input);
  c.run(TaskKind::round, {}, Cohort::range(6), 2, input);
  EXPECT_EQ(c.gloo_generations(), 1);
  c.run(TaskKind::round, {}, Cohort::range(6), 3, input);
  EXPECT_EQ(c.gloo_generations(), 2);
  EXPECT_EQ(c.run(TaskKind::round, {}, Cohort::range(6), 2, input).size(), 2u);
  EXPECT_EQ(c.gloo_generations(), 3);
}

// Gloo cannot check that executors send equal sizes (a mismatch ends the process in Gloo's
// thread): the coordinator compares what each executor announces.
TEST(RemoteGloo, ExecutorsWithValuesOfOtherSizesFailTheTask) {
  Workers workers(
      2,
      [](Program& p, TaskKind, const TensorTree&) {
        const int64_t shard = p.local_shards().begin;
        p.communicator().allreduce_sum({{shard, {at::ones({2}), at::ones({shard == 0 ? 4 : 6})}}});
        return TensorTree{};
      },
      Collectives::gloo);
  EXPECT_THAT(error_of([&] {
                workers.coordinator().run(TaskKind::round, {0, 2}, Cohort::range(2), 2,
                                          [](int, const ShardLayout&) { return TensorTree{}; });
              }),
              ::testing::HasSubstr("round 3: executors disagree on collective #0 (allreduce_sum), value 1: executor 0 "
                                   "has Float 4 elements, executor 1 has Float 6 elements"));
  EXPECT_EQ(workers.coordinator().ready_workers(), 2);
}

TEST(Remote, WrongTokenIsRefused) {
  Workers workers(1, exercise_fn());
  WorkerOptions w;
  w.connect = workers.coordinator().address();
  w.token = "guess";
  EXPECT_THAT(error_of([&] { run_worker(w, [](const std::string&) { return WorkerSetup{}; }); }),
              ::testing::HasSubstr("refused this worker: wrong token"));
  EXPECT_EQ(workers.coordinator().ready_workers(), 1);
}

TEST(Remote, AWorkerThatCannotLoadTheExperimentFailsTheWait) {
  CoordinatorOptions o;
  o.token = kToken;
  o.experiment = "algorithm: {name: missing}";
  Coordinator coordinator(o);
  std::string worker_error;
  std::thread worker([&] {
    WorkerOptions w;
    w.connect = coordinator.address();
    w.token = kToken;
    w.name = "w0";
    worker_error = error_of([&] {
      run_worker(w, [](const std::string& experiment) -> WorkerSetup {
        throw Error(fmt::format("cannot load '{}'", experiment));
      });
    });
  });
  EXPECT_THAT(error_of([&] { coordinator.wait_for_workers(); }),
              ::testing::HasSubstr("worker w0 could not load the experiment: cannot load 'algorithm: {name: missing}'"));
  worker.join();
  EXPECT_THAT(worker_error, ::testing::HasSubstr("cannot load"));
}

TEST(Remote, AWorkerThatResolvedTheExperimentDifferentlyFailsTheWait) {
  CoordinatorOptions o;
  o.token = kToken;
  o.identity = "algorithm fedavg (build A)";
  Coordinator coordinator(o);
  std::thread worker([&] {
    WorkerOptions w;
    w.connect = coordinator.address();
    w.token = kToken;
    w.name = "w0";
    error_of([&] {
      run_worker(w, [](const std::string&) {
        WorkerSetup ws;
        ws.identity = "algorithm fedavg (build B)";
        return ws;
      });
    });
  });
  EXPECT_THAT(error_of([&] { coordinator.wait_for_workers(); }),
              ::testing::HasSubstr("worker w0 resolved the experiment differently: it has algorithm fedavg (build B), "
                                   "the coordinator has algorithm fedavg (build A)"));
  worker.join();
}

TEST(Remote, BadOptionsAreUserErrors) {
  CoordinatorOptions o;
  EXPECT_THAT(error_of([&] { Coordinator c(o); }), ::testing::HasSubstr("need a shared token"));
  o.token = kToken;
  o.listen = "localhost";
  EXPECT_THAT(error_of([&] { Coordinator c(o); }), ::testing::HasSubstr("'localhost' is not HOST:PORT"));
  o.listen = "127.0.0.1:99999";
  EXPECT_THAT(error_of([&] { Coordinator c(o); }), ::testing::HasSubstr("port '99999' is not a number from 0 to 65535"));
  o.listen = "192.0.2.1:0";  // TEST-NET-1: not an address of this host
  EXPECT_THAT(error_of([&] { Coordinator c(o); }), ::testing::HasSubstr("cannot listen on 192.0.2.1:0: "));
  o.listen = "127.0.0.1:0";
  const Coordinator first(o);
  o.listen = first.address();
  EXPECT_THAT(error_of([&] { Coordinator c(o); }),
              ::testing::HasSubstr("cannot listen on " + first.address() + ": Address already in use"));
}

}  // namespace
}  // namespace fax
