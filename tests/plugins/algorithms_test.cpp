// The algorithm plugins, loaded from their shared libraries as fax-run loads them, each checked
// against a hand-written round in plain LibTorch on a tiny problem.

#include <optional>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <fax/datasets/in_memory.h>
#include <fax/io/config_yaml.h>
#include <fax/nn/builtin_models.h>
#include <fax/runtime/plugin_loader.h>

#include "../core/helpers.h"

namespace fax {
namespace {

std::vector<std::string> join_settings(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class AlgorithmsTest : public test::SeededTest {
 protected:
  void SetUp() override {
    SeededTest::SetUp();
    for (int64_t n : {4, 7, 5}) clients.push_back({at::randn({n, 3}, at::kDouble), at::randint(0, 2, {n}, at::kLong)});
    data = std::make_unique<InMemoryDataset>(clients, clients[0], 2);
    initial = TensorTree{{"w", at::randn({3, 2}, at::kDouble) * 0.5}, {"b", at::randn({2}, at::kDouble) * 0.1}};
  }

  // Loads plugin `name`, resolves `settings` against its keys and runs `rounds` rounds over all
  // clients on two executors; `last_metrics` receives the last round's server metrics.
  ServerState run_plugin(const std::string& name, const std::vector<std::string>& settings, int rounds,
                         TensorTree* last_metrics = nullptr) {
    const auto plugin = load_plugin_file(std::string(FAX_TEST_PLUGIN_DIR) + "/fax_" + name + ".so");
    EXPECT_EQ(plugin->name, name);
    Schema schema;
    schema.add_all(plugin->keys, "algorithm");
    Config config;
    for (const auto& s : settings) apply_override(config, "algorithm." + s);
    config.resolve(schema);
    auto algorithm = plugin->create();
    ServerState state = algorithm->init(config, *model, initial);
    if (aggregation) state = with_aggregation_state(std::move(state), *aggregation);
    Mesh mesh({2, 3});
    ClientStates states;
    std::vector<int64_t> ids;
    std::vector<double> sizes;
    for (size_t i = 0; i < clients.size(); ++i) {
      ids.push_back(static_cast<int64_t>(i));
      sizes.push_back(static_cast<double>(clients[i].size()));
    }
    const Cohort cohort(ids, sizes);
    for (int r = 0; r < rounds; ++r) {
      const auto out = mesh.run(cohort, [&](Program& p) {
        ServerState s{clone(state.params), clone(state.extra)};
        RoundContext ctx{p, *model, *data, r, states, nonfinite, factor_input_layer, aggregation.get()};
        if (async) ctx.async = &*async;
        const RoundMetrics m = aggregated_round(*algorithm, s, ctx);
        return Server<TensorTree>(join({prefixed(s.params, "params/"), prefixed(s.extra, "extra/"),
                                        prefixed(detach(m.server), "metrics/")}));
      }, {seed, r}).value();
      state = {unprefixed(out, "params/"), unprefixed(out, "extra/")};
      if (last_metrics != nullptr) *last_metrics = unprefixed(out, "metrics/");
    }
    return state;
  }

  // Rounds combine the updates with the aggregation pipeline `stages` and `settings`
  // ("aggregation.clip.norm=0.5", "clients.byzantine.fraction=0.4"), seed 0, as fax-run does.
  void use_aggregation(const std::string& stages, const std::vector<std::string>& settings = {}) {
    Schema schema;
    for (ConfigKey& k : aggregation_schema()) schema.add(std::move(k));
    for (ConfigKey& k : aggregation_keys(stages, "test")) schema.add(std::move(k));
    Config config;
    apply_override(config, "aggregation.stages=" + stages);
    for (const auto& s : settings) apply_override(config, s);
    config.resolve(schema);
    aggregation = std::make_unique<Aggregation>(config, static_cast<int64_t>(clients.size()), 0);
  }

  // Client i's update w0 - y_i after `steps` full-batch SGD steps from `initial`, flattened [P].
  at::Tensor flat_update(int64_t i, int steps, double lr) const {
    const auto [cw, cb] = local(i, initial.at("w"), initial.at("b"), steps, lr);
    return at::cat({(initial.at("w") - cw).flatten(), initial.at("b") - cb});
  }

  // Client i's model after `steps` full-batch SGD steps from (w, b); `extra_grad(w, b)` adds to
  // the loss (a proximal or correction term).
  std::pair<at::Tensor, at::Tensor> local(int64_t i, const at::Tensor& w, const at::Tensor& b, int steps, double lr,
                                          const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& extra = {}) const {
    at::Tensor cw = w.detach().clone().requires_grad_(true), cb = b.detach().clone().requires_grad_(true);
    for (int s = 0; s < steps; ++s) {
      at::Tensor loss = client_loss(i, cw, cb);
      if (extra) loss = loss + extra(cw, cb);
      const auto g = torch::autograd::grad({loss}, {cw, cb});
      cw = (cw - lr * g[0]).detach().requires_grad_(true);
      cb = (cb - lr * g[1]).detach().requires_grad_(true);
    }
    return {cw.detach(), cb.detach()};
  }

  // The example-weighted mean of the clients' updates (start - trained), full-batch steps.
  std::pair<at::Tensor, at::Tensor> mean_update(const at::Tensor& w, const at::Tensor& b, int steps, double lr) const {
    at::Tensor dw = at::zeros_like(w), db = at::zeros_like(b);
    for (int64_t i = 0; i < 3; ++i) {
      const auto [cw, cb] = local(i, w, b, steps, lr);
      dw += weight(i) * (w - cw);
      db += weight(i) * (b - cb);
    }
    return {dw / total_weight(), db / total_weight()};
  }

  // The federated loss at (w, b): the example-weighted mean of the clients' full-batch losses.
  double federated_loss(const at::Tensor& w, const at::Tensor& b) const {
    double total = 0;
    for (int64_t i = 0; i < 3; ++i) total += weight(i) * client_loss(i, w, b).item<double>();
    return total / total_weight();
  }

  double weight(int64_t i) const { return static_cast<double>(clients[i].size()); }
  double total_weight() const { return weight(0) + weight(1) + weight(2); }

  // Mean cross-entropy of client i at (w, b), differentiable.
  at::Tensor client_loss(int64_t i, const at::Tensor& w, const at::Tensor& b) const {
    return at::cross_entropy_loss(at::addmm(b, clients[i].x, w), clients[i].y);
  }

  std::vector<Examples> clients;
  std::unique_ptr<InMemoryDataset> data;
  TensorTree initial;
  std::unique_ptr<Model> model = std::make_unique<SoftmaxRegression>(3, 2);
  std::unique_ptr<Aggregation> aggregation;
  NonFinite nonfinite = NonFinite::stop;
  bool factor_input_layer = true;
  uint64_t seed = 0;  // the runs' seed
  std::optional<AsyncRound> async;  // an asynchronous step's versions, rows and staleness

  void expect_factored_fedavg_matches_autograd(std::unique_ptr<Model> m);
};

// FedAvgM with full-batch local steps (no shuffling involved): E = 2 steps per client, deltas
// averaged by example count, v = m v + avg, x -= server_lr v, for two rounds.
TEST_F(AlgorithmsTest, FedAvgWithMomentumMatchesAHandComputedRound) {
  const ServerState fax_state = run_plugin(
      "fedavg", {"client_lr=0.4", "local_epochs=2", "batch_size=0", "server_lr=0.7", "server_momentum=0.5"}, 2);
  at::Tensor w = initial.at("w"), b = initial.at("b");
  at::Tensor vw = at::zeros_like(w), vb = at::zeros_like(b);
  for (int round = 0; round < 2; ++round) {
    const auto [dw, db] = mean_update(w, b, 2, 0.4);
    vw = 0.5 * vw + dw;
    vb = 0.5 * vb + db;
    w = w - 0.7 * vw;
    b = b - 0.7 * vb;
  }
  EXPECT_TRUE(at::allclose(fax_state.params.at("w"), w, 1e-10, 1e-12)) << fax_state.params.at("w") << w;
  EXPECT_TRUE(at::allclose(fax_state.params.at("b"), b, 1e-10, 1e-12));
  EXPECT_TRUE(at::allclose(fax_state.extra.at("w"), vw, 1e-10, 1e-12)) << "momentum buffer";
}

// FedAdam / FedYogi / FedAdagrad: the server's moments on the mean update, two rounds by hand.
TEST_F(AlgorithmsTest, FedOptServerOptimizersMatchHandComputedRounds) {
  const double lr = 0.3, eta = 0.05, beta1 = 0.8, beta2 = 0.9, tau = 0.01;
  for (const std::string optimizer : {"adam", "yogi", "adagrad"}) {
    const ServerState fax_state =
        run_plugin("fedopt", {"client_lr=0.3", "batch_size=0", "server_optimizer=" + optimizer, "server_lr=0.05",
                              "beta1=0.8", "beta2=0.9", "tau=0.01"}, 2);
    TensorTree x = initial;
    TensorTree m = zeros_like(x), v = x.map([&](const at::Tensor& t) { return at::full_like(t, tau * tau); });
    for (int round = 0; round < 2; ++round) {
      const auto [dw, db] = mean_update(x.at("w"), x.at("b"), 1, lr);
      const TensorTree g{{"w", dw}, {"b", db}};
      m = zip_map(m, g, [&](const at::Tensor& mt, const at::Tensor& gt) { return beta1 * mt + (1 - beta1) * gt; });
      v = zip_map(v, g, [&](const at::Tensor& vt, const at::Tensor& gt) {
        const at::Tensor g2 = gt * gt;
        if (optimizer == "adam") return beta2 * vt + (1 - beta2) * g2;
        if (optimizer == "yogi") return vt - (1 - beta2) * g2 * at::sign(vt - g2);
        return vt + g2;
      });
      x = zip_map(x, zip_map(m, v, [&](const at::Tensor& mt, const at::Tensor& vt) { return mt / (vt.sqrt() + tau); }),
                  [&](const at::Tensor& xt, const at::Tensor& st) { return xt - eta * st; });
    }
    EXPECT_TRUE(at::allclose(fax_state.params.at("w"), x.at("w"), 1e-10, 1e-12)) << optimizer;
    EXPECT_TRUE(at::allclose(fax_state.extra.at("v/w"), v.at("w"), 1e-10, 1e-12)) << optimizer << " second moment";
  }
}

// FedProx: each client minimises loss + mu/2 |w - w_server|^2.
TEST_F(AlgorithmsTest, FedProxMatchesAHandComputedRound) {
  const double mu = 0.7;
  const ServerState fax_state =
      run_plugin("fedprox", {"client_lr=0.3", "local_epochs=3", "batch_size=0", "mu=0.7", "server_lr=1.0"}, 1);
  const at::Tensor w0 = initial.at("w"), b0 = initial.at("b");
  at::Tensor dw = at::zeros_like(w0);
  for (int64_t i = 0; i < 3; ++i) {
    const auto [cw, cb] = local(i, w0, b0, 3, 0.3, [&](const at::Tensor& w, const at::Tensor& b) {
      return 0.5 * mu * ((w - w0).pow(2).sum() + (b - b0).pow(2).sum());
    });
    dw += weight(i) * (w0 - cw);
  }
  EXPECT_TRUE(at::allclose(fax_state.params.at("w"), w0 - dw / total_weight(), 1e-10, 1e-12));
  // mu = 0 is FedAvg; mu > 0 must differ from it.
  const ServerState fedavg = run_plugin("fedavg", {"client_lr=0.3", "local_epochs=3", "batch_size=0"}, 1);
  EXPECT_FALSE(at::allclose(fax_state.params.at("w"), fedavg.params.at("w"), 1e-6, 1e-8));
}

// SCAFFOLD, option II, two rounds over the whole population (|S| / N = 1): the second round's
// local steps are corrected by c - c_i. With client momentum (rho) the correction is added after
// the momentum step, outside the velocity: v = g (then rho v + g), w -= lr (v + c - c_i).
TEST_F(AlgorithmsTest, ScaffoldMatchesHandComputedRounds) {
  const double lr = 0.3, server_lr = 0.9;
  // Three steps: with two, a correction inside the velocity would move each client's last step by
  // lr rho (c - c_i), which the mean over all clients cancels.
  const int steps = 3;
  for (const double rho : {0.0, 0.5}) {
    SCOPED_TRACE(rho);
    const ServerState fax_state = run_plugin(
        "scaffold", {"client_lr=0.3", "local_epochs=3", "batch_size=0", "server_lr=0.9", fmt::format("client_momentum={}", rho)}, 2);
    at::Tensor w = initial.at("w"), b = initial.at("b");
    at::Tensor cw = at::zeros_like(w), cb = at::zeros_like(b);
    std::vector<at::Tensor> ciw(3, at::zeros_like(w)), cib(3, at::zeros_like(b));
    for (int round = 0; round < 2; ++round) {
      at::Tensor dw = at::zeros_like(w), db = at::zeros_like(b), dcw = at::zeros_like(w), dcb = at::zeros_like(b);
      for (int64_t i = 0; i < 3; ++i) {
        at::Tensor yw = w.clone(), yb = b.clone(), vw, vb;
        for (int t = 0; t < steps; ++t) {
          const at::Tensor pw = yw.detach().requires_grad_(true), pb = yb.detach().requires_grad_(true);
          const auto g = torch::autograd::grad({client_loss(i, pw, pb)}, {pw, pb});
          vw = t == 0 ? g[0] : rho * vw + g[0];
          vb = t == 0 ? g[1] : rho * vb + g[1];
          yw = yw - lr * (vw + cw - ciw[i]);
          yb = yb - lr * (vb + cb - cib[i]);
        }
        const at::Tensor new_w = ciw[i] - cw + (w - yw) / (steps * lr);
        const at::Tensor new_b = cib[i] - cb + (b - yb) / (steps * lr);
        dcw += new_w - ciw[i];
        dcb += new_b - cib[i];
        ciw[i] = new_w;
        cib[i] = new_b;
        dw += w - yw;
        db += b - yb;
      }
      w = w - server_lr * dw / 3.0;
      b = b - server_lr * db / 3.0;
      cw = cw + dcw / 3.0;
      cb = cb + dcb / 3.0;
    }
    EXPECT_TRUE(at::allclose(fax_state.params.at("w"), w, 1e-9, 1e-11)) << fax_state.params.at("w") << w;
    EXPECT_TRUE(at::allclose(fax_state.params.at("b"), b, 1e-9, 1e-11));
    EXPECT_TRUE(at::allclose(fax_state.extra.at("control/w"), cw, 1e-9, 1e-11)) << "server control variate";
  }
}

// FedNova with client momentum over clients that take different numbers of local steps: each
// client holds n_i copies of one example, so every minibatch (of any size, in any order) has that
// example's gradient, and E = 2 epochs of batches of 2 are tau = 4, 8, 6 plain steps. By hand:
// momentum SGD (v = g at the first step, then v = rho v + g; w -= lr v), a_i = sum_{t=1..tau_i}
// (1 - rho^t) / (1 - rho), x -= server_lr sum_i p_i a_i * sum_i p_i (x - y_i) / a_i, two rounds.
TEST_F(AlgorithmsTest, FedNovaMatchesAHandComputedRound) {
  const double lr = 0.3, rho = 0.5, server_lr = 0.9;
  const std::vector<int64_t> sizes{4, 7, 5}, taus{4, 8, 6};
  clients.clear();
  for (int64_t n : sizes) {
    const at::Tensor x = at::randn({1, 3}, at::kDouble), y = at::randint(0, 2, {1}, at::kLong);
    clients.push_back({x.expand({n, 3}).contiguous(), y.expand({n}).contiguous()});
  }
  data = std::make_unique<InMemoryDataset>(clients, clients[0], 2);
  TensorTree metrics;
  const ServerState fax_state =
      run_plugin("fednova", {"client_lr=0.3", "local_epochs=2", "batch_size=2", "client_momentum=0.5", "server_lr=0.9"},
                 2, &metrics);
  at::Tensor w = initial.at("w"), b = initial.at("b");
  double tau_eff = 0;
  for (int round = 0; round < 2; ++round) {
    at::Tensor dw = at::zeros_like(w), db = at::zeros_like(b);
    tau_eff = 0;
    for (int64_t i = 0; i < 3; ++i) {
      at::Tensor cw = w.clone(), cb = b.clone(), vw, vb;
      double a = 0;
      for (int64_t t = 1; t <= taus[i]; ++t) {
        const at::Tensor pw = cw.detach().requires_grad_(true), pb = cb.detach().requires_grad_(true);
        const auto g = torch::autograd::grad({client_loss(i, pw, pb)}, {pw, pb});
        vw = t == 1 ? g[0] : rho * vw + g[0];
        vb = t == 1 ? g[1] : rho * vb + g[1];
        cw = cw - lr * vw;
        cb = cb - lr * vb;
        a += (1 - std::pow(rho, t)) / (1 - rho);
      }
      const double p = weight(i) / total_weight();
      dw += p * (w - cw) / a;
      db += p * (b - cb) / a;
      tau_eff += p * a;
    }
    w = w - server_lr * tau_eff * dw;
    b = b - server_lr * tau_eff * db;
  }
  EXPECT_TRUE(at::allclose(fax_state.params.at("w"), w, 1e-10, 1e-12)) << fax_state.params.at("w") << w;
  EXPECT_TRUE(at::allclose(fax_state.params.at("b"), b, 1e-10, 1e-12));
  EXPECT_NEAR(metrics.at("train/tau_eff").item<double>(), tau_eff, 1e-12);
  // Without momentum and with every client taking the same steps (full batches), FedNova is FedAvg.
  const ServerState nova = run_plugin("fednova", {"client_lr=0.3", "local_epochs=3", "batch_size=0"}, 1);
  const ServerState fedavg = run_plugin("fedavg", {"client_lr=0.3", "local_epochs=3", "batch_size=0"}, 1);
  EXPECT_TRUE(at::allclose(nova.params.at("w"), fedavg.params.at("w"), 1e-12, 1e-14));
}

// An asynchronous step by hand: the server is at version 2 (each version the last plus noise);
// client 0 started from v2 (staleness 0), client 1 from v1, client 2 from v0 (staleness 1 and 2).
// Each trains E = 2 full-batch steps from its own start, Delta_i = start_i - trained_i, s_i = s(tau_i).
//   FedBuff:  x -= server_lr sum_i n_i s_i Delta_i / sum_i n_i
//   FedAsync: x -= alpha sum_i n_i s_i ((x - start_i) + Delta_i) / sum_i n_i
// (with one client: x = (1 - alpha s) x + alpha s trained, the paper's mixing).
TEST_F(AlgorithmsTest, FedBuffAndFedAsyncMatchHandComputedSteps) {
  const double lr = 0.3;
  const TensorTree v0 = initial;
  const TensorTree v1{{"w", v0.at("w") + 0.1 * at::randn({3, 2}, at::kDouble)}, {"b", v0.at("b") + 0.05}};
  const TensorTree v2{{"w", v1.at("w") + 0.1 * at::randn({3, 2}, at::kDouble)}, {"b", v1.at("b") - 0.03}};
  const std::vector<const TensorTree*> start{&v2, &v1, &v0};
  const std::vector<int64_t> tau{0, 1, 2};
  // The step's distinct versions in version order (v0, v1, v2), each client's among them.
  async = AsyncRound{join({prefixed(v0, "0/"), prefixed(v1, "1/"), prefixed(v2, "2/")}),
                     at::tensor({2, 1, 0}, at::kLong), at::tensor(tau, at::kLong)};
  const TensorTree& v_now = v2;
  initial = v2;
  const auto by_hand = [&](const std::function<double(int64_t)>& s, bool mix, double rate) {
    at::Tensor w = v_now.at("w").clone(), b = v_now.at("b").clone();
    for (int64_t i = 0; i < 3; ++i) {
      const at::Tensor& sw = start[i]->at("w");
      const at::Tensor& sb = start[i]->at("b");
      const auto [cw, cb] = local(i, sw, sb, 2, lr);
      const double f = rate * weight(i) * s(tau[i]) / total_weight();
      w -= f * ((sw - cw) + (mix ? v_now.at("w") - sw : at::zeros_like(sw)));
      b -= f * ((sb - cb) + (mix ? v_now.at("b") - sb : at::zeros_like(sb)));
    }
    return TensorTree{{"w", w}, {"b", b}};
  };
  const auto expect_close = [](const TensorTree& fax, const TensorTree& hand) {
    for (const char* leaf : {"w", "b"})
      EXPECT_TRUE(at::allclose(fax.at(leaf), hand.at(leaf), 1e-10, 1e-12)) << leaf << fax.at(leaf) << hand.at(leaf);
  };
  const std::vector<std::string> client{"client_lr=0.3", "local_epochs=2", "batch_size=0"};
  // FedBuff's 1 / sqrt(1 + tau); a hinge at b = 1 with slope 2 (1, 1, 1/3); constant weights.
  expect_close(run_plugin("fedbuff", join_settings(client, {"server_lr=0.8"}), 1).params,
               by_hand([](int64_t t) { return 1 / std::sqrt(1.0 + t); }, false, 0.8));
  expect_close(run_plugin("fedbuff", join_settings(client, {"staleness=hinge", "staleness_a=2", "staleness_b=1"}), 1).params,
               by_hand([](int64_t t) { return t <= 1 ? 1.0 : 1 / (2.0 * (t - 1) + 1); }, false, 1.0));
  expect_close(run_plugin("fedbuff", join_settings(client, {"staleness=constant"}), 1).params,
               by_hand([](int64_t) { return 1.0; }, false, 1.0));
  expect_close(run_plugin("fedasync", join_settings(client, {"alpha=0.6", "staleness_a=1"}), 1).params,
               by_hand([](int64_t t) { return 1 / (1.0 + t); }, true, 0.6));
  // A synchronous round gives an asynchronous algorithm nothing to start from: refused, naming why.
  async.reset();
  EXPECT_NE(test::error_of([&] { run_plugin("fedbuff", client, 1); }).find("cohort.concurrency > 0"), std::string::npos);
}

// The server learning rate's hypergradient dL(x - eta Delta)/d eta, from federated AD, against
// central differences of the post-round federated loss; hyper_lr = 0 keeps eta fixed.
TEST_F(AlgorithmsTest, HypergradientMatchesFiniteDifferencesInTheServerLr) {
  const double eta = 0.8, lr = 0.3;
  TensorTree metrics;
  run_plugin("hypergrad_fedavg", {"client_lr=0.3", "batch_size=0", "server_lr=0.8", "hyper_lr=0"}, 1, &metrics);
  const auto [dw, db] = mean_update(initial.at("w"), initial.at("b"), 1, lr);
  auto post_round = [&](double e) { return federated_loss(initial.at("w") - e * dw, initial.at("b") - e * db); };
  const double h = 1e-6;
  const double numeric = (post_round(eta + h) - post_round(eta - h)) / (2 * h);
  EXPECT_NEAR(metrics.at("hyper/server_lr_grad").item<double>(), numeric, 1e-7);
  EXPECT_NEAR(metrics.at("hyper/post_round_loss").item<double>(), post_round(eta), 1e-10);
  EXPECT_NEAR(metrics.at("server/lr").item<double>(), eta, 1e-12) << "hyper_lr = 0 must keep the rate";

  // A positive step moves log(eta) against the hypergradient: log eta' = log eta - 0.1 eta g.
  run_plugin("hypergrad_fedavg", {"client_lr=0.3", "batch_size=0", "server_lr=0.8", "hyper_lr=0.1"}, 1, &metrics);
  EXPECT_NEAR(metrics.at("server/lr").item<double>(), eta * std::exp(-0.1 * eta * numeric), 1e-7);
}

// The client learning rate's hypergradient, through two local steps (second order).
TEST_F(AlgorithmsTest, HypergradientMatchesFiniteDifferencesInTheClientLr) {
  const double eta = 0.8, lr = 0.3;
  TensorTree metrics;
  run_plugin("hypergrad_fedavg", {"client_lr=0.3", "local_epochs=2", "batch_size=0", "server_lr=0.8", "hyper_lr=0",
                                  "learn_client_lr=true", "client_hyper_lr=0"}, 1, &metrics);
  auto post_round = [&](double l) {
    const auto [dw, db] = mean_update(initial.at("w"), initial.at("b"), 2, l);
    return federated_loss(initial.at("w") - eta * dw, initial.at("b") - eta * db);
  };
  const double h = 1e-6;
  const double numeric = (post_round(lr + h) - post_round(lr - h)) / (2 * h);
  EXPECT_NEAR(metrics.at("hyper/client_lr_grad").item<double>(), numeric, 1e-7);
  EXPECT_GT(std::abs(numeric), 1e-4) << "a flat objective checks nothing";

  // Through a secure sum (whose adjoint is a broadcast) on a fine grid: the same hypergradient,
  // to within what the grid changes of the update.
  use_aggregation("secure_sum", {"aggregation.secure_sum.range=64", "aggregation.secure_sum.masks=true"});
  run_plugin("hypergrad_fedavg", {"client_lr=0.3", "local_epochs=2", "batch_size=0", "server_lr=0.8", "hyper_lr=0",
                                  "learn_client_lr=true", "client_hyper_lr=0"}, 1, &metrics);
  EXPECT_NEAR(metrics.at("hyper/client_lr_grad").item<double>(), numeric, 1e-6);
  EXPECT_EQ(metrics.at("aggregation/secure_overflows").item<double>(), 0);
}

// DP-FedAvg without noise: clipped updates, summed, divided by the cohort size; adaptive clipping
// moves C by exp(-clip_lr (fraction unclipped - target)).
TEST_F(AlgorithmsTest, DpFedAvgClipsAndAdaptsTheClipNorm) {
  const double clip = 0.05;
  TensorTree metrics;
  const ServerState fax_state =
      run_plugin("dp_fedavg", {"client_lr=0.5", "batch_size=0", "noise_multiplier=0", "clip_norm=0.05",
                               "adaptive_clipping=true", "target_quantile=0.5", "clip_lr=0.3", "server_lr=1.0"}, 1,
                 &metrics);
  EXPECT_TRUE(std::isinf(metrics.at("privacy/epsilon").item<double>())) << "no noise, no privacy";
  at::Tensor sw = at::zeros_like(initial.at("w"));
  int unclipped = 0;
  for (int64_t i = 0; i < 3; ++i) {
    const auto [cw, cb] = local(i, initial.at("w"), initial.at("b"), 1, 0.5);
    const at::Tensor dw = initial.at("w") - cw, db = initial.at("b") - cb;
    const double norm = std::sqrt(dw.pow(2).sum().item<double>() + db.pow(2).sum().item<double>());
    unclipped += norm <= clip;
    sw += dw * std::min(1.0, clip / norm);
  }
  EXPECT_TRUE(at::allclose(fax_state.params.at("w"), initial.at("w") - sw / 3.0, 1e-10, 1e-12));
  EXPECT_NEAR(fax_state.extra.at("clip/norm").item<double>(), clip * std::exp(-0.3 * (unclipped / 3.0 - 0.5)), 1e-12);
}

// The noise on the sum has standard deviation z C: compare a noised run with the noiseless one on
// a model with enough coordinates to measure it.
TEST_F(AlgorithmsTest, DpFedAvgNoiseHasTheConfiguredScale) {
  std::vector<Examples> wide;
  for (int64_t n : {6, 4, 5}) wide.push_back({at::randn({n, 200}, at::kDouble), at::randint(0, 10, {n}, at::kLong)});
  data = std::make_unique<InMemoryDataset>(wide, wide[0], 10);
  model = std::make_unique<SoftmaxRegression>(200, 10);
  initial = TensorTree{{"w", at::zeros({200, 10}, at::kDouble)}, {"b", at::zeros({10}, at::kDouble)}};
  TensorTree metrics;
  const auto settings = [](const std::string& z) {
    return std::vector<std::string>{"client_lr=0.1", "batch_size=0", "clip_norm=0.5", "noise_multiplier=" + z, "server_lr=1.0"};
  };
  const ServerState noiseless = run_plugin("dp_fedavg", settings("0"), 1);
  const ServerState noised = run_plugin("dp_fedavg", settings("2.0"), 1, &metrics);
  // params = x - (sum + noise) / 3: the difference times 3 is the noise, std z C = 1.
  const at::Tensor noise = (noiseless.params.at("w") - noised.params.at("w")) * 3.0;
  EXPECT_NEAR(noise.std().item<double>(), 2.0 * 0.5, 0.08);
  EXPECT_NEAR(noise.mean().item<double>(), 0.0, 0.08);
  // Sampling rate 3/3 = 1, one round: the Gaussian mechanism's epsilon at delta 1e-5.
  EXPECT_NEAR(metrics.at("privacy/epsilon").item<double>(), sgm_epsilon(1.0, 2.0, 1, 1e-5).epsilon, 1e-12);
}

// The pipeline clip, gaussian under FedAvg is DP-FedAvg with a fixed clip: the clipped updates
// summed unweighted, the same noise stream on the sum, divided by the cohort size.
TEST_F(AlgorithmsTest, ClipAndGaussianStagesAreDpFedAvg) {
  const double clip = 0.05, z = 0.7;
  use_aggregation("clip,gaussian", {"aggregation.clip.norm=0.05", "aggregation.gaussian.noise_multiplier=0.7"});
  TensorTree metrics;
  const ServerState piped = run_plugin("fedavg", {"client_lr=0.5", "batch_size=0"}, 1, &metrics);
  aggregation.reset();
  const ServerState dp = run_plugin("dp_fedavg", {"client_lr=0.5", "batch_size=0", "clip_norm=0.05", "noise_multiplier=0.7"}, 1);
  EXPECT_THROW(run_plugin("dp_fedavg", {"clip_norm=0.05", "delta=1"}, 1), Error);
  for (const auto& [name, t] : dp.params) EXPECT_TRUE(at::allclose(piped.params.at(name), t, 1e-12, 1e-14)) << name;
  // By hand, the clip and the share clipped.
  at::Tensor total = at::zeros({8}, at::kDouble);
  int clipped = 0;
  for (int64_t i = 0; i < 3; ++i) {
    const at::Tensor d = flat_update(i, 1, 0.5);
    const double norm = d.norm().item<double>();
    clipped += norm > clip;
    total += d * std::min(1.0, clip / norm);
  }
  EXPECT_GT(clipped, 0) << "a clip that clips nothing checks nothing";
  at::Generator g = server_generator(0, 0, 0x6e6f697365);
  const at::Tensor noise_w = at::randn({3, 2}, g, at::kDouble), noise_b = at::randn({2}, g, at::kDouble);
  const at::Tensor expected_w = initial.at("w") - (total.narrow(0, 0, 6).view({3, 2}) + noise_w * z * clip) / 3.0;
  EXPECT_TRUE(at::allclose(piped.params.at("w"), expected_w, 1e-12, 1e-14));
  EXPECT_NEAR(metrics.at("aggregation/clipped_fraction").item<double>(), clipped / 3.0, 1e-15);
  EXPECT_NEAR(metrics.at("privacy/epsilon").item<double>(), sgm_epsilon(1.0, z, 1, 1e-5).epsilon, 1e-12);
  // The PLD accountant changes the ledger, not the model: a smaller epsilon for the same round.
  use_aggregation("clip,gaussian", {"aggregation.clip.norm=0.05", "aggregation.gaussian.noise_multiplier=0.7",
                                    "aggregation.gaussian.accountant=pld", "aggregation.gaussian.pld_interval=1e-4"});
  TensorTree pld_metrics;
  const ServerState pld = run_plugin("fedavg", {"client_lr=0.5", "batch_size=0"}, 1, &pld_metrics);
  for (const auto& [name, t] : piped.params) EXPECT_TRUE(at::equal(pld.params.at(name), t)) << name;
  const double epsilon = pld_metrics.at("privacy/epsilon").item<double>();
  EXPECT_NEAR(epsilon, sgm_epsilon_pld(1.0, z, 1, 1e-5, 1e-4), 1e-12);
  EXPECT_LT(epsilon, metrics.at("privacy/epsilon").item<double>());
  EXPECT_THROW(use_aggregation("clip,gaussian", {"aggregation.gaussian.accountant=pld", "aggregation.gaussian.delta=1e-10"}),
               Error);
  EXPECT_THROW(use_aggregation("clip,gaussian", {"aggregation.gaussian.delta=1"}), Error);
}

// Adaptive clipping (Andrew et al. 2021) over two rounds by hand: C starts at `norm` and moves by
// exp(-clip_lr (unclipped share - target)) after each round; the second round clips with the
// moved C, which is server state in the algorithm's extra (so checkpointed) under aggregation/.
TEST_F(AlgorithmsTest, AdaptiveClipMatchesTwoHandComputedRounds) {
  use_aggregation("clip", {"aggregation.clip.norm=0.05", "aggregation.clip.adaptive=true",
                           "aggregation.clip.target_quantile=0.5", "aggregation.clip.clip_lr=0.3"});
  TensorTree metrics;
  const ServerState fax_state = run_plugin("fedavg", {"client_lr=0.5", "batch_size=0"}, 2, &metrics);
  at::Tensor w = initial.at("w"), b = initial.at("b");
  double clip = 0.05;
  std::vector<int> unclipped_per_round;
  for (int r = 0; r < 2; ++r) {
    at::Tensor dw = at::zeros_like(w), db = at::zeros_like(b);
    int unclipped = 0;
    for (int64_t i = 0; i < 3; ++i) {
      const auto [cw, cb] = local(i, w, b, 1, 0.5);
      const at::Tensor uw = w - cw, ub = b - cb;
      const double norm = std::sqrt(uw.pow(2).sum().item<double>() + ub.pow(2).sum().item<double>());
      unclipped += norm <= clip;
      dw += weight(i) * uw * std::min(1.0, clip / norm);
      db += weight(i) * ub * std::min(1.0, clip / norm);
    }
    unclipped_per_round.push_back(unclipped);
    w = w - dw / total_weight();
    b = b - db / total_weight();
    if (r == 1) {
      EXPECT_NEAR(metrics.at("aggregation/clip_norm").item<double>(), clip, 1e-15);
      EXPECT_NEAR(metrics.at("aggregation/unclipped_estimate").item<double>(), unclipped / 3.0, 1e-15);
    }
    clip *= std::exp(-0.3 * (unclipped / 3.0 - 0.5));
  }
  EXPECT_LT(unclipped_per_round[1], 3) << "the second round must clip for its C to matter";
  EXPECT_TRUE(at::allclose(fax_state.params.at("w"), w, 1e-12, 1e-14));
  EXPECT_TRUE(at::allclose(fax_state.params.at("b"), b, 1e-12, 1e-14));
  ASSERT_TRUE(fax_state.extra.contains("aggregation/clip/norm"));
  EXPECT_NEAR(fax_state.extra.at("aggregation/clip/norm").item<double>(), clip, 1e-15);
  // A step that drives C to 0 or infinity (a huge count noise) stops the run, naming the round,
  // rather than zeroing every later update.
  use_aggregation("clip", {"aggregation.clip.adaptive=true", "aggregation.clip.count_noise=1e6",
                           "aggregation.clip.clip_lr=1000"});
  try {
    run_plugin("fedavg", {"client_lr=0.5", "batch_size=0"}, 1);
    ADD_FAILURE() << "a clip norm of 0 or infinity was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("round 1: the adaptive clip norm moved from 1 to "), std::string::npos) << e.what();
  }
}

// With gaussian the unclipped count is released with noise N(0, count_noise^2) (its own stream)
// and the ledger charges both releases at (z^-2 + (2 count_noise)^-2)^-1/2; without count noise
// the pipeline is refused.
TEST_F(AlgorithmsTest, AdaptiveClipWithGaussianChargesTheCountToTheLedger) {
  const double z = 0.7, sigma = 1.5;
  use_aggregation("clip,gaussian", {"aggregation.clip.norm=0.05", "aggregation.clip.adaptive=true",
                                    "aggregation.clip.count_noise=1.5", "aggregation.gaussian.noise_multiplier=0.7"});
  TensorTree metrics;
  const ServerState state = run_plugin("fedavg", {"client_lr=0.5", "batch_size=0"}, 1, &metrics);
  int unclipped = 0;
  for (int64_t i = 0; i < 3; ++i) unclipped += flat_update(i, 1, 0.5).norm().item<double>() <= 0.05;
  at::Generator g = server_generator(0, 0, 0x636f756e74);
  const double share = (unclipped - 1.5 + sigma * at::randn({1}, g, at::kDouble).item<double>()) / 3.0 + 0.5;
  EXPECT_NEAR(metrics.at("aggregation/unclipped_estimate").item<double>(), share, 1e-14);
  EXPECT_NEAR(state.extra.at("aggregation/clip/norm").item<double>(), 0.05 * std::exp(-0.2 * (share - 0.5)), 1e-15);
  EXPECT_NEAR(metrics.at("privacy/sensitivity").item<double>(), 0.05, 1e-15);
  const double combined = 1 / std::sqrt(1 / (z * z) + 1 / (4 * sigma * sigma));
  EXPECT_NEAR(metrics.at("privacy/epsilon").item<double>(), sgm_epsilon(1.0, combined, 1, 1e-5).epsilon, 1e-12);
  EXPECT_GT(metrics.at("privacy/epsilon").item<double>(), sgm_epsilon(1.0, z, 1, 1e-5).epsilon);
  EXPECT_NEAR(combined, combined_noise_multiplier(z, sigma), 1e-15);
  // Round 2 noises with the moved C: its sensitivity is the C it logs, not the initial one.
  TensorTree second;
  run_plugin("fedavg", {"client_lr=0.5", "batch_size=0"}, 2, &second);
  EXPECT_NEAR(second.at("aggregation/clip_norm").item<double>(), state.extra.at("aggregation/clip/norm").item<double>(),
              1e-15);
  EXPECT_EQ(second.at("privacy/sensitivity").item<double>(), second.at("aggregation/clip_norm").item<double>());
  EXPECT_NE(second.at("privacy/sensitivity").item<double>(), 0.05);
  try {
    use_aggregation("clip,gaussian", {"aggregation.clip.adaptive=true"});
    ADD_FAILURE() << "adaptive clipping without count noise was accepted with gaussian";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("aggregation.clip.count_noise is 0 with adaptive clipping and gaussian"),
              std::string::npos) << e.what();
  }
}

// Per-layer clipping: each of the L = 2 tensors to C / sqrt(2); the example-weighted mean.
TEST_F(AlgorithmsTest, PerLayerClipMatchesAHandComputedRound) {
  const double bound = 0.05 / std::sqrt(2.0);
  use_aggregation("clip", {"aggregation.clip.norm=0.05", "aggregation.clip.per_layer=true"});
  const ServerState fax_state = run_plugin("fedavg", {"client_lr=0.5", "batch_size=0"}, 1);
  at::Tensor dw = at::zeros_like(initial.at("w")), db = at::zeros_like(initial.at("b"));
  for (int64_t i = 0; i < 3; ++i) {
    const auto [cw, cb] = local(i, initial.at("w"), initial.at("b"), 1, 0.5);
    const at::Tensor uw = initial.at("w") - cw, ub = initial.at("b") - cb;
    dw += weight(i) * uw * std::min(1.0, bound / uw.norm().item<double>());
    db += weight(i) * ub * std::min(1.0, bound / ub.norm().item<double>());
  }
  EXPECT_TRUE(at::allclose(fax_state.params.at("w"), initial.at("w") - dw / total_weight(), 1e-12, 1e-14));
  EXPECT_TRUE(at::allclose(fax_state.params.at("b"), initial.at("b") - db / total_weight(), 1e-12, 1e-14));
}

// Robust aggregators over five clients, two of them byzantine (sign-flipped updates): the
// coordinate median, the trimmed mean and multi-Krum, each by hand from the sent updates.
TEST_F(AlgorithmsTest, RobustAggregatorsMatchHandComputedStatistics) {
  clients.clear();
  for (int64_t n : {4, 7, 5, 6, 3}) clients.push_back({at::randn({n, 3}, at::kDouble), at::randint(0, 2, {n}, at::kLong)});
  data = std::make_unique<InMemoryDataset>(clients, clients[0], 2);
  const std::vector<std::string> byzantine{"clients.byzantine.fraction=0.4", "clients.byzantine.kind=sign_flip"};
  use_aggregation("median", byzantine);
  std::vector<at::Tensor> sent;
  int attackers = 0;
  for (int64_t i = 0; i < 5; ++i) {
    const bool attacker = aggregation->byzantine(i);
    attackers += attacker;
    sent.push_back(flat_update(i, 2, 0.3) * (attacker ? -1.0 : 1.0));
  }
  ASSERT_EQ(attackers, 2);
  const at::Tensor rows = at::stack(sent);
  const at::Tensor sorted = std::get<0>(rows.sort(0));
  const auto check = [&](const ServerState& s, const at::Tensor& statistic, const char* what) {
    const at::Tensor expected_w = initial.at("w") - statistic.narrow(0, 0, 6).view({3, 2});
    EXPECT_TRUE(at::allclose(s.params.at("w"), expected_w, 1e-12, 1e-14)) << what;
  };
  check(run_plugin("fedavg", {"client_lr=0.3", "local_epochs=2", "batch_size=0"}, 1), sorted[2], "median");
  use_aggregation("trimmed_mean", join_settings(byzantine, {"aggregation.trimmed_mean.trim=0.2"}));
  check(run_plugin("fedavg", {"client_lr=0.3", "local_epochs=2", "batch_size=0"}, 1), sorted.narrow(0, 1, 3).mean(0),
        "trimmed mean");
  // Multi-Krum, f = 1, m = 2: score_i = the sum of the n - f - 2 = 2 smallest squared distances
  // to the others; the mean of the two best.
  use_aggregation("krum", join_settings(byzantine, {"aggregation.krum.byzantine=1", "aggregation.krum.select=2"}));
  std::vector<std::pair<double, int64_t>> scores;
  for (int64_t i = 0; i < 5; ++i) {
    std::vector<double> d;
    for (int64_t j = 0; j < 5; ++j)
      if (j != i) d.push_back((rows[i] - rows[j]).pow(2).sum().item<double>());
    std::sort(d.begin(), d.end());
    scores.emplace_back(d[0] + d[1], i);
  }
  std::sort(scores.begin(), scores.end());
  const int64_t a = std::min(scores[0].second, scores[1].second), b = std::max(scores[0].second, scores[1].second);
  check(run_plugin("fedavg", {"client_lr=0.3", "local_epochs=2", "batch_size=0"}, 1), (rows[a] + rows[b]) / 2, "krum");
}

// Compression by hand over two rounds: top-k with error feedback (what a client did not send in
// round 1 is added to its round-2 update), deterministic quantization, and random-k (unbiased:
// scaled by P / k) on the coordinates drawn from each client's stream. Bits as counted.
TEST_F(AlgorithmsTest, CompressionStagesMatchHandComputedRounds) {
  const double lr = 0.5;
  const std::vector<std::string> fedavg{"client_lr=0.5", "batch_size=0"};
  const auto update_from = [&](int64_t i, const at::Tensor& w, const at::Tensor& b) {
    const auto [cw, cb] = local(i, w, b, 1, lr);
    return at::cat({(w - cw).flatten(), b - cb});
  };
  const auto step = [&](const at::Tensor& w, const at::Tensor& b, const std::vector<at::Tensor>& sent) {
    at::Tensor mean = at::zeros({8}, at::kDouble);
    for (int64_t i = 0; i < 3; ++i) mean += weight(i) * sent[i];
    mean /= total_weight();
    return std::make_pair(w - mean.narrow(0, 0, 6).view({3, 2}), b - mean.narrow(0, 6, 2));
  };
  const auto top2 = [](const at::Tensor& v) {
    const at::Tensor index = std::get<1>(v.abs().topk(2));
    return at::zeros_like(v).index_put({index}, v.index({index}));
  };
  const auto expect_params = [&](const ServerState& s, const std::pair<at::Tensor, at::Tensor>& wb, const char* what) {
    EXPECT_TRUE(at::allclose(s.params.at("w"), wb.first, 1e-12, 1e-14)) << what << s.params.at("w") << wb.first;
    EXPECT_TRUE(at::allclose(s.params.at("b"), wb.second, 1e-12, 1e-14)) << what;
  };
  TensorTree metrics;

  use_aggregation("top_k", {"aggregation.top_k.fraction=0.25", "aggregation.top_k.error_feedback=true"});
  std::vector<at::Tensor> sent, error;
  for (int64_t i = 0; i < 3; ++i) {
    const at::Tensor u = update_from(i, initial.at("w"), initial.at("b"));
    sent.push_back(top2(u));
    error.push_back(u - sent.back());
  }
  const auto round1 = step(initial.at("w"), initial.at("b"), sent);
  for (int64_t i = 0; i < 3; ++i) sent[i] = top2(update_from(i, round1.first, round1.second) + error[i]);
  expect_params(run_plugin("fedavg", fedavg, 2, &metrics), step(round1.first, round1.second, sent), "top_k");
  EXPECT_EQ(metrics.at("aggregation/bits_sent").item<double>(), 2 * (64 + 3));  // values and 3-bit indices
  use_aggregation("top_k", {"aggregation.top_k.fraction=0.25"});
  expect_params(run_plugin("fedavg", fedavg, 2), [&] {
    for (int64_t i = 0; i < 3; ++i) sent[i] = top2(update_from(i, round1.first, round1.second));
    return step(round1.first, round1.second, sent);
  }(), "top_k without error feedback");

  // 2 bits: each tensor to 4 levels from its min to its max.
  use_aggregation("quantize", {"aggregation.quantize.bits=2", "aggregation.quantize.stochastic=false"});
  for (int64_t i = 0; i < 3; ++i) {
    const at::Tensor u = update_from(i, initial.at("w"), initial.at("b"));
    std::vector<at::Tensor> parts;
    for (const at::Tensor& x : {u.narrow(0, 0, 6), u.narrow(0, 6, 2)}) {
      const double lo = x.min().item<double>(), hi = x.max().item<double>(), h = (hi - lo) / 3;
      parts.push_back(lo + ((x - lo) / h).round() * h);
    }
    sent[i] = at::cat(parts);
  }
  EXPECT_FALSE(at::allclose(sent[0], update_from(0, initial.at("w"), initial.at("b")))) << "a quantizer that changes nothing";
  expect_params(run_plugin("fedavg", fedavg, 1, &metrics), step(initial.at("w"), initial.at("b"), sent), "quantize");
  EXPECT_EQ(metrics.at("aggregation/bits_sent").item<double>(), (6 * 2 + 128) + (2 * 2 + 128));

  use_aggregation("random_k", {"aggregation.random_k.fraction=0.25"});
  for (int64_t i = 0; i < 3; ++i) {
    at::Generator g = client_generator(0 ^ 0x636f6d70, 0, i);
    const at::Tensor index = at::randperm(8, g, at::kLong).narrow(0, 0, 2);
    const at::Tensor u = update_from(i, initial.at("w"), initial.at("b"));
    sent[i] = at::zeros_like(u).index_put({index}, u.index({index}) * 4.0);
  }
  expect_params(run_plugin("fedavg", fedavg, 1, &metrics), step(initial.at("w"), initial.at("b"), sent), "random_k");
  EXPECT_EQ(metrics.at("aggregation/bits_sent").item<double>(), 2 * 64);  // values only: the server knows the seed
}

// secure_sum in FedAvg's round: each client's example-weighted update rounded to the grid,
// clipped to it, summed as integers, wrapped modulo 2^b; worked out here with the wrap written as
// ((S + 2^(b-1)) mod 2^b) - 2^(b-1). A wide range is the plain round to within the grid; a narrow
// one wraps, and the overflows and clipped values are counted.
TEST_F(AlgorithmsTest, SecureSumStageMatchesHandComputedRounds) {
  const std::vector<std::string> fedavg{"client_lr=0.5", "batch_size=0"};
  const ServerState plain = run_plugin("fedavg", fedavg, 1);
  struct Expected {
    at::Tensor w, b;
    double overflows = 0, clipped = 0;
  };
  const auto by_hand = [&](double range, int bits) {
    const double step = 2 * range / std::ldexp(1.0, bits), half = std::ldexp(1.0, bits - 1);
    at::Tensor total = at::zeros({8}, at::kLong);
    Expected e;
    for (int64_t i = 0; i < 3; ++i) {
      // Weighted by example count over the cohort's mean count.
      const at::Tensor q = (weight(i) * 3 / total_weight() * flat_update(i, 1, 0.5) / step).round();
      e.clipped += q.lt(-half).logical_or(q.gt(half - 1)).to(at::kDouble).mean().item<double>() / 3;
      total += q.clamp(-half, half - 1).to(at::kLong);
    }
    const auto h = static_cast<int64_t>(half);
    e.overflows = total.lt(-h).logical_or(total.gt(h - 1)).sum().item<double>();
    const at::Tensor mean = (((total + h).remainder(2 * h) - h).to(at::kDouble) * step) / 3;
    e.w = initial.at("w") - mean.narrow(0, 0, 6).view({3, 2});
    e.b = initial.at("b") - mean.narrow(0, 6, 2);
    return e;
  };
  TensorTree metrics;
  for (const double range : {4.0, 0.01}) {
    use_aggregation("secure_sum", {"aggregation.secure_sum.bits=12", "aggregation.secure_sum.range=" + std::to_string(range),
                                   "aggregation.secure_sum.masks=true"});
    const ServerState secure = run_plugin("fedavg", fedavg, 1, &metrics);
    const Expected e = by_hand(range, 12);
    EXPECT_TRUE(at::allclose(secure.params.at("w"), e.w, 1e-12, 1e-14)) << range << secure.params.at("w") << e.w;
    EXPECT_TRUE(at::allclose(secure.params.at("b"), e.b, 1e-12, 1e-14)) << range;
    EXPECT_EQ(metrics.at("aggregation/secure_overflows").item<double>(), e.overflows) << range;
    EXPECT_NEAR(metrics.at("aggregation/secure_clipped").item<double>(), e.clipped, 1e-15) << range;
    EXPECT_EQ(metrics.at("aggregation/bits_sent").item<double>(), 8 * 12);
    if (range > 1) {
      EXPECT_EQ(e.overflows + e.clipped, 0) << "the wide range must hold every value and the sum";
      const double step = 2 * range / 4096;
      EXPECT_TRUE(at::allclose(secure.params.at("w"), plain.params.at("w"), 0, step / 2));
    } else {
      EXPECT_GT(e.overflows, 0) << "the narrow range must wrap";
      EXPECT_GT(e.clipped, 0) << "the narrow range must clip";
    }
  }
}

// Gaussian noise after stages that round: its scale is z times the bound on one client's
// contribution, the clip norm grown by the rounding (deterministic 2-bit quantize: by
// sqrt(6) C / 3, 6 the largest tensor's size; secure_sum: by sqrt(P) step / 2), and on a secure
// sum the noise is added to the integers, then wrapped. Worked out by hand for both; stages
// whose output has no bound are refused.
TEST_F(AlgorithmsTest, GaussianAfterRoundingStagesMatchesHandComputedRounds) {
  const double clip = 0.05, z = 0.7;
  const std::vector<std::string> fedavg{"client_lr=0.5", "batch_size=0"};
  const auto clipped = [&](int64_t i) {
    const at::Tensor d = flat_update(i, 1, 0.5);
    return d * std::min(1.0, clip / d.norm().item<double>());
  };
  const auto noise = [&] {
    at::Generator g = server_generator(0, 0, 0x6e6f697365);
    const at::Tensor w = at::randn({3, 2}, g, at::kDouble), b = at::randn({2}, g, at::kDouble);
    return at::cat({w.flatten(), b});
  };
  TensorTree metrics;
  const auto expect_round = [&](const at::Tensor& mean, const char* what) {
    const ServerState s = run_plugin("fedavg", fedavg, 1, &metrics);
    EXPECT_TRUE(at::allclose(s.params.at("w"), initial.at("w") - mean.narrow(0, 0, 6).view({3, 2}), 1e-12, 1e-14)) << what;
    EXPECT_TRUE(at::allclose(s.params.at("b"), initial.at("b") - mean.narrow(0, 6, 2), 1e-12, 1e-14)) << what;
  };

  use_aggregation("clip,quantize,gaussian", {"aggregation.clip.norm=0.05", "aggregation.quantize.bits=2",
                                             "aggregation.quantize.stochastic=false",
                                             "aggregation.gaussian.noise_multiplier=0.7"});
  at::Tensor total = at::zeros({8}, at::kDouble);
  for (int64_t i = 0; i < 3; ++i) {
    const at::Tensor u = clipped(i);
    for (const at::Tensor& x : {u.narrow(0, 0, 6), u.narrow(0, 6, 2)}) {
      const double lo = x.min().item<double>(), hi = x.max().item<double>(), h = (hi - lo) / 3;
      total.narrow(0, x.data_ptr<double>() - u.data_ptr<double>(), x.numel()) += lo + ((x - lo) / h).round() * h;
    }
  }
  const double quantized = clip * (1 + std::sqrt(6.0) / 3);
  expect_round((total + noise() * z * quantized) / 3, "clip, quantize, gaussian");
  EXPECT_NEAR(metrics.at("privacy/sensitivity").item<double>(), quantized, 1e-15);

  // bits 8, range 0.02: the noise (z S ~ 0.035) pushes some coordinates of the sum past 0.02,
  // where they wrap.
  use_aggregation("clip,secure_sum,gaussian", {"aggregation.clip.norm=0.05", "aggregation.secure_sum.bits=8",
                                               "aggregation.secure_sum.range=0.02",
                                               "aggregation.gaussian.noise_multiplier=0.7"});
  const double step = 0.04 / 256, secured = clip + std::sqrt(8.0) * step / 2;
  at::Tensor integers = at::zeros({8}, at::kDouble);
  for (int64_t i = 0; i < 3; ++i) integers += (clipped(i) / step).round().clamp(-128, 127);
  const at::Tensor noised = (integers + (noise() * z * secured / step).round()).to(at::kLong);
  const at::Tensor wrapped = (noised + 128).remainder(256) - 128;
  EXPECT_FALSE(at::equal(wrapped, noised)) << "nothing wrapped: the case checks less than it says";
  expect_round(wrapped.to(at::kDouble) * step / 3, "clip, secure_sum, gaussian");
  EXPECT_NEAR(metrics.at("privacy/sensitivity").item<double>(), secured, 1e-15);

  for (const auto& [stages, settings, message] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"clip,random_k,gaussian", "aggregation.random_k.fraction=0.5",
            "'gaussian' needs a bound on what one client contributes, and 'random_k' gives none: its P / k rescaling"},
           {"clip,top_k,gaussian", "aggregation.top_k.error_feedback=true",
            "and 'top_k' gives none: with error_feedback a client adds its earlier remainders"}}) {
    try {
      use_aggregation(stages, {settings});
      ADD_FAILURE() << stages << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

// Stochastic quantization is unbiased: over many seeds the mean of one-bit FedAvg rounds is the
// plain round's to within its standard error; deterministic rounding, biased, is not.
TEST_F(AlgorithmsTest, StochasticQuantizationIsUnbiased) {
  const std::vector<std::string> fedavg{"client_lr=0.5", "batch_size=0"};
  const ServerState plain = run_plugin("fedavg", fedavg, 1);
  // The variance of the weighted mean of the clients' rounding is at most sum (w_i h_i / W)^2 / 4,
  // h_i <= the range of client i's update.
  double variance = 0;
  for (int64_t i = 0; i < 3; ++i) {
    const at::Tensor u = flat_update(i, 1, 0.5);
    const double range = (u.max() - u.min()).item<double>();
    variance += std::pow(weight(i) * range / total_weight(), 2) / 4;
  }
  const int runs = 300;
  const double tolerance = 5 * std::sqrt(variance / runs);
  const auto mean_error = [&](const char* stochastic) {
    use_aggregation("quantize", {"aggregation.quantize.bits=1", std::string("aggregation.quantize.stochastic=") + stochastic});
    at::Tensor total = at::zeros({3, 2}, at::kDouble);
    for (int r = 0; r < runs; ++r) {
      seed = static_cast<uint64_t>(r);
      total += run_plugin("fedavg", fedavg, 1).params.at("w");
    }
    return (total / runs - plain.params.at("w")).abs().max().item<double>();
  };
  EXPECT_LT(mean_error("true"), tolerance);
  EXPECT_GT(mean_error("false"), tolerance) << "deterministic rounding looks unbiased here: the check cannot fail";
}

// `mean` written out is the pipeline without an aggregator, bit for bit.
TEST_F(AlgorithmsTest, MeanStageIsThePlainMean) {
  const ServerState plain = run_plugin("fedavg", {"client_lr=0.3", "local_epochs=2"}, 2);
  use_aggregation("mean");
  EXPECT_TRUE(bitwise_equal(run_plugin("fedavg", {"client_lr=0.3", "local_epochs=2"}, 2).params, plain.params));
}

// The byzantine share is exact and drawn from the seed: another seed, other clients.
TEST(AggregationTest, ByzantineClientsAreAnExactShareDrawnFromTheSeed) {
  Schema schema;
  for (ConfigKey& k : aggregation_schema()) schema.add(std::move(k));
  Config config;
  apply_override(config, "clients.byzantine.fraction=0.2");
  config.resolve(schema);
  const Aggregation first(config, 1000, 0), again(config, 1000, 0), other(config, 1000, 1);
  int64_t count = 0, same = 0, differ = 0;
  for (int64_t c = 0; c < 1000; ++c) {
    count += first.byzantine(c);
    same += first.byzantine(c) == again.byzantine(c);
    differ += first.byzantine(c) != other.byzantine(c);
  }
  EXPECT_EQ(count, 200);
  EXPECT_EQ(same, 1000);
  EXPECT_GT(differ, 100);
}

// Stage lists that do not compose are refused with the reason.
TEST(AggregationTest, RefusesStagesThatDoNotCompose) {
  const auto refused = [](const std::string& stages, const std::string& message) {
    try {
      aggregation_keys(stages, "exp.yaml:3:1");
      ADD_FAILURE() << stages << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("exp.yaml:3:1: ", 0), 0u) << e.what();
    }
  };
  refused("clip,median,gaussian", "'gaussian' is calibrated to a sum of clipped updates; after 'median'");
  refused("gaussian", "'gaussian' needs a clip stage before it");
  refused("clip,clip", "aggregation stage 'clip' is listed twice");
  refused("median,krum", "'median' and 'krum' both replace the mean");
  refused("median,clip", "'clip' transforms each client's update, so it comes before 'median'");
  refused("clip,gaussian,median", "'median' comes before the server stages");
  refused("mean,median", "'mean' and 'median' both replace the mean");
  refused("clip,medain", "unknown aggregation stage 'medain' (known: clip, quantize, top_k, random_k, mean, median, trimmed_mean, krum, secure_sum, gaussian)");
  refused("secure_sum,median", "'median' needs every client's update, and after 'secure_sum' the server sees only their sum");
  refused("krum,secure_sum", "'secure_sum' sums the updates, but 'krum' before it already replaced their sum");
  refused("secure_sum,clip", "'clip' transforms each client's update, so it comes before 'secure_sum'");
  refused("clip,gaussian,secure_sum", "'secure_sum' comes before the server stages");
  EXPECT_EQ(aggregation_keys("clip,secure_sum,gaussian", "x").size(), 14u);
  EXPECT_EQ(aggregation_keys("clip,mean,gaussian", "x").size(), 10u);
  refused("clip,,median", "has an empty stage name");
  refused("quantize,top_k", "'quantize' and 'top_k' both compress the update");
  refused("top_k,clip", "'clip' comes before 'top_k': a client sends its update compressed");
  EXPECT_EQ(aggregation_keys("clip,quantize,gaussian", "x").size(), 13u);
  EXPECT_EQ(aggregation_keys("clip,random_k,median", "x").size(), 8u);
  EXPECT_EQ(aggregation_keys("clip,gaussian", "x").size(), 10u);
  EXPECT_EQ(aggregation_keys("", "x").size(), 0u);
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

// FedAvg on `m` (float64) whose input layer steps in factored form (every client in one block)
// and whose weighted sum comes from the factors, X^T (w U), against autograd steps and per-client
// deltas; then with a client whose data holds a NaN, dropped on both paths.
void AlgorithmsTest::expect_factored_fedavg_matches_autograd(std::unique_ptr<Model> m) {
  model = std::move(m);
  initial = model->init(at::make_generator<at::CPUGeneratorImpl>(1)).map([](const at::Tensor& t) {
    return t.to(at::kDouble);
  });
  data = std::make_unique<InMemoryDataset>(clients, clients[0], 2);
  auto run = [&](bool factor) {
    factor_input_layer = factor;
    TensorTree metrics;
    const ServerState state = run_plugin("fedavg", {"client_lr=0.3", "batch_size=2"}, 2, &metrics);
    return std::pair{state.params, metrics.at("train/dropped_clients").item<double>()};
  };
  const auto [factored, factored_dropped] = run(true);
  const auto [plain, plain_dropped] = run(false);
  for (const auto& [name, t] : plain) {
    EXPECT_TRUE(at::allclose(factored.at(name), t, 1e-10, 1e-12)) << name;
    EXPECT_GT((t - initial.at(name)).abs().max().item<double>(), 1e-4) << name << " did not move";
  }
  EXPECT_EQ(factored_dropped, 0);

  clients[1].x[2][0] = std::numeric_limits<double>::quiet_NaN();
  data = std::make_unique<InMemoryDataset>(clients, clients[0], 2);
  nonfinite = NonFinite::drop;
  const auto [factored_nan, factored_nan_dropped] = run(true);
  const auto [plain_nan, plain_nan_dropped] = run(false);
  EXPECT_EQ(factored_nan_dropped, 1);  // in the last round
  EXPECT_EQ(plain_nan_dropped, 1);
  for (const auto& [name, t] : plain_nan) {
    EXPECT_TRUE(at::isfinite(factored_nan.at(name)).all().item<bool>()) << name;
    EXPECT_TRUE(at::allclose(factored_nan.at(name), t, 1e-10, 1e-12)) << name;
  }
}

TEST_F(AlgorithmsTest, FedAvgFactoredInputLayerMatchesAutogradSteps) {
  expect_factored_fedavg_matches_autograd(std::make_unique<Mlp>(std::vector<int64_t>{3}, std::vector<int64_t>{16}, 2));
}

// The CNN: its first dense layer's input comes from the convolutions (learned features).
TEST_F(AlgorithmsTest, FedAvgFactoredLayerAfterConvolutionsMatchesAutogradSteps) {
  for (auto& c : clients) c.x = at::randn({c.size(), 1, 8, 8}, at::kDouble);
  expect_factored_fedavg_matches_autograd(std::make_unique<Cnn>(std::vector<int64_t>{1, 8, 8}, 2));
}

}  // namespace
}  // namespace fax
