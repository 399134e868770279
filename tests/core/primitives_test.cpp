#include <atomic>
#include <cmath>

#include <torch/csrc/autograd/autograd.h>

#include "helpers.h"

namespace fax {
namespace {

using test::Place;
using test::SeededTest;

// The mesh configurations every primitive is checked on: one executor, and shards split over two.
struct MeshCase {
  int executors;
  int64_t shards;
};

class PrimitivesTest : public SeededTest, public ::testing::WithParamInterface<MeshCase> {
 protected:
  Mesh mesh{{GetParam().executors, GetParam().shards}};
  Cohort cohort = Cohort::range(5);
  at::TensorOptions f64 = at::TensorOptions().dtype(at::kDouble);
};

INSTANTIATE_TEST_SUITE_P(Meshes, PrimitivesTest, ::testing::Values(MeshCase{1, 1}, MeshCase{2, 3}, MeshCase{3, 5}),
                         [](const auto& info) {
                           return "E" + std::to_string(info.param.executors) + "_L" + std::to_string(info.param.shards);
                         });

// FAX tutorial: broadcast 2.0 to 3 clients, sum: 6.0, derivative 3.0; mean: 2.0, derivative 1.0.
TEST_P(PrimitivesTest, FaxTutorialValues) {
  // A 3-client cohort fills at most 3 logical shards.
  Mesh small({std::min(GetParam().executors, 3), std::min<int64_t>(GetParam().shards, 3)});
  const auto out = small.run(Cohort::range(3), [](Program&) {
    const at::Tensor x = at::scalar_tensor(2.0, at::kDouble).requires_grad_(true);
    const at::Tensor s = sum(broadcast(Server<at::Tensor>(x))).value();
    const at::Tensor ds = torch::autograd::grad({s}, {x})[0];
    const at::Tensor m = mean(broadcast(Server<at::Tensor>(x))).value();
    const at::Tensor dm = torch::autograd::grad({m}, {x})[0];
    return Server<at::Tensor>(at::stack({s, ds, m, dm}));
  }).value();
  EXPECT_DOUBLE_EQ(out[0].item<double>(), 6.0);
  EXPECT_DOUBLE_EQ(out[1].item<double>(), 3.0);
  EXPECT_DOUBLE_EQ(out[2].item<double>(), 2.0);
  EXPECT_DOUBLE_EQ(out[3].item<double>(), 1.0);
}

TEST_P(PrimitivesTest, BroadcastIsAViewWithOneRowPerClient) {
  const auto rows = mesh.run_replicas(cohort, [](Program& p) {
    const at::Tensor x = at::arange(3, at::kDouble);
    const at::Tensor b = broadcast(Server<at::Tensor>(x)).value();
    EXPECT_EQ(b.size(0), p.local_size());
    EXPECT_EQ(b.data_ptr(), x.data_ptr()) << "broadcast copied the server value";
    return Server<at::Tensor>(collect(Clients<at::Tensor>(b)).value());
  });
  for (const auto& r : rows) EXPECT_TRUE(at::equal(r.value(), at::arange(3, at::kDouble).expand({5, 3})));
}

TEST_P(PrimitivesTest, SumMeanWeightedMeanValues) {
  const at::Tensor data = at::randn({5, 2, 3}, f64);
  const at::Tensor w = at::rand({5}, f64) + 0.5;
  const auto out = mesh.run(cohort, [&](Program& p) {
    const auto x = p.local_rows(data);
    const auto wl = p.local_rows(w);
    return Server<at::Tensor>(at::stack({sum(x).value(), mean(x).value(), weighted_mean(x, wl).value()}));
  }).value();
  EXPECT_TRUE(at::allclose(out[0], data.sum(0)));
  EXPECT_TRUE(at::allclose(out[1], data.mean(0)));
  EXPECT_TRUE(at::allclose(out[2], (data * w.view({5, 1, 1})).sum(0) / w.sum()));
}

TEST_P(PrimitivesTest, TreeVersionsMatchTensorVersions) {
  const TensorTree data{{"a", at::randn({5, 3}, f64)}, {"b", at::randn({5, 2, 2}, f64)}};
  const at::Tensor w = at::rand({5}, f64) + 0.1;
  const auto out = mesh.run(cohort, [&](Program& p) {
    const auto x = p.local_rows(data);
    const auto wl = p.local_rows(w);
    const TensorTree wm = weighted_mean(x, wl).value();
    const TensorTree m = mean(x).value();
    const TensorTree s = sum(x).value();
    const TensorTree back = sum(broadcast(Server<TensorTree>(m))).value();
    // Results of the tree primitives against the tensor primitives on each leaf.
    for (const auto& name : {"a", "b"}) {
      const auto leaf = p.local_rows(data.at(name));
      EXPECT_TRUE(bitwise_equal(s.at(name), sum(leaf).value()));
      EXPECT_TRUE(bitwise_equal(wm.at(name), weighted_mean(leaf, wl).value()));
    }
    return Server<TensorTree>(TensorTree{{"wm", flatten(wm)}, {"back", flatten(back)}, {"m", flatten(m)}});
  }).value();
  EXPECT_TRUE(at::allclose(out.at("back"), 5.0 * out.at("m")));
  const at::Tensor wa = (data.at("a") * w.view({5, 1})).sum(0) / w.sum();
  EXPECT_TRUE(at::allclose(out.at("wm").narrow(0, 0, 3), wa));
}

TEST_P(PrimitivesTest, MapClientsChunksAlongShards) {
  for (int64_t k : {0, 1, 2}) {
    const auto out = mesh.run(cohort, [&](Program& p) {
      const auto x = p.local_rows(at::arange(5, at::kDouble).view({5, 1}));
      const auto y = map_clients(MapOptions{k}, [&](const ClientChunk& c, const at::Tensor& rows) {
        EXPECT_LE(c.size, k > 0 ? k : c.size);
        const Range shard = p.shard_rows(c.shard);
        EXPECT_GE(c.begin, shard.begin);
        EXPECT_LE(c.begin + c.size, shard.end) << "a chunk crossed a logical shard";
        EXPECT_EQ(c.client_id(0), c.position(0));
        return rows * 10 + static_cast<double>(c.size);
      }, x);
      return collect(y);
    }).value();
    EXPECT_TRUE(at::equal(out.select(1, 0).div(10).floor(), at::arange(5, at::kDouble))) << out;
  }
}

// The fused form streams each chunk into its shard's sum; its bits must be those of sum(map).
TEST_P(PrimitivesTest, MapSumClientsEqualsSumOfMapBitwise) {
  const at::Tensor data = at::randn({5, 7}, at::kFloat);
  auto per_client = [](const at::Tensor& rows) { return at::tanh(rows) * 3.7f + rows.pow(2); };
  const at::Tensor unfused = mesh.run(cohort, [&](Program& p) {
    return sum(map_clients(per_client, p.local_rows(data)));
  }).value();
  for (int64_t k : {0, 1, 2, 4}) {
    const TensorTree out = mesh.run(cohort, [&](Program& p) {
      const MappedSum mapped = map_sum_clients(MapOptions{k}, [&](const ClientChunk& c, const at::Tensor& rows) {
        TensorTree keep, total;
        keep.set("id", at::arange(c.size, at::kLong) + c.client_id(0));
        total.set("y", per_client(rows));
        return ChunkRows{keep, total, {}, {}, {}};
      }, p.local_rows(data));
      TensorTree result = mapped.sum.value();
      result.set("ids", collect(Clients<at::Tensor>(mapped.keep.value().at("id"))).value());
      return Server<TensorTree>(result);
    }).value();
    EXPECT_EQ(test::bytes_of(out.at("y")), test::bytes_of(unfused)) << "vectorize " << k;
    EXPECT_TRUE(at::equal(out.at("ids"), at::arange(5, at::kLong))) << out.at("ids");
  }
}

// Rows weighted as they join the running sum (ChunkRows::weighted) have the bits of rows weighted
// first (scale_rows) for every chunk size; through a graph too, derivatives included.
TEST_P(PrimitivesTest, MapSumClientsWeightsRowsAsTheyJoin) {
  const at::Tensor data = at::randn({5, 7}, at::kFloat), weights = at::rand({5}, at::kDouble) * 3.0;
  // The sum, or with `graph` each client's derivative of the sum's total (one row per client).
  const auto summed = [&](int64_t k, bool as_they_join, bool graph) {
    const at::Tensor x = graph ? data.to(at::kDouble).requires_grad_() : data;
    return mesh.run(cohort, [&](Program& p) {
      const Clients<at::Tensor> rows = p.local_rows(x);
      const at::Tensor y = map_sum_clients(MapOptions{k}, [&](const at::Tensor& r, const at::Tensor& w) {
        ChunkRows chunk;
        const TensorTree f{{"y", at::tanh(r) * 3.7 + r.pow(2)}};
        if (as_they_join) {
          chunk.weighted = f;
          chunk.weights = w;
        } else {
          chunk.sum = scale_rows(f, w);
        }
        return chunk;
      }, rows, p.local_rows(weights)).sum.value().at("y");
      if (!graph) return Server<at::Tensor>(y);
      return collect(Clients<at::Tensor>(torch::autograd::grad({y.sum()}, {rows.value()})[0]));
    }).value();
  };
  for (const bool graph : {false, true}) {
    for (int64_t k : {0, 1, 2, 4}) {
      EXPECT_EQ(test::bytes_of(summed(k, true, graph)), test::bytes_of(summed(k, false, graph)))
          << "vectorize " << k << (graph ? ", derivative" : "");
    }
  }
}

TEST_P(PrimitivesTest, MapSumClientsJacobian) {
  test::expect_vjp_matches_finite_differences(mesh, cohort, {Place::clients, Place::server},
                                              [](Program&, const at::Tensor& x) {
                                                return map_sum_clients(MapOptions{2}, [](const at::Tensor& r) {
                                                  TensorTree t;
                                                  t.set("y", at::tanh(r) * r.pow(2));
                                                  return ChunkRows{{}, t, {}, {}, {}};
                                                }, Clients<at::Tensor>(x)).sum.value().at("y");
                                              },
                                              at::randn({5, 2}, f64));
}

TEST_P(PrimitivesTest, MapEachClientSeesOneClientWithoutTheClientsAxis) {
  const at::Tensor data = at::randn({5, 4}, f64);
  const auto out = mesh.run(cohort, [&](Program& p) {
    const auto y = map_each_client([](const at::Tensor& row) {
      EXPECT_EQ(row.dim(), 1);
      return row.pow(2).sum();
    }, p.local_rows(data));
    return collect(y);
  }).value();
  EXPECT_TRUE(at::allclose(out, data.pow(2).sum(1)));
}

TEST_P(PrimitivesTest, MapClientsRejectsWrongRowCounts) {
  EXPECT_THROW(mesh.run(cohort, [](Program&) {
    return collect(map_clients([](const at::Tensor& rows) { return rows.narrow(0, 0, 1); },
                               Clients<at::Tensor>(at::zeros({7, 1}))));
  }), Error);
}

// Finite-difference checks, float64, of each primitive alone: the vector-Jacobian product that
// federated AD computes against central differences of <v, f(x)>.
TEST_P(PrimitivesTest, BroadcastJacobian) {
  test::expect_vjp_matches_finite_differences(mesh, cohort, {Place::server, Place::clients},
                                              [](Program&, const at::Tensor& x) {
                                                return broadcast(Server<at::Tensor>(x)).value();
                                              },
                                              at::randn({2, 3}, f64));
}

TEST_P(PrimitivesTest, SumJacobian) {
  test::expect_vjp_matches_finite_differences(mesh, cohort, {Place::clients, Place::server},
                                              [](Program&, const at::Tensor& x) {
                                                return sum(Clients<at::Tensor>(x)).value();
                                              },
                                              at::randn({5, 3}, f64));
}

TEST_P(PrimitivesTest, MeanJacobian) {
  test::expect_vjp_matches_finite_differences(mesh, cohort, {Place::clients, Place::server},
                                              [](Program&, const at::Tensor& x) {
                                                return mean(Clients<at::Tensor>(x)).value();
                                              },
                                              at::randn({5, 2}, f64));
}

TEST_P(PrimitivesTest, WeightedMeanJacobianInValues) {
  const at::Tensor w = at::rand({5}, f64) + 0.5;
  test::expect_vjp_matches_finite_differences(mesh, cohort, {Place::clients, Place::server},
                                              [&](Program& p, const at::Tensor& x) {
                                                return weighted_mean(Clients<at::Tensor>(x), p.local_rows(w)).value();
                                              },
                                              at::randn({5, 3}, f64));
}

TEST_P(PrimitivesTest, WeightedMeanJacobianInWeights) {
  const at::Tensor values = at::randn({5, 3}, f64);
  test::expect_vjp_matches_finite_differences(mesh, cohort, {Place::clients, Place::server},
                                              [&](Program& p, const at::Tensor& w) {
                                                return weighted_mean(p.local_rows(values), Clients<at::Tensor>(w)).value();
                                              },
                                              at::rand({5}, f64) + 0.5);
}

TEST_P(PrimitivesTest, MapClientsJacobian) {
  test::expect_vjp_matches_finite_differences(mesh, cohort, {Place::clients, Place::clients},
                                              [](Program&, const at::Tensor& x) {
                                                return map_clients([](const at::Tensor& r) { return at::tanh(r) * r.pow(2); },
                                                                   Clients<at::Tensor>(x))
                                                    .value();
                                              },
                                              at::randn({5, 2}, f64));
}

TEST_P(PrimitivesTest, MapServerJacobian) {
  test::expect_vjp_matches_finite_differences(mesh, cohort, {Place::server, Place::server},
                                              [](Program&, const at::Tensor& x) {
                                                return map_server([](const at::Tensor& v) { return at::sin(v) * v; },
                                                                  Server<at::Tensor>(x))
                                                    .value();
                                              },
                                              at::randn({4}, f64));
}

// Composed: broadcast -> per-client nonlinear model on the client's own data -> weighted mean ->
// server nonlinearity. The gradient is the one federated AD computes end to end.
TEST_P(PrimitivesTest, ComposedRoundGradient) {
  const at::Tensor data = at::randn({5, 4, 3}, f64);
  const at::Tensor w = at::rand({5}, f64) + 0.5;
  test::expect_gradient_matches_finite_differences(mesh, cohort, [&](Program& p, const at::Tensor& x) {
    const auto xs = broadcast(Server<at::Tensor>(x));
    const auto losses = map_clients([](const at::Tensor& params, const at::Tensor& d) {
      // params: [k, 3], d: [k, 4, 3] -> one loss per client.
      return at::tanh(at::bmm(d, params.unsqueeze(2))).pow(2).sum({1, 2});
    }, xs, p.local_rows(data));
    const auto avg = weighted_mean(losses, p.local_rows(w));
    return map_server([](const at::Tensor& l) { return at::log1p(l); }, avg).value();
  }, at::randn({3}, f64));
}

// The backward of each primitive is built from primitives, so it is differentiable again:
// a Hessian-vector product through broadcast / map / mean against differences of gradients.
TEST_P(PrimitivesTest, SecondOrderThroughPrimitives) {
  const at::Tensor data = at::randn({5, 3}, f64);
  const at::Tensor u = at::randn({3}, f64);
  test::expect_vjp_matches_finite_differences(mesh, cohort, {Place::server, Place::server},
                                              [&](Program& p, const at::Tensor& input) {
                                                // Finite differences call this without a graph on the input.
                                                const at::Tensor x = input.requires_grad() ? input : input.detach().requires_grad_(true);
                                                const auto xs = broadcast(Server<at::Tensor>(x));
                                                const auto l = map_clients([](const at::Tensor& a, const at::Tensor& d) {
                                                  return at::sin((a * d).sum(1)) * (a * a).sum(1);
                                                }, xs, p.local_rows(data));
                                                const at::Tensor loss = mean(l).value();
                                                const at::Tensor g = torch::autograd::grad({loss}, {x}, {}, true, true)[0];
                                                return (g * u).sum();
                                              },
                                              at::randn({3}, f64));
}

// secure_sum: on its grid it is the sum exactly, with or without pair masks; past the range a
// client's value is clipped and the sum wraps modulo 2^b, as worked out by hand below.
TEST_P(PrimitivesTest, SecureSumIsTheSumOnItsGridAndWrapsPastIt) {
  const at::Tensor on_grid = at::randint(-4000, 4000, {5, 2, 3}, f64) / 4096.0;  // bits 16, range 8: step 2^-12
  for (const auto& [masks, neighbors] : {std::pair{false, 0}, std::pair{true, 0}, std::pair{true, 2}}) {
    const SecureSum s({16, 8.0, masks, neighbors});
    EXPECT_EQ(s.step(), 1.0 / 4096);
    const at::Tensor out = mesh.run(cohort, [&](Program& p) {
      return Server<at::Tensor>(secure_sum(Clients<TensorTree>(TensorTree{{"x", p.local_rows(on_grid).value()}}), s)
                                    .value().at("x"));
    }).value();
    EXPECT_TRUE(at::equal(out, on_grid.sum(0))) << "masks " << masks << " neighbors " << neighbors << out;
  }
  // Bits 4, range 1: integers -8..7 in steps of 1/8. Five clients send (0.25, 3, -0.125): 3 is
  // clipped to 7/8; the sums 10/8 and 35/8 wrap to (10 - 16)/8 and (35 - 32)/8.
  const at::Tensor row = at::tensor({0.25, 3.0, -0.125}, f64);
  const SecureSum small({4, 1.0, true});
  const at::Tensor out = mesh.run(cohort, [&](Program& p) {
    const at::Tensor rows = row.expand({p.local_size(), 3});
    std::vector<TensorTree> unreduced;
    at::Tensor clipped = at::zeros({p.local_size()}, f64);
    for (const ClientChunk& c : detail::chunks(p, 0)) {
      at::Tensor share = clipped.narrow(0, c.begin, c.size);
      unreduced.push_back(small.encode(c, TensorTree{{"x", rows.narrow(0, c.begin, c.size)}}, share, false));
    }
    // The masks cancel exactly in the int64 sum of unreduced messages: the signed sum on the grid.
    const TensorTree signed_sum = sum(Clients<TensorTree>(cat(unreduced))).value();
    const at::Tensor value = secure_sum(Clients<TensorTree>(TensorTree{{"x", rows}}), small).value().at("x");
    const at::Tensor overflows = at::scalar_tensor(static_cast<double>(small.overflows(signed_sum)), f64);
    return Server<at::Tensor>(at::cat({value, overflows.view({1}), collect(Clients<at::Tensor>(clipped)).value(),
                                       signed_sum.at("x").to(f64), small.decode(signed_sum, TensorTree{{"x", value}}).at("x")}));
  }).value();
  EXPECT_TRUE(at::equal(out.narrow(0, 0, 3), at::tensor({-0.75, 0.375, -0.625}, f64))) << out;
  EXPECT_EQ(out[3].item<double>(), 2.0) << "two coordinates wrapped";
  EXPECT_TRUE(at::equal(out.narrow(0, 4, 5), at::full({5}, 1.0 / 3, f64))) << "one value in three clipped";
  EXPECT_TRUE(at::equal(out.narrow(0, 9, 3), at::tensor({10.0, 35.0, -5.0}, f64))) << "5 x (2, 7, -1)";
  EXPECT_TRUE(at::equal(out.narrow(0, 12, 3), out.narrow(0, 0, 3))) << "unreduced messages decode alike";
  // A NaN has no integer to become: refused, naming the client that sent it.
  at::Tensor poisoned = on_grid.clone();
  poisoned[3][1][2] = std::nan("");
  try {
    mesh.run(cohort, [&](Program& p) {
      return Server<TensorTree>(
          secure_sum(Clients<TensorTree>(TensorTree{{"x", p.local_rows(poisoned).value()}}), SecureSum({16, 8.0})).value());
    });
    ADD_FAILURE() << "a NaN was summed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("client {} (cohort position 3) sends a non-finite value",
                                                     cohort.id(3))),
              std::string::npos)
        << e.what();
  }
}

