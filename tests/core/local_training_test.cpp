#include <algorithm>
#include <set>
#include <tuple>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <fax/datasets/in_memory.h>
#include <fax/nn/builtin_models.h>
#include <fax/train/local_training.h>

#include "helpers.h"

namespace fax {
namespace {

// Three clients with 5, 12 and 3 examples of 4 features, 3 classes.
class LocalTrainingTest : public test::SeededTest {
 protected:
  void SetUp() override {
    SeededTest::SetUp();
    std::vector<Examples> clients;
    for (int64_t n : {5, 12, 3}) clients.push_back({at::randn({n, 4}), at::randint(0, 3, {n}, at::kLong)});
    data = std::make_unique<InMemoryDataset>(clients, Examples{at::randn({6, 4}), at::randint(0, 3, {6}, at::kLong)}, 3);
    params = TensorTree{{"w", at::randn({4, 3}) * 0.1}, {"b", at::zeros({3})}};
  }

  // Runs `fn` on one executor for a chunk holding `ids` (in that order).
  template <class F>
  static at::Tensor on_chunk(const std::vector<int64_t>& ids, F&& fn) {
    Mesh mesh({1, 1});
    return mesh.run(Cohort(ids), [&](Program&) {
      at::Tensor out;
      map_clients([&](const ClientChunk& c) {
        out = fn(c);
        return at::zeros({c.size});
      });
      return Server<at::Tensor>(out);
    }, {3, 1}).value();
  }

  // A chunk's trained parameters (in init's order; a deferred input layer formed from its factors)
  // and losses, one row per client, from `init` broadcast to the chunk (a stride-0 clients axis: one
  // shared product) or repeated in materialised rows. `factored_out` says whether factors came back.
  static at::Tensor trained_rows(const Model& model, const FederatedDataset& dataset, const TensorTree& init,
                                 bool broadcast_start, LocalSgdOptions options, int64_t epochs, int64_t batch,
                                 bool* factored_out = nullptr) {
    return on_chunk({0, 1, 2}, [&](const ClientChunk& c) {
      const TensorTree start = init.map([&](const at::Tensor& t) {
        std::vector<int64_t> shape{c.size};
        shape.insert(shape.end(), t.sizes().begin(), t.sizes().end());
        const at::Tensor rows = t.unsqueeze(0).expand(shape);
        return broadcast_start ? rows : rows.contiguous();
      });
      const LocalSgdResult r =
          local_sgd(model, ClientBatches(c, dataset, epochs, batch), start, at::tensor({0.3, 0.2, 0.1}), options);
      if (factored_out) *factored_out = r.input_factors.has_value();
      std::vector<at::Tensor> rows;
      for (const auto& [name, t] : init) {
        if (r.params.contains(name)) {
          rows.push_back(r.params.at(name).flatten(1));
        } else {
          const InputLayerFactors& f = r.input_factors.value();
          rows.push_back((start.at(name) - at::bmm(f.x.transpose(1, 2), f.u)).flatten(1));
        }
      }
      rows.push_back(r.loss.unsqueeze(1).to(rows.front().scalar_type()));
      return at::cat(rows, 1);
    });
  }

  // `p` with a leading clients axis of k identical rows.
  static TensorTree repeat_rows(const TensorTree& p, int64_t k) {
    return p.map([k](const at::Tensor& t) { return at::cat(std::vector<at::Tensor>(k, t.unsqueeze(0))); });
  }

