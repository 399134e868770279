#include <torch/csrc/autograd/autograd.h>

#include "helpers.h"

namespace fax {
namespace {

using test::SeededTest;

// A small nonlinear federated problem: logistic regression, client i holding (X_i, y_i).
class FederatedAdTest : public SeededTest {
 protected:
  static constexpr int64_t kClients = 5;
  static constexpr int64_t kExamples = 6;
  static constexpr int64_t kDim = 3;

  void SetUp() override {
    SeededTest::SetUp();
    X = at::randn({kClients, kExamples, kDim}, at::kDouble);
    y = at::randint(0, 2, {kClients, kExamples}, at::kDouble) * 2 - 1;
    w = at::rand({kClients}, at::kDouble) + 0.5;
  }

  // One loss per client of a chunk: params [k, d], X [k, m, d], y [k, m] -> [k].
  static at::Tensor client_losses(const at::Tensor& params, const at::Tensor& x, const at::Tensor& labels) {
    const at::Tensor logits = at::bmm(x, params.unsqueeze(2)).squeeze(2);
    return at::softplus(-labels * logits).mean(1) + 0.05 * params.pow(2).sum(1);
  }

  // `steps` local SGD steps with learning rate lr ([k]) from params ([k, d]). With create_graph the
  // result stays differentiable through every step (second order); without it each step's gradient
  // is a constant (first order).
  static at::Tensor local_sgd(at::Tensor params, const at::Tensor& lr, const at::Tensor& x, const at::Tensor& labels,
                              int steps, bool create_graph) {
    if (!params.requires_grad()) params = params.detach().requires_grad_(true);
    for (int s = 0; s < steps; ++s) {
      const at::Tensor total = client_losses(params, x, labels).sum();
      const at::Tensor g = torch::autograd::grad({total}, {params}, {}, true, create_graph)[0];
      params = params - lr.unsqueeze(1) * g;
    }
    return params;
  }

  // One FedAvg round, then the federated loss at the new server point. Inputs: server params
  // theta [d] and the client learning rate (0-dim).
  at::Tensor post_round_loss(Program& p, const at::Tensor& theta, const at::Tensor& client_lr, bool create_graph) const {
    const auto data_x = p.local_rows(X);
    const auto data_y = p.local_rows(y);
    const auto params = broadcast(Server<at::Tensor>(theta));
    const auto lrs = broadcast(Server<at::Tensor>(client_lr));
    const auto updated = map_clients([&](const at::Tensor& p0, const at::Tensor& lr, const at::Tensor& x,
                                         const at::Tensor& labels) {
      return local_sgd(p0, lr, x, labels, 3, create_graph);
    }, params, lrs, data_x, data_y);
    const auto deltas = map_clients([](const at::Tensor& a, const at::Tensor& b) { return a - b; }, params, updated);
    const at::Tensor next = theta - weighted_mean(deltas, p.local_rows(w)).value();
    const auto losses = map_clients(&FederatedAdTest::client_losses, broadcast(Server<at::Tensor>(next)), data_x, data_y);
    return mean(losses).value();
  }

  at::Tensor X, y, w;
  Cohort cohort = Cohort::range(kClients);
};

TEST_F(FederatedAdTest, FedSgdGradientIsTheMeanOfPerClientGradients) {
  Mesh mesh({2, 3});
  const at::Tensor theta = at::randn({kDim}, at::kDouble);
  const at::Tensor federated = mesh.run(cohort, [&](Program& p) {
    const at::Tensor x = theta.clone().requires_grad_(true);
    const auto losses = map_clients(&FederatedAdTest::client_losses, broadcast(Server<at::Tensor>(x)),
                                    p.local_rows(X), p.local_rows(y));
    return Server<at::Tensor>(torch::autograd::grad({mean(losses).value()}, {x})[0]);
  }).value();

  at::Tensor by_hand = at::zeros({kDim}, at::kDouble);
  for (int64_t i = 0; i < kClients; ++i) {
    const at::Tensor x = theta.clone().requires_grad_(true);
    const at::Tensor loss = client_losses(x.unsqueeze(0), X.narrow(0, i, 1), y.narrow(0, i, 1)).sum();
    by_hand += torch::autograd::grad({loss}, {x})[0];
  }
  by_hand /= kClients;
  EXPECT_TRUE(at::allclose(federated, by_hand, 1e-12, 1e-14)) << federated << by_hand;
}

TEST_F(FederatedAdTest, GradientThroughThreeLocalStepsMatchesFiniteDifferences) {
  const at::Tensor lr = at::scalar_tensor(0.4, at::kDouble);
  for (MeshOptions o : {MeshOptions{1, 1}, MeshOptions{2, 5}}) {
    Mesh mesh(o);
    test::expect_gradient_matches_finite_differences(mesh, cohort, [&](Program& p, const at::Tensor& theta) {
      return post_round_loss(p, theta, lr, true);
    }, at::randn({kDim}, at::kDouble));
  }
}

TEST_F(FederatedAdTest, ClientLearningRateHypergradientMatchesFiniteDifferences) {
  Mesh mesh({2, 3});
  const at::Tensor theta = at::randn({kDim}, at::kDouble);
  test::expect_gradient_matches_finite_differences(mesh, cohort, [&](Program& p, const at::Tensor& lr) {
    return post_round_loss(p, theta, lr, true);
  }, at::scalar_tensor(0.3, at::kDouble));
}

// Second-order terms matter: without create_graph (first order) the gradient is measurably off,
// so the finite-difference agreement above is not an accident of the problem.
TEST_F(FederatedAdTest, FirstOrderApproximationMissesSecondOrderTerms) {
  Mesh mesh({2, 3});
  const at::Tensor theta = at::randn({kDim}, at::kDouble);
  const at::Tensor lr = at::scalar_tensor(0.4, at::kDouble);
  auto gradient = [&](bool create_graph) {
    return mesh.run(cohort, [&](Program& p) {
      const at::Tensor x = theta.clone().requires_grad_(true);
      return Server<at::Tensor>(torch::autograd::grad({post_round_loss(p, x, lr, create_graph)}, {x})[0]);
    }).value();
  };
  const at::Tensor exact = gradient(true);
  const at::Tensor first_order = gradient(false);
  EXPECT_GT((exact - first_order).abs().max().item<double>(), 1e-3 * exact.abs().max().item<double>());
}

}  // namespace
}  // namespace fax