// The derivative of a secure sum is a sum's, to second order: the same gradient and the same
// Hessian-vector product as the plain sum (the function is linear in the sum, so the rounding
// of the value does not enter them).
TEST_P(PrimitivesTest, SecureSumDerivativesAreTheSumsToSecondOrder) {
  const at::Tensor data = at::randn({5, 3}, f64), x0 = at::randn({3}, f64), u = at::randn({3}, f64),
                   v = at::randn({3}, f64);
  const SecureSum s({32, 64.0, true});
  const auto derivatives = [&](bool secure) {
    return mesh.run(cohort, [&](Program& p) {
      const at::Tensor x = x0.clone().requires_grad_(true);
      const auto l = map_clients([](const at::Tensor& a, const at::Tensor& d) { return at::sin(a * d) * a; },
                                 broadcast(Server<at::Tensor>(x)), p.local_rows(data));
      const Clients<TensorTree> rows(TensorTree{{"l", l.value()}});
      const at::Tensor total = (secure ? secure_sum(rows, s) : sum(rows)).value().at("l");
      const at::Tensor g = torch::autograd::grad({(total * u).sum()}, {x}, {}, true, true)[0];
      const at::Tensor h = torch::autograd::grad({(g * v).sum()}, {x})[0];
      return Server<at::Tensor>(at::stack({total.detach(), g.detach(), h}));
    }).value();
  };
  const at::Tensor plain = derivatives(false), secure = derivatives(true);
  EXPECT_TRUE(at::equal(secure[1], plain[1])) << secure[1] << plain[1];
  EXPECT_TRUE(at::equal(secure[2], plain[2])) << secure[2] << plain[2];
  EXPECT_GT(plain[2].abs().max().item<double>(), 1e-3) << "a zero Hessian checks nothing";
  EXPECT_TRUE(at::allclose(secure[0], plain[0], 0, 3 * s.step()));
  EXPECT_FALSE(at::equal(secure[0], plain[0])) << "values off the grid were not rounded";
}