  std::unique_ptr<InMemoryDataset> data;
  TensorTree params;
  SoftmaxRegression model{4, 3};
};

TEST_F(LocalTrainingTest, BatchesCoverEveryExampleOncePerEpochAndMaskTheRest) {
  on_chunk({0, 1, 2}, [&](const ClientChunk& c) {
    const ClientBatches batches(c, *data, 2, 4);
    EXPECT_EQ(batches.steps(), 6);  // client 1: 2 epochs x ceil(12 / 4)
    EXPECT_TRUE(at::equal(batches.examples(), at::tensor({5.0f, 12.0f, 3.0f})));
    std::vector<at::Tensor> seen(3);
    for (int64_t s = 0; s < batches.steps(); ++s) {
      const Batch b = batches.batch(s);
      EXPECT_EQ(b.x.sizes(), (at::IntArrayRef{3, 4, 4}));
      for (int64_t i = 0; i < 3; ++i) {
        // Every slot, masked or not, holds one of the client's own examples.
        const at::Tensor own = data->client(c.client_id(i)).x;
        for (int64_t slot = 0; slot < 4; ++slot) {
          const bool found = (own == b.x[i][slot]).all(1).any().item<bool>();
          EXPECT_TRUE(found) << "step " << s << " client " << i << " slot " << slot << " is not the client's";
        }
        const at::Tensor used = b.x[i].index({b.mask[i] > 0});
        seen[i] = seen[i].defined() ? at::cat({seen[i], used}) : used;
      }
    }
    for (int64_t i = 0; i < 3; ++i) {
      const at::Tensor own = data->client(c.client_id(i)).x;
      EXPECT_EQ(seen[i].size(0), 2 * own.size(0)) << "client " << i;
      // Twice each example: sorting both by first feature aligns them.
      const at::Tensor twice = at::cat({own, own});
      EXPECT_TRUE(at::allclose(std::get<0>(seen[i].select(1, 0).sort()), std::get<0>(twice.select(1, 0).sort())));
    }
    return at::zeros({1});
  });
}

// A step is as wide as its widest client: clients 0 and 2 (5 and 3 examples) in batches of 4 over
// two epochs have 4, 1 | 3, 4 | 1 real examples in steps 0-3 (widths 4, 3, 4, 1; fewest 3, 1, 0,
// 0); block batches keep all B slots.
TEST_F(LocalTrainingTest, StepsAreAsWideAsTheirWidestClient) {
  on_chunk({0, 2}, [&](const ClientChunk& c) {
    const ClientBatches batches(c, *data, 2, 4);
    EXPECT_EQ(batches.steps(), 4);
    const std::vector<std::vector<float>> real{{4, 3}, {1, 3}, {4, 0}, {1, 0}};
    for (int64_t s = 0; s < batches.steps(); ++s) {
      const Batch b = batches.batch(s);
      const at::Tensor expected = at::tensor(real[s]);
      const int64_t width = expected.max().item<int64_t>();
      EXPECT_EQ(b.x.sizes(), (at::IntArrayRef{2, width, 4})) << "step " << s;
      EXPECT_EQ(b.y.sizes(), (at::IntArrayRef{2, width})) << "step " << s;
      EXPECT_TRUE(at::equal(b.mask.sum(1), expected)) << "step " << s;
      EXPECT_TRUE(at::equal(batches.counts()[s], expected)) << "step " << s;
      EXPECT_EQ(batches.fewest(s), expected.min().item<int64_t>()) << "step " << s;
      const Batch wide = batches.batches(s, 1);
      EXPECT_EQ(wide.x.size(1), 4);
      EXPECT_TRUE(at::equal(wide.x.narrow(1, 0, width), b.x)) << "step " << s;
      EXPECT_TRUE(at::equal(wide.mask.narrow(1, 0, width), b.mask)) << "step " << s;
      EXPECT_EQ(wide.mask.narrow(1, width, 4 - width).sum().item<float>(), 0.0f) << "step " << s;
    }
    // Steps with a real example: 2 batches an epoch for 5 examples, 1 for 3.
    EXPECT_TRUE(at::equal(batches.client_steps(), at::tensor({4.0f, 2.0f})));
    return at::zeros({1});
  });
}

TEST_F(LocalTrainingTest, BatchedChunkEqualsEachClientAlone) {
  const at::Tensor lr = at::scalar_tensor(0.3);
  // One row per client: its trained w, its trained b, its mean loss.
  auto trained = [&](const ClientChunk& c) {
    const LocalSgdResult r = local_sgd(model, ClientBatches(c, *data, 2, 4), repeat_rows(params, c.size), lr);
    return at::cat({r.params.at("w").flatten(1), r.params.at("b"), r.loss.unsqueeze(1)}, 1);
  };
  const at::Tensor together = on_chunk({0, 1, 2}, trained);
  // Each client alone, in the same round (same random stream), gives the same numbers.
  for (int64_t id : {0, 1, 2}) {
    const at::Tensor alone = on_chunk({id}, trained);
    EXPECT_TRUE(at::allclose(together[id], alone[0], 1e-5, 1e-6)) << "client " << id;
  }
}

TEST_F(LocalTrainingTest, FullBatchSgdMatchesAHandWrittenLoop) {
  const double lr = 0.5;
  const at::Tensor fax_result = on_chunk({1}, [&](const ClientChunk& c) {
    const ClientBatches batches(c, *data, 3, 0);
    EXPECT_EQ(batches.steps(), 3);
    return local_sgd(model, batches, repeat_rows(params, 1), at::scalar_tensor(lr)).params.at("w")[0];
  });
  at::Tensor w = params.at("w").clone().requires_grad_(true);
  at::Tensor b = params.at("b").clone().requires_grad_(true);
  const Examples own = data->client(1);
  for (int step = 0; step < 3; ++step) {
    const at::Tensor loss = at::cross_entropy_loss(at::addmm(b, own.x, w), own.y);
    const auto g = torch::autograd::grad({loss}, {w, b});
    w = (w - lr * g[0]).detach().requires_grad_(true);
    b = (b - lr * g[1]).detach().requires_grad_(true);
  }
  EXPECT_TRUE(at::allclose(fax_result, w, 1e-5, 1e-6)) << fax_result << w;
}

// Momentum and weight decay as torch.optim.SGD's, against a hand-written loop: minibatches of 4
// over 2 epochs (client 1: 6 steps), in float64; the differentiable steps (create_graph) give the
// same numbers as the in-place ones.
TEST_F(LocalTrainingTest, MomentumAndWeightDecayMatchAHandWrittenLoop) {
  const double lr = 0.2, momentum = 0.9, decay = 0.05;
  const Examples own = data->client(1);
  const InMemoryDataset f64({{own.x.to(at::kDouble), own.y}}, {own.x.to(at::kDouble), own.y}, 3);
  const TensorTree start = repeat_rows(params, 1).map([](const at::Tensor& t) { return t.to(at::kDouble); });
  at::Tensor order;  // the examples of each step, as local SGD drew them
  auto train = [&](bool create_graph) {
    return on_chunk({0}, [&](const ClientChunk& c) {
      const ClientBatches batches(c, f64, 2, 4);
      std::vector<at::Tensor> steps;
      for (int64_t s = 0; s < batches.steps(); ++s) steps.push_back(batches.batch(s).x[0]);
      order = at::stack(steps);
      LocalSgdOptions options;
      options.momentum = momentum;
      options.weight_decay = decay;
      options.create_graph = create_graph;
      const LocalSgdResult r = local_sgd(model, batches, start, at::scalar_tensor(lr, at::kDouble), options);
      return at::cat({r.params.at("w")[0].flatten(), r.params.at("b")[0]}).detach();
    });
  };
  const at::Tensor in_place = train(false);
  ASSERT_EQ(order.size(0), 6);
  at::Tensor w = start.at("w")[0].clone(), b = start.at("b")[0].clone();
  at::Tensor vw, vb;
  for (int64_t s = 0; s < order.size(0); ++s) {
    // The step's labels: each row's own, found among the client's examples.
    const at::Tensor x = order[s];
    const at::Tensor match = (x.unsqueeze(1) == f64.client(0).x.unsqueeze(0)).all(2).to(at::kLong).argmax(1);
    const at::Tensor y = own.y.index_select(0, match);
    const at::Tensor wg = w.clone().requires_grad_(true), bg = b.clone().requires_grad_(true);
    const auto g = torch::autograd::grad({at::cross_entropy_loss(at::addmm(bg, x, wg), y)}, {wg, bg});
    const at::Tensor gw = g[0] + decay * w, gb = g[1] + decay * b;
    vw = s == 0 ? gw : momentum * vw + gw;
    vb = s == 0 ? gb : momentum * vb + gb;
    w = w - lr * vw;
    b = b - lr * vb;
  }
  const at::Tensor expected = at::cat({w.flatten(), b});
  EXPECT_TRUE(at::allclose(in_place, expected, 1e-12, 1e-12)) << in_place - expected;
  EXPECT_TRUE(at::allclose(train(true), in_place, 1e-12, 1e-12));
  // Plain SGD lands elsewhere: the options did something.
  EXPECT_GT((in_place - on_chunk({0}, [&](const ClientChunk& c) {
              const LocalSgdResult r = local_sgd(model, ClientBatches(c, f64, 2, 4), start, at::scalar_tensor(lr, at::kDouble));
              return at::cat({r.params.at("w")[0].flatten(), r.params.at("b")[0]});
            })).abs().max().item<double>(), 1e-3);
}

TEST_F(LocalTrainingTest, ClientsWithFewerStepsStayPut) {
  const at::Tensor lr = at::scalar_tensor(0.5);
  const at::Tensor in_chunk = on_chunk({2, 1}, [&](const ClientChunk& c) {
    const ClientBatches batches(c, *data, 1, 3);  // client 2: 1 step, client 1: 4 steps
    EXPECT_EQ(batches.steps(), 4);
    return local_sgd(model, batches, repeat_rows(params, 2), lr).params.at("w")[0].flatten();
  });
  const at::Tensor alone = on_chunk({2}, [&](const ClientChunk& c) {
    return local_sgd(model, ClientBatches(c, *data, 1, 3), repeat_rows(params, 1), lr).params.at("w")[0].flatten();
  });
  EXPECT_TRUE(at::allclose(in_chunk, alone, 1e-6, 1e-7));
  EXPECT_FALSE(at::allclose(in_chunk, params.at("w").flatten())) << "the client did not train at all";
}

// A client whose steps are over leaves the chunk's computation: the batch rows computed drop from
// (steps x clients x width) to those of the clients still training, and every client ends with the
// bits it gets trained alone (factored: the client still training). Client 1 has 12 examples, 0
// has 5, 2 has 3. Autograd steps (with momentum, a per-client correction and a proximal penalty,
// all narrowed as clients leave) at B = 3: 4, 2 and 1 steps, so 9 + 6 + 3 + 3 rows instead of
// 4 x 9; the factored MLP at B = 1 over two epochs: 24, 10 and 6 steps in blocks of 20 (40
// outputs), so 3 x 20 + 4 rows instead of 3 x 24.
TEST_F(LocalTrainingTest, ClientsWhoseStepsAreOverLeaveTheComputation) {
  const Mlp mlp({4}, {40}, 3);
  const TensorTree mlp_init = mlp.init(at::make_generator<at::CPUGeneratorImpl>(3));
  const TensorTree correction = repeat_rows(params, 3).map([](const at::Tensor& t) { return at::randn_like(t) * 0.01; });
  struct Case {
    const char* name;
    const Model& model;
    const TensorTree& init;
    int64_t epochs, batch, rows;
  };
  for (const Case& c : {Case{"autograd steps", model, params, 1, 3, 21}, Case{"factored MLP", mlp, mlp_init, 2, 1, 64}}) {
    SCOPED_TRACE(c.name);
    LocalSgdOptions options;
    if (&c.model == &model) {
      options.factor_input_layer = false;
      options.momentum = 0.9;
    }
    auto trained = [&](const ClientChunk& chunk) {
      LocalSgdOptions o = options;
      if (o.momentum != 0.0) {
        // Per client by id: the correction, and a proximal term's anchor (FedProx's penalty).
        TensorTree anchor;
        for (const auto& [name, t] : correction) {
          std::vector<at::Tensor> rows;
          for (int64_t i = 0; i < chunk.size; ++i) rows.push_back(t[chunk.client_id(i)]);
          o.correction.set(name, at::stack(rows));
          anchor.set(name, at::stack(rows) * 10);
        }
        o.penalty = [anchor](const TensorTree& p, const at::Tensor& clients) {
          at::Tensor total;
          for (const auto& [name, a] : anchor) {
            const at::Tensor d = p.at(name) - (clients.defined() ? a.index_select(0, clients) : a);
            const at::Tensor term = d.pow(2).flatten(1).sum(1);
            total = total.defined() ? total + term : term;
          }
          return 0.05 * total;
        };
      }
      const LocalSgdResult r = local_sgd(c.model, ClientBatches(chunk, *data, c.epochs, c.batch),
                                         repeat_rows(c.init, chunk.size), at::scalar_tensor(0.3), o);
      std::vector<at::Tensor> rows;
      for (const auto& [name, t] : r.params) rows.push_back(t.flatten(1));
      rows.push_back(r.loss.unsqueeze(1));
      return at::cat(rows, 1);
    };
    const RowSteps before = local_training_row_steps();
    const at::Tensor together = on_chunk({1, 0, 2}, trained);
    const RowSteps after = local_training_row_steps();
    EXPECT_EQ(after.computed - before.computed, c.rows);
    EXPECT_EQ(after.real - before.real, c.epochs * 20);
    // Factored, a block's products run over its steps, so a client that stops inside a block gets
    // other roundings alone (a shorter block) than in its chunk, leaving or not: close, not equal.
    for (const auto& [row, id] : {std::pair{0, 1}, {1, 0}, {2, 2}}) {
      const at::Tensor alone = on_chunk({id}, trained)[0];
      if (&c.model == &model || id == 1) EXPECT_TRUE(at::equal(together[row], alone)) << "client " << id;
      else EXPECT_TRUE(at::allclose(together[row], alone, 1e-5, 1e-6)) << "client " << id;
    }
  }
}

// A penalty must give one value per row it gets: one written for the whole chunk (here 3 rows
// whatever it is given) is refused once a client has left, not broadcast.
TEST_F(LocalTrainingTest, PenaltyWithTheWrongRowsIsRefused) {
  LocalSgdOptions options;
  options.factor_input_layer = false;
  options.penalty = [](const TensorTree& p, const at::Tensor&) { return at::zeros({3}, p.at("w").options()); };
  EXPECT_THROW(on_chunk({1, 0, 2}, [&](const ClientChunk& c) {
                 return local_sgd(model, ClientBatches(c, *data, 1, 3), repeat_rows(params, 3), at::scalar_tensor(0.3), options)
                     .loss;
               }),
               Error);
}

// A model with a buffer its forward pass updates (here: steps seen, like BatchNorm's statistics,
// which move on masked steps too) keeps every client in the computation: each row counts the
// chunk's 4 steps, and all 4 x 3 x 3 rows are computed.
TEST_F(LocalTrainingTest, ModelsWithBuffersKeepEveryClient) {
  struct Counting : Model {
    SoftmaxRegression inner{4, 3};
    std::string describe() const override { return "counting softmax regression"; }
    TensorTree init(at::Generator g) const override { return inner.init(g); }
    int64_t forward_flops() const override { return inner.forward_flops(); }
    bool is_buffer(const std::string& leaf) const override { return leaf == "seen"; }
    at::Tensor forward(const TensorTree& params, const at::Tensor& x) const override {
      params.at("seen").add_(1);
      return inner.forward(params, x);
    }
  } counting;
  TensorTree start = repeat_rows(params, 3);
  start.set("seen", at::zeros({3}));
  LocalSgdOptions options;
  options.factor_input_layer = false;
  const RowSteps before = local_training_row_steps();
  const at::Tensor seen = on_chunk({1, 0, 2}, [&](const ClientChunk& c) {
    return local_sgd(counting, ClientBatches(c, *data, 1, 3), start, at::scalar_tensor(0.3), options).params.at("seen");
  });
  EXPECT_TRUE(at::equal(seen, at::full({3}, 4.0f))) << seen;
  EXPECT_EQ(local_training_row_steps().computed - before.computed, 36);
}

// With create_graph the trained parameters stay differentiable in the learning rate (the client
// learning-rate hypergradient): d/d lr of |w_final|^2 + loss against central differences.
TEST_F(LocalTrainingTest, CreateGraphDifferentiatesThroughTheSteps) {
  const Examples own = data->client(0);
  const InMemoryDataset f64({{own.x.to(at::kDouble), own.y}}, {own.x.to(at::kDouble), own.y}, 3);
  auto objective = [&](double lr_value, bool differentiate) {
    return on_chunk({0}, [&](const ClientChunk& c) {
      TensorTree start = repeat_rows(params, 1).map([](const at::Tensor& t) { return t.to(at::kDouble); });
      requires_grad_(start);
      const at::Tensor lr = at::scalar_tensor(lr_value, at::kDouble).requires_grad_(differentiate);
      const LocalSgdResult r = local_sgd(model, ClientBatches(c, f64, 3, 2), start, lr, {true, {}});
      const at::Tensor value = r.params.at("w").pow(2).sum() + r.params.at("b").sum();
      return differentiate ? torch::autograd::grad({value}, {lr})[0] : value.detach();
    });
  };
  const double eps = 1e-6;
  const double numeric = (objective(0.3 + eps, false) - objective(0.3 - eps, false)).item<double>() / (2 * eps);
  const double analytic = objective(0.3, true).item<double>();
  EXPECT_NEAR(analytic, numeric, 1e-6 * std::max(1.0, std::abs(numeric)));
  EXPECT_GT(std::abs(numeric), 1e-4) << "a flat objective checks nothing";
}

// Factored (`factored`) against plain autograd steps: close, not equal (the factored path ran),
// and trained.
void expect_factored_matches_autograd(const at::Tensor& factored, const at::Tensor& plain, const TensorTree& init,
                                      double rtol, double atol) {
  EXPECT_TRUE(at::allclose(factored, plain, rtol, atol))
      << "largest difference " << (factored - plain).abs().max().item<double>();
  EXPECT_FALSE(at::equal(factored, plain));
  std::vector<at::Tensor> untrained;
  for (const auto& [name, t] : init) untrained.push_back(t.flatten().unsqueeze(0).expand({3, -1}));
  const at::Tensor params = factored.narrow(1, 0, factored.size(1) - 1);
  EXPECT_GT((params - at::cat(untrained, 1)).abs().max().item<double>(), 1e-3) << "the clients did not train";
}

// The factored input layer (LocalSgdOptions::factor_input_layer) against plain autograd steps: an
// MLP wide enough for blocks of 10 steps (batch 2, 40 outputs), two epochs so client 1's 12 steps
// span two blocks and clients 0 and 2 stop early; from a broadcast start (one shared product) and
// from materialised rows.
TEST_F(LocalTrainingTest, FactoredInputLayerMatchesAutogradSteps) {
  const Mlp mlp({4}, {40}, 3);
  const TensorTree init = mlp.init(at::make_generator<at::CPUGeneratorImpl>(3));
  for (bool broadcast_start : {true, false}) {
    SCOPED_TRACE(broadcast_start ? "broadcast start" : "materialised start");
    LocalSgdOptions factored, plain;
    plain.factor_input_layer = false;
    expect_factored_matches_autograd(trained_rows(mlp, *data, init, broadcast_start, factored, 2, 2),
                                     trained_rows(mlp, *data, init, broadcast_start, plain, 2, 2), init, 1e-5, 1e-6);
  }
}

// The CNN's first dense layer, factored after the convolutions that compute its input
// (InputLayer::learned_features), in float64, batch 2: client 1's 130 steps span two blocks of 128
// (fc1 has 512 outputs); with 12 examples all 6 steps fit one and FedAvg-style callers get factors.
TEST_F(LocalTrainingTest, FactoredLayerAfterConvolutionsMatchesAutogradSteps) {
  const auto images = [](int64_t middle_client) {
    std::vector<Examples> clients;
    for (int64_t n : {int64_t{5}, middle_client, int64_t{3}})
      clients.push_back({at::randn({n, 1, 8, 8}, at::kDouble), at::randint(0, 3, {n}, at::kLong)});
    return InMemoryDataset(clients, Examples{at::randn({2, 1, 8, 8}, at::kDouble), at::randint(0, 3, {2}, at::kLong)}, 3);
  };
  const InMemoryDataset two_blocks = images(260), one_block = images(12);
  const Cnn cnn({1, 8, 8}, 3);
  ASSERT_TRUE(cnn.input_layer() && cnn.input_layer()->learned_features);
  const TensorTree init =
      cnn.init(at::make_generator<at::CPUGeneratorImpl>(3)).map([](const at::Tensor& t) { return t.to(at::kDouble); });
  LocalSgdOptions factored, plain, deferred;
  plain.factor_input_layer = false;
  deferred.defer_input_layer = true;
  for (bool broadcast_start : {true, false}) {
    SCOPED_TRACE(broadcast_start ? "broadcast start" : "materialised start");
    expect_factored_matches_autograd(trained_rows(cnn, two_blocks, init, broadcast_start, factored, 1, 2),
                                     trained_rows(cnn, two_blocks, init, broadcast_start, plain, 1, 2), init, 1e-9, 1e-11);
  }
  bool deferred_factors = false, formed_factors = true;
  const at::Tensor from_factors = trained_rows(cnn, one_block, init, true, deferred, 1, 2, &deferred_factors);
  const at::Tensor formed = trained_rows(cnn, one_block, init, true, factored, 1, 2, &formed_factors);
  EXPECT_TRUE(deferred_factors);
  EXPECT_FALSE(formed_factors);
  EXPECT_TRUE(at::allclose(from_factors, formed, 1e-9, 1e-11))
      << "largest difference " << (from_factors - formed).abs().max().item<double>();
}

// Deferred: when every step fits in one block (here 6 steps of B = 2, blocks of 10), the input
// weight stays as factors, start - x^T u per client, the other leaves as usual; with more steps
// than a block (two epochs: 12) the weights are formed.
TEST_F(LocalTrainingTest, DeferredInputLayerLeavesFactorsThatGiveTheWeights) {
  const Mlp mlp({4}, {40}, 3);
  const TensorTree start = repeat_rows(mlp.init(at::make_generator<at::CPUGeneratorImpl>(3)), 3);
  auto train = [&](int64_t epochs, bool defer) {
    LocalSgdResult result;
    on_chunk({0, 1, 2}, [&](const ClientChunk& c) {
      LocalSgdOptions options;
      options.defer_input_layer = defer;
      result = local_sgd(mlp, ClientBatches(c, *data, epochs, 2), start, at::scalar_tensor(0.3), options);
      return at::zeros({1});
    });
    return result;
  };
  const LocalSgdResult deferred = train(1, true);
  const LocalSgdResult formed = train(1, false);
  ASSERT_TRUE(deferred.input_factors.has_value());
  EXPECT_FALSE(formed.input_factors.has_value());
  EXPECT_FALSE(deferred.params.contains("l0.w"));
  const at::Tensor w = start.at("l0.w") - at::bmm(deferred.input_factors->x.transpose(1, 2), deferred.input_factors->u);
  EXPECT_TRUE(at::allclose(w, formed.params.at("l0.w"), 1e-6, 1e-7));
  EXPECT_FALSE(at::allclose(w, start.at("l0.w"))) << "the input layer did not train";
  for (const auto& [name, t] : deferred.params) EXPECT_TRUE(at::equal(t, formed.params.at(name))) << name;
  EXPECT_TRUE(at::equal(deferred.loss, formed.loss));
  const LocalSgdResult two_blocks = train(2, true);
  EXPECT_FALSE(two_blocks.input_factors.has_value());
  EXPECT_TRUE(two_blocks.params.contains("l0.w"));
}

// Only the input layer's own steps are factored: with create_graph (or a penalty) local SGD steps
// every leaf through autograd, bit for bit as with the option off.
TEST_F(LocalTrainingTest, FactoringStepsAsideForGraphsAndPenalties) {
  const Mlp mlp({4}, {40}, 3);
  const TensorTree start = repeat_rows(mlp.init(at::make_generator<at::CPUGeneratorImpl>(3)), 1);
  auto weights = [&](bool factor, bool penalty) {
    return on_chunk({1}, [&](const ClientChunk& c) {
      LocalSgdOptions options;
      options.factor_input_layer = factor;
      if (penalty) options.penalty = [](const TensorTree& p, const at::Tensor&) { return p.at("l1.b").pow(2).sum(1); };
      return local_sgd(mlp, ClientBatches(c, *data, 1, 2), start, at::scalar_tensor(0.3), options).params.at("l0.w");
    });
  };
  EXPECT_TRUE(at::equal(weights(true, true), weights(false, true)));
  EXPECT_FALSE(at::equal(weights(true, false), weights(false, false)));
}

// Images [2, 3, 3] with distinct positive pixels, 7 and 4 of them, whose training asks for a crop
// with padding 1 (filled with -1 and -2) and a flip.
class AugmentedImages final : public FederatedDataset {
 public:
  AugmentedImages()
      : inner_({image_examples(7, 0), image_examples(4, 100)}, image_examples(2, 200), 3) {}
  std::string describe() const override { return "augmented images"; }
  int64_t num_clients() const override { return inner_.num_clients(); }
  int64_t num_examples(int64_t client) const override { return inner_.num_examples(client); }
  Examples client(int64_t client) const override { return inner_.client(client); }
  const Examples& test() const override { return inner_.test(); }
  std::vector<int64_t> input_shape() const override { return inner_.input_shape(); }
  int64_t num_classes() const override { return 3; }
  std::optional<Augmentation> augmentation() const override { return Augmentation{1, true, {-1.0, -2.0}}; }

