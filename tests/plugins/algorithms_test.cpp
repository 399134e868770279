// The algorithm plugins, loaded from their shared libraries as fax-run loads them, each checked
// against a hand-written round in plain LibTorch on a tiny problem.

#include <torch/csrc/autograd/autograd.h>

#include <fax/in_memory.h>
#include <fax/plugin_loader.h>

#include "../core/helpers.h"

namespace fax {
namespace {

class AlgorithmsTest : public test::SeededTest {
 protected:
  void SetUp() override {
    SeededTest::SetUp();
    for (int64_t n : {4, 7, 5}) clients.push_back({at::randn({n, 3}, at::kDouble), at::randint(0, 2, {n}, at::kLong)});
    data = std::make_unique<InMemoryDataset>(clients, clients[0], 2);
    initial = TensorTree{{"w", at::randn({3, 2}, at::kDouble) * 0.5}, {"b", at::randn({2}, at::kDouble) * 0.1}};
  }

  // Loads plugin `name`, resolves `settings` against its keys and runs `rounds` rounds over all
  // clients on two executors.
  ServerState run_plugin(const std::string& name, const std::vector<std::string>& settings, int rounds) {
    const auto plugin = load_plugin_file(std::string(FAX_TEST_PLUGIN_DIR) + "/fax_" + name + ".so");
    EXPECT_EQ(plugin->name, name);
    Schema schema;
    schema.add_all(plugin->keys, "algorithm");
    Config config;
    for (const auto& s : settings) config.set("algorithm." + s);
    config.resolve(schema);
    auto algorithm = plugin->create();
    ServerState state = algorithm->init(config, model, initial);
    Mesh mesh({2, 3});
    ClientStates states;
    const Cohort cohort({0, 1, 2}, {4, 7, 5});
    for (int r = 0; r < rounds; ++r) {
      const auto out = mesh.run(cohort, [&](Program& p) {
        ServerState s{clone(state.params), clone(state.extra)};
        RoundContext ctx{p, model, *data, r, states};
        algorithm->round(s, ctx);
        TensorTree packed;
        for (const auto& [k, v] : s.params) packed.set("params/" + k, v);
        for (const auto& [k, v] : s.extra) packed.set("extra/" + k, v);
        return Server<TensorTree>(packed);
      }, {0, r}).value();
      state.params = TensorTree{{"w", out.at("params/w")}, {"b", out.at("params/b")}};
      if (out.contains("extra/w")) state.extra = TensorTree{{"w", out.at("extra/w")}, {"b", out.at("extra/b")}};
    }
    return state;
  }

  // Mean cross-entropy of client i at (w, b), differentiable.
  at::Tensor client_loss(int64_t i, const at::Tensor& w, const at::Tensor& b) const {
    return at::cross_entropy_loss(at::addmm(b, clients[i].x, w), clients[i].y);
  }

