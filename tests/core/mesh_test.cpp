#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

#include <ATen/Parallel.h>

#include <fax/spmd/local_communicator.h>

#include "helpers.h"

namespace fax {
namespace {

using test::SeededTest;

TEST(ShardLayout, CutsContiguousNearEqualShards) {
  const ShardLayout layout(13, 4, 2);
  EXPECT_EQ(layout.shard_clients(0), (Range{0, 4}));
  EXPECT_EQ(layout.shard_clients(1), (Range{4, 7}));
  EXPECT_EQ(layout.shard_clients(2), (Range{7, 10}));
  EXPECT_EQ(layout.shard_clients(3), (Range{10, 13}));
  EXPECT_EQ(layout.executor_shards(0), (Range{0, 2}));
  EXPECT_EQ(layout.executor_shards(1), (Range{2, 4}));
  EXPECT_EQ(layout.executor_clients(1), (Range{7, 13}));
  EXPECT_EQ(layout.owner(3), 1);
}

TEST(ShardLayout, ShardsDoNotDependOnExecutors) {
  for (int e : {1, 2, 3, 4}) {
    const ShardLayout layout(29, 4, e);
    const ShardLayout reference(29, 4, 1);
    int64_t covered = 0;
    for (int r = 0; r < e; ++r) covered += layout.executor_clients(r).size();
    EXPECT_EQ(covered, 29);
    for (int64_t s = 0; s < 4; ++s) EXPECT_EQ(layout.shard_clients(s), reference.shard_clients(s));
  }
}

TEST(ShardLayout, RejectsImpossibleMeshes) {
  EXPECT_THROW(ShardLayout(10, 0, 1), Error);
  EXPECT_THROW(ShardLayout(10, 2, 3), Error);
  EXPECT_THROW(ShardLayout(-1, 1, 1), Error);
}

// A cohort smaller than the shards (Poisson sampling draws any size) leaves the last shards empty.
TEST(ShardLayout, SmallCohortsLeaveTheLastShardsEmpty) {
  const ShardLayout layout(2, 4, 3);
  EXPECT_EQ(layout.shard_clients(0), (Range{0, 1}));
  EXPECT_EQ(layout.shard_clients(1), (Range{1, 2}));
  EXPECT_EQ(layout.shard_clients(2), (Range{2, 2}));
  EXPECT_EQ(layout.shard_clients(3), (Range{2, 2}));
  EXPECT_EQ(layout.executor_clients(2), (Range{2, 2}));
  const ShardLayout none(0, 2, 2);
  EXPECT_EQ(none.executor_clients(0).size(), 0);
  EXPECT_EQ(none.executor_clients(1).size(), 0);
}

TEST(Cohort, IdsAndWeights) {
  const Cohort c({7, 3, 11}, {1.0, 2.0, 0.5});
  EXPECT_EQ(c.size(), 3);
  EXPECT_EQ(c.id(1), 3);
  EXPECT_DOUBLE_EQ(c.weight(2), 0.5);
  EXPECT_DOUBLE_EQ(Cohort::range(4).weight(3), 1.0);
  EXPECT_THROW(Cohort({1, 2}, {1.0}), Error);
  EXPECT_EQ(Cohort::range(0).size(), 0);
  EXPECT_THROW(Cohort::range(-1), Error);
}

TEST(Rng, StreamsAreKeyedBySeedRoundAndClientOnly) {
  auto draw = [](at::Generator g) { return at::randn({4}, g); };
  EXPECT_TRUE(at::equal(draw(client_generator(1, 2, 3)), draw(client_generator(1, 2, 3))));
  EXPECT_FALSE(at::equal(draw(client_generator(1, 2, 3)), draw(client_generator(1, 2, 4))));
  EXPECT_FALSE(at::equal(draw(client_generator(1, 2, 3)), draw(client_generator(1, 3, 3))));
  EXPECT_FALSE(at::equal(draw(client_generator(1, 2, 3)), draw(client_generator(2, 2, 3))));
  EXPECT_NE(server_stream_seed(5, 0), client_stream_seed(5, 0, 0));
}

TEST(Rng, ClientStreamIsTheSameOnAnyExecutor) {
  const Cohort cohort({40, 41, 42, 43, 44, 45});
  auto draws = [&](int executors) {
    Mesh mesh({executors, 6});
    return mesh.run(cohort, [](Program& p) {
      const auto r = map_clients(
          [](const ClientChunk& c, const at::Tensor& rows) {
            std::vector<at::Tensor> out;
            for (int64_t i = 0; i < c.size; ++i) out.push_back(at::randn({3}, c.generator(i)));
            return at::stack(out) + rows;
          },
          p.local_rows(at::zeros({6, 3})));
      return collect(r);
    }, {9, 4}).value();
  };
  const at::Tensor one = draws(1);
  EXPECT_TRUE(at::equal(one, draws(3)));
  EXPECT_TRUE(at::equal(one[2], at::randn({3}, client_generator(9, 4, 42))));
}

// Runs fn(rank, communicator) on one thread per rank of a LocalGroup.
void on_ranks(LocalGroup& group, const std::function<void(int, Communicator&)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r) threads.emplace_back([&, r] { fn(r, group.communicator(r)); });
  for (auto& t : threads) t.join();
}

TEST(LocalCommunicator, AllreduceSumsInShardOrder) {
  // Float32 sums whose value depends on the order: only ((p0 + p1) + p2) + p3 gives `expected`.
  const std::vector<float> p = {1e8f, 1.0f, -1e8f, 1.0f};
  const float expected = ((p[0] + p[1]) + p[2]) + p[3];
  ASSERT_NE(expected, ((p[0] + p[2]) + p[1]) + p[3]);
  for (int ranks : {1, 2, 4}) {
    LocalGroup group(ranks);
    std::vector<at::Tensor> results(ranks);
    on_ranks(group, [&](int rank, Communicator& comm) {
      std::vector<ShardPartial> mine;
      const ShardLayout layout(4, 4, ranks);
      for (int64_t s = layout.executor_shards(rank).begin; s < layout.executor_shards(rank).end; ++s) {
        // The large vector takes the split path of the reduction, the scalar the single-rank path.
        mine.push_back({s, {at::full({1}, p[s]), at::full({40000}, p[s])}});
      }
      results[rank] = at::cat(comm.allreduce_sum(mine));
    });
    for (const auto& r : results) {
      EXPECT_TRUE(at::equal(r, at::full({40001}, expected))) << ranks << " ranks";
    }
  }
}

TEST(LocalCommunicator, BroadcastAllgatherBarrier) {
  LocalGroup group(3);
  std::atomic<int> arrived{0};
  std::vector<std::vector<at::Tensor>> got(3);
  on_ranks(group, [&](int rank, Communicator& comm) {
    auto b = comm.broadcast({at::full({2}, static_cast<double>(rank))}, 1);
    auto g = comm.allgather(at::full({1}, static_cast<double>(10 * rank)));
    ++arrived;
    comm.barrier();
    EXPECT_EQ(arrived.load(), 3);
    got[rank] = {b[0], at::cat(g)};
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(at::equal(got[r][0], at::full({2}, 1.0)));
    EXPECT_TRUE(at::equal(got[r][1], at::tensor({0.0, 10.0, 20.0})));
  }
}

TEST(LocalCommunicator, DisagreeingCollectivesFailInsteadOfHanging) {
  LocalGroup group(2);
  std::atomic<int> failures{0};
  on_ranks(group, [&](int rank, Communicator& comm) {
    try {
      if (rank == 0) comm.barrier();
      else comm.allgather(at::zeros({1}));
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("same collectives"), std::string::npos) << e.what();
      ++failures;
    }
  });
  EXPECT_EQ(failures.load(), 2);
}

TEST(Mesh, PrimitivesOutsideAProgramAreAnError) {
  EXPECT_THROW(sum(Clients<at::Tensor>(at::zeros({2}))), Error);
  EXPECT_FALSE(Program::active());
}

TEST(Mesh, ValidatesOptionsAndCohort) {
  EXPECT_THROW(Mesh({0}), Error);
  EXPECT_THROW(Mesh({4, 2}), Error);
  EXPECT_THROW(Mesh({1, 1, 0}), Error);
  // An executor without clients cannot make rows from nothing: clients_from says so.
  Mesh mesh({2, 4});
  try {
    mesh.run(Cohort::range(1), [](Program& p) {
      return collect(p.clients_from([](int64_t, int64_t) { return at::zeros({1}); }));
    });
    FAIL() << "expected fax::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("executor 1 holds no clients"), std::string::npos) << e.what();
  }
}

// Executors flush subnormal results to zero unless told not to: a quarter of the smallest normal
// float is 2^-128, subnormal. With 2 intra-op threads the product (2 x 65536 elements a chunk)
// is split between them: the second thread has the executor's mode too.
TEST(Mesh, FlushesSubnormalsToZeroOnItsExecutors) {
  const float tiny = std::numeric_limits<float>::min();
  for (const int threads : {1, 2}) {
    for (const bool flush : {true, false}) {
      MeshOptions options{2, 2, threads};
      options.flush_denormals = flush;
      Mesh mesh(options);
      const at::Tensor out = mesh.run(Cohort::range(4), [&](Program& p) {
        return collect(map_clients([](const ClientChunk&, const at::Tensor& rows) { return rows * 0.25f; },
                                   p.local_rows(at::full({4, 65536}, tiny))));
      }).value();
      const float expected = flush ? 0.0f : std::ldexp(1.0f, -128);
      EXPECT_TRUE(out.eq(expected).all().item<bool>()) << threads << " threads, flush " << flush;
    }
  }
  // The caller's own thread keeps its mode.
  EXPECT_NE((at::full({1}, tiny) * 0.25f).item<float>(), 0.0f);
}

TEST(Mesh, AFailingExecutorReleasesTheOthers) {
  Mesh mesh({3, 3});
  const Cohort cohort = Cohort::range(6);
  try {
    mesh.run(cohort, [](Program& p) {
      FAX_CHECK(p.executor() != 1, "client data missing on executor {}", p.executor());
      return sum(p.local_rows(at::ones({6, 2})));
    });
    FAIL() << "expected fax::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "client data missing on executor 1");
  }
  // The mesh is usable again afterwards.
  const at::Tensor s = mesh.run(cohort, [](Program& p) { return sum(p.local_rows(at::ones({6, 2}))); }).value();
  EXPECT_TRUE(at::equal(s, at::full({2}, 6.0f)));
}

TEST(Mesh, NonSpmdProgramsFailInsteadOfHanging) {
  Mesh mesh({2, 2});
  EXPECT_THROW(mesh.run(Cohort::range(4), [](Program& p) {
    Server<at::Tensor> s(at::zeros({1}));
    if (p.executor() == 0) s = sum(p.local_rows(at::ones({4, 1})));
    return s;
  }), Error);
}

TEST(Mesh, NestedRunIsAnError) {
  Mesh outer({1});
  Mesh inner({1});
  EXPECT_THROW(outer.run(Cohort::range(1), [&](Program&) {
    return inner.run(Cohort::range(1), [](Program&) { return Server<at::Tensor>(at::zeros({1})); });
  }), Error);
}

TEST(Mesh, ProgramSeesItsClients) {
  Mesh mesh({2, 3});
  const Cohort cohort({5, 6, 7, 8, 9}, {1, 2, 3, 4, 5});
  const auto replicas = mesh.run_replicas(cohort, [](Program& p) {
    EXPECT_EQ(p.cohort_size(), 5);
    const Clients<at::Tensor> ids = p.clients_from([](int64_t id, int64_t pos) {
      return at::tensor({static_cast<double>(id), static_cast<double>(pos)});
    });
    const at::Tensor w = p.weights(at::kDouble).value();
    return Server<at::Tensor>(at::cat({collect(ids).value().flatten(), collect(Clients<at::Tensor>(w)).value()}));
  });
  ASSERT_EQ(replicas.size(), 2u);
  const at::Tensor expected = at::tensor({5., 0., 6., 1., 7., 2., 8., 3., 9., 4., 1., 2., 3., 4., 5.});
  for (const auto& r : replicas) EXPECT_TRUE(at::equal(r.value(), expected)) << r.value();
}

TEST(Mesh, ExecutorsHaveTheirOwnThreadBudget) {
  Mesh mesh({2, 2, 1});
  const auto threads = mesh.run_replicas(Cohort::range(2), [](Program&) {
    return Server<at::Tensor>(at::tensor({static_cast<int64_t>(at::get_num_threads())}));
  });
  for (const auto& t : threads) EXPECT_EQ(t.value().item<int64_t>(), 1);
}

}  // namespace
}  // namespace fax