 private:
  static Examples image_examples(int64_t n, int64_t first) {
    return {at::arange(first * 18 + 1, (first + n) * 18 + 1, at::kFloat).view({n, 2, 3, 3}),
            at::zeros({n}, at::kLong)};
  }
  InMemoryDataset inner_;
};

// Every slot holds a crop (offsets 0..2 of the padded image) of one of the client's own images,
// flipped or not; over the steps every crop offset and both flips occur; the same stream gives the
// same draws, step batches and block batches agree, and augment = false leaves the images alone.
TEST_F(LocalTrainingTest, AugmentationCropsAndFlipsEachSlotFromTheClientsStream) {
  const AugmentedImages images;
  on_chunk({0, 1}, [&](const ClientChunk& c) {
    const ClientBatches batches(c, images, 3, 4);
    const ClientBatches again(c, images, 3, 4);
    const ClientBatches plain(c, images, 3, 4, /*augment=*/false);
    std::set<std::tuple<int64_t, int64_t, int64_t>> drawn;
    for (int64_t s = 0; s < batches.steps(); ++s) {
      const Batch b = batches.batch(s);
      EXPECT_TRUE(at::equal(b.x, again.batch(s).x)) << "step " << s;
      EXPECT_TRUE(at::equal(batches.batches(s, 1).x.narrow(1, 0, b.x.size(1)), b.x)) << "step " << s;
      for (int64_t i = 0; i < 2; ++i) {
        const at::Tensor own = images.client(c.client_id(i)).x;
        const at::Tensor original = plain.batch(s).x[i];
        for (int64_t slot = 0; slot < b.x.size(1); ++slot) {
          const at::Tensor out = b.x[i][slot];
          EXPECT_TRUE((own == original[slot]).flatten(1).all(1).any().item<bool>()) << "not the client's own";
          at::Tensor padded = at::empty({2, 5, 5});
          padded[0].fill_(-1.0);
          padded[1].fill_(-2.0);
          padded.narrow(1, 1, 3).narrow(2, 1, 3).copy_(original[slot]);
          bool found = false;
          for (int64_t dy = 0; dy < 3; ++dy)
            for (int64_t dx = 0; dx < 3; ++dx)
              for (int64_t flip = 0; flip < 2; ++flip) {
                at::Tensor crop = padded.narrow(1, dy, 3).narrow(2, dx, 3);
                if (flip) crop = crop.flip(2);
                if (!found && at::equal(crop, out)) {
                  found = true;
                  if (b.mask[i][slot].item<float>() > 0) drawn.insert({dy, dx, flip});
                }
              }
          EXPECT_TRUE(found) << "step " << s << " client " << i << " slot " << slot << ": not a crop of its image";
        }
      }
    }
    std::set<std::pair<int64_t, int64_t>> offsets;
    std::set<int64_t> flips;
    for (const auto& [dy, dx, flip] : drawn) offsets.insert({dy, dx}), flips.insert(flip);
    EXPECT_EQ(offsets.size(), 9u);
    EXPECT_EQ(flips.size(), 2u);
    return at::zeros({1});
  });
}


// Images [2, 3, 3] in one pool of 30; clients 0..2 hold rows of it in no particular order. With
// `expose` the pool is offered to local training, else only client(); `rows0` replaces client 0's
// rows (a data set that lies about its pool).
class PooledImages final : public FederatedDataset {
 public:
  explicit PooledImages(bool expose, at::Tensor rows0 = {}, int64_t labels = 30) : expose_(expose) {
    pool_ = {at::arange(1, 30 * 18 + 1, at::kFloat).view({30, 2, 3, 3}), at::arange(labels, at::kLong) % 3};
    rows_ = {at::tensor({17, 3, 29, 8, 0, 12, 21}, at::kLong), at::tensor({5, 26, 14, 9}, at::kLong),
             at::tensor({1, 2, 22, 23, 27, 11, 6, 19, 4, 15, 25}, at::kLong)};
    if (rows0.defined()) rows_[0] = rows0;
  }
  std::string describe() const override { return "pooled images"; }
  int64_t num_clients() const override { return 3; }
  int64_t num_examples(int64_t client) const override { return client == 0 ? 7 : rows_.at(client).size(0); }
  Examples client(int64_t client) const override {
    const at::Tensor rows = rows_.at(client).to(at::kLong);
    return {pool_.x.index_select(0, rows), pool_.y.index_select(0, rows)};
  }
  const Examples& test() const override { return pool_; }
  std::vector<int64_t> input_shape() const override { return {2, 3, 3}; }
  int64_t num_classes() const override { return 3; }
  std::optional<Augmentation> augmentation() const override { return Augmentation{1, true, {-1.0, -2.0}}; }
  const Examples* pool() const override { return expose_ ? &pool_ : nullptr; }
  at::Tensor client_rows(int64_t client) const override { return rows_.at(client); }