  std::vector<Examples> clients;
  std::unique_ptr<InMemoryDataset> data;
  TensorTree initial;
  SoftmaxRegression model{3, 2};
};

// FedAvgM with full-batch local steps (no shuffling involved): E = 2 steps per client, deltas
// averaged by example count, v = m v + avg, x -= server_lr v, for two rounds.
TEST_F(AlgorithmsTest, FedAvgWithMomentumMatchesAHandComputedRound) {
  const double client_lr = 0.4, server_lr = 0.7, momentum = 0.5;
  const ServerState fax_state = run_plugin(
      "fedavg", {"client_lr=0.4", "local_epochs=2", "batch_size=0", "server_lr=0.7", "server_momentum=0.5"}, 2);

  at::Tensor w = initial.at("w"), b = initial.at("b");
  at::Tensor vw = at::zeros_like(w), vb = at::zeros_like(b);
  for (int round = 0; round < 2; ++round) {
    at::Tensor dw = at::zeros_like(w), db = at::zeros_like(b);
    double total = 0;
    for (int64_t i = 0; i < 3; ++i) {
      at::Tensor cw = w.clone().requires_grad_(true), cb = b.clone().requires_grad_(true);
      for (int step = 0; step < 2; ++step) {
        const auto g = torch::autograd::grad({client_loss(i, cw, cb)}, {cw, cb});
        cw = (cw - client_lr * g[0]).detach().requires_grad_(true);
        cb = (cb - client_lr * g[1]).detach().requires_grad_(true);
      }
      const double n = static_cast<double>(clients[i].size());
      dw += n * (w - cw.detach());
      db += n * (b - cb.detach());
      total += n;
    }
    vw = momentum * vw + dw / total;
    vb = momentum * vb + db / total;
    w = w - server_lr * vw;
    b = b - server_lr * vb;
  }
  EXPECT_TRUE(at::allclose(fax_state.params.at("w"), w, 1e-10, 1e-12)) << fax_state.params.at("w") << w;
  EXPECT_TRUE(at::allclose(fax_state.params.at("b"), b, 1e-10, 1e-12));
  EXPECT_TRUE(at::allclose(fax_state.extra.at("w"), vw, 1e-10, 1e-12)) << "momentum buffer";
}

// FedSGD: the gradient of the example-weighted mean loss, one server step per round.
TEST_F(AlgorithmsTest, FedSgdMatchesAHandComputedRound) {
  const ServerState fax_state = run_plugin("fedsgd", {"server_lr=0.3"}, 2);
  at::Tensor w = initial.at("w"), b = initial.at("b");
  for (int round = 0; round < 2; ++round) {
    at::Tensor cw = w.clone().requires_grad_(true), cb = b.clone().requires_grad_(true);
    at::Tensor loss = at::zeros({}, at::kDouble);
    for (int64_t i = 0; i < 3; ++i) loss = loss + static_cast<double>(clients[i].size()) * client_loss(i, cw, cb);
    loss = loss / 16.0;
    const auto g = torch::autograd::grad({loss}, {cw, cb});
    w = w - 0.3 * g[0];
    b = b - 0.3 * g[1];
  }
  EXPECT_TRUE(at::allclose(fax_state.params.at("w"), w, 1e-10, 1e-12)) << fax_state.params.at("w") << w;
  EXPECT_TRUE(at::allclose(fax_state.params.at("b"), b, 1e-10, 1e-12));
}

// The template plugin: the unweighted mean of the clients' trained models.
TEST_F(AlgorithmsTest, ExamplePluginAveragesClientModels) {
  const ServerState fax_state = run_plugin("example", {"client_lr=0.2", "batch_size=0"}, 1);
  at::Tensor w_sum = at::zeros_like(initial.at("w"));
  for (int64_t i = 0; i < 3; ++i) {
    at::Tensor cw = initial.at("w").clone().requires_grad_(true), cb = initial.at("b").clone().requires_grad_(true);
    const auto g = torch::autograd::grad({client_loss(i, cw, cb)}, {cw, cb});
    w_sum += cw.detach() - 0.2 * g[0];
  }
  EXPECT_TRUE(at::allclose(fax_state.params.at("w"), w_sum / 3.0, 1e-10, 1e-12));
}

TEST_F(AlgorithmsTest, PluginsDeclareDocumentedKeys) {
  for (const std::string name : {"fedavg", "fedsgd", "example"}) {
    const auto plugin = load_plugin_file(std::string(FAX_TEST_PLUGIN_DIR) + "/fax_" + name + ".so");
    EXPECT_FALSE(plugin->description.empty());
    EXPECT_FALSE(plugin->keys.empty()) << name;
    for (const auto& key : plugin->keys) EXPECT_FALSE(key.doc.empty()) << name << "." << key.name;
    // Defaults satisfy the plugin's own constraints.
    Schema schema;
    schema.add_all(plugin->keys, "algorithm");
    Config config;
    EXPECT_NO_THROW(config.resolve(schema)) << name;
  }
}

}  // namespace
}  // namespace fax