// With pair masks a client's message alone is uniform modulo 2^b whatever it encodes (chi-square
// over the 16 residues of b = 4, 1,600 values a client); without, the same check fails.
TEST_P(PrimitivesTest, PairMaskedMessagesAreUniform) {
  const at::Tensor values = at::full({5, 1600}, 0.5, f64);
  const auto chi_square = [&](bool masks, int64_t neighbors) {
    const SecureSum s({4, 1.0, masks, neighbors});
    return mesh.run(cohort, [&](Program& p) {
      std::vector<at::Tensor> per_client;
      for (const ClientChunk& c : detail::chunks(p, 0)) {
        at::Tensor clipped = at::zeros({c.size}, f64);
        const at::Tensor sent =
            s.encode(c, TensorTree{{"x", p.local_rows(values).value().narrow(0, c.begin, c.size)}}, clipped).at("x");
        for (int64_t i = 0; i < c.size; ++i) {
          const at::Tensor counts = at::bincount(sent[i], {}, 16).to(at::kDouble);
          per_client.push_back(((counts - 100).pow(2) / 100).sum());
        }
      }
      return collect(Clients<at::Tensor>(at::stack(per_client)));
    }).value();
  };
  // 15 degrees of freedom: P(chi-square > 42.6) = 1e-4.
  const at::Tensor masked = chi_square(true, 0), ring = chi_square(true, 2), clear = chi_square(false, 0);
  EXPECT_LT(masked.max().item<double>(), 42.6) << masked;
  EXPECT_LT(ring.max().item<double>(), 42.6) << ring;
  EXPECT_GT(clear.min().item<double>(), 42.6) << clear;
}