 private:
  bool expose_;
  Examples pool_;
  std::vector<at::Tensor> rows_;
};

// Gathering straight from a data set's pool gives the batches (augmented or not) that its clients'
// own examples give, step by step and in blocks, masked slots included.
TEST_F(LocalTrainingTest, BatchesFromAPoolEqualBatchesFromTheClientsExamples) {
  const PooledImages pooled(true), own(false);
  on_chunk({2, 0, 1}, [&](const ClientChunk& c) {
    for (const bool augment : {false, true}) {
      for (const int64_t b : {4, 0}) {
        const ClientBatches from_pool(c, pooled, 2, b, augment), from_clients(c, own, 2, b, augment);
        EXPECT_TRUE(at::equal(from_pool.counts(), from_clients.counts()));  // so the steps agree too
        for (int64_t s = 0; s < std::min(from_pool.steps(), from_clients.steps()); ++s) {
          const Batch p = from_pool.batch(s), q = from_clients.batch(s);
          EXPECT_TRUE(at::equal(p.x, q.x) && at::equal(p.y, q.y) && at::equal(p.mask, q.mask))
              << "step " << s << ", batch " << b << ", augment " << augment;
        }
        const at::Tensor some = at::tensor({2, 0}, at::kLong);
        const int64_t all = std::min(from_pool.steps(), from_clients.steps());
        const Batch p = from_pool.batches(0, all, some), q = from_clients.batches(0, all, some);
        EXPECT_TRUE(at::equal(p.x, q.x) && at::equal(p.y, q.y) && at::equal(p.mask, q.mask));
      }
    }
    return at::zeros({1});
  });
}

// A pool's rows are checked before they are read: out of range, the wrong type or count; and a
// pool whose labels are not one per input.
TEST_F(LocalTrainingTest, PoolRowsOutsideThePoolAreRefused) {
  const std::vector<std::pair<at::Tensor, std::string>> lies = {
      {at::tensor({17, 3, 29, 8, 0, 12, 30}, at::kLong), "run from 0 to 30, outside 0..29"},
      {at::tensor({17, 3, 29, 8, -1, 12, 21}, at::kLong), "run from -1 to 29, outside 0..29"},
      {at::tensor({17, 3, 29, 8, 0, 12, 21}, at::kInt), "client 0's rows of its example pool are not [7] int64"},
      {at::tensor({17, 3, 29}, at::kLong), "client 0's rows of its example pool are not [7] int64"}};
  for (const auto& [rows, message] : lies) {
    const PooledImages lying(true, rows);
    SCOPED_TRACE(message);
    const std::string error = test::error_of([&] {
      on_chunk({1, 0}, [&](const ClientChunk& c) {
        ClientBatches(c, lying, 1, 4);
        return at::zeros({1});
      });
    });
    EXPECT_NE(error.find("data set pooled images: client 0's rows of its example pool"), std::string::npos) << error;
    EXPECT_NE(error.find(message), std::string::npos) << error;
  }
  const PooledImages short_labels(true, {}, 29);
  const std::string error = test::error_of([&] {
    on_chunk({1, 0}, [&](const ClientChunk& c) {
      ClientBatches(c, short_labels, 1, 4);
      return at::zeros({1});
    });
  });
  EXPECT_NE(error.find("data set pooled images: its example pool's inputs and labels are not one row per example"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace fax