// Cohorts smaller than the logical shards (Poisson sampling draws any size, even 0): the empty
// shards' chunks have no clients, their partial sums are -0.0, so every result has the bits of the
// same cohort on as many shards as it has clients, for any executor count, gradients included.
TEST(SmallCohorts, EmptyShardsChangeNoBitsAndNoExecutorWaits) {
  const at::Tensor data = at::randn({3, 5}, at::kFloat);
  const at::Tensor w = at::rand({3}, at::kFloat) + 0.5f;
  // sum, mean, weighted_mean, map_sum_clients (with a leaf summed by the function itself), collect,
  // and the gradient of a round-like function, with the number of no-client chunks seen.
  const auto run = [&](int executors, int64_t shards, int64_t n, int64_t k) {
    Mesh mesh({executors, shards, 1, k});
    std::atomic<int> empty_chunks{0};
    TensorTree out = mesh.run(Cohort::range(n), [&](Program& p) {
      const auto x = p.local_rows(data.narrow(0, 0, n));
      const auto wl = p.local_rows(w.narrow(0, 0, n));
      const at::Tensor server = at::linspace(-1, 1, 5, at::kFloat).requires_grad_(true);
      const MappedSum mapped = map_sum_clients([&](const ClientChunk& c, const at::Tensor& rows, const at::Tensor& s) {
        if (c.size == 0) ++empty_chunks;
        TensorTree keep, total, summed;
        keep.set("id", at::arange(c.size, at::kLong) + (c.size > 0 ? c.client_id(0) : 0));
        total.set("y", at::tanh(rows * s) * 3.7f);
        summed.set("z", (rows * s).sum(0));
        return ChunkRows{keep, total, summed, {}, {}};
      }, x, broadcast(Server<at::Tensor>(server)));
      const at::Tensor y = mapped.sum.value().at("y");
      const at::Tensor grad = torch::autograd::grad({y.sum()}, {server})[0];
      TensorTree result{{"sum", sum(x).value()}, {"mean", mean(x).value()},
                        {"weighted_mean", weighted_mean(x, wl).value()}, {"y", y.detach()},
                        {"z", mapped.sum.value().at("z").detach()}, {"grad", grad},
                        {"ids", collect(Clients<at::Tensor>(mapped.keep.value().at("id"))).value()},
                        {"rows", collect(x).value()}};
      return Server<TensorTree>(result);
    }).value();
    out.set("empty_chunks", at::scalar_tensor(empty_chunks.load(), at::kLong));
    return out;
  };
  for (int64_t n : {0, 1, 3}) {
    for (int64_t k : {0, 1, 2}) {
      const TensorTree reference = run(1, 4, n, k);
      EXPECT_EQ(reference.at("empty_chunks").item<int64_t>(), 4 - n) << "one chunk per empty shard";
      EXPECT_EQ(reference.at("rows").size(0), n);
      EXPECT_TRUE(at::equal(reference.at("ids"), at::arange(n, at::kLong)));
      for (int e : {2, 3, 4}) {
        const TensorTree other = run(e, 4, n, k);
        for (const auto& [name, t] : reference)
          EXPECT_EQ(test::bytes_of(other.at(name)), test::bytes_of(t)) << name << ", N " << n << ", E " << e;
      }
      if (n > 0) {
        // The same clients on n shards, none empty: the same bits.
        const TensorTree full = run(1, n, n, k);
        for (const char* name : {"sum", "mean", "weighted_mean", "y", "z", "grad"})
          EXPECT_EQ(test::bytes_of(full.at(name)), test::bytes_of(reference.at(name))) << name << ", N " << n;
      }
    }
  }
  // The sum of nobody is -0.0 (the identity of addition), and so is the mean; the gradient 0.
  const TensorTree none = run(2, 4, 0, 0);
  for (const char* name : {"sum", "mean", "y"}) {
    EXPECT_TRUE(at::equal(none.at(name), at::zeros({5}))) << name;
    EXPECT_TRUE(std::signbit(none.at(name)[0].item<float>())) << name;
  }
  EXPECT_TRUE(at::equal(none.at("grad"), at::zeros({5})));
  EXPECT_TRUE(at::isnan(none.at("weighted_mean")).all().item<bool>()) << "0 / 0: no weights";
}

}  // namespace
}  // namespace fax
