#include <torch/csrc/autograd/autograd.h>

#include "helpers.h"

namespace fax {
namespace {

using test::SeededTest;

class TensorTreeTest : public SeededTest {
 protected:
  TensorTree a{{"w", at::tensor({1.0, 2.0, 3.0, 4.0}).view({2, 2})}, {"b", at::tensor({0.5, -1.0})}};
  TensorTree b{{"w", at::tensor({2.0, 0.0, -1.0, 1.0}).view({2, 2})}, {"b", at::tensor({4.0, 2.0})}};
};

TEST_F(TensorTreeTest, KeepsInsertionOrderAndReplacesInPlace) {
  TensorTree t;
  t.set("z", at::zeros({1}));
  t.set("a", at::ones({1}));
  t.set("z", at::ones({3}));
  EXPECT_EQ(t.names(), (std::vector<std::string>{"z", "a"}));
  EXPECT_EQ(t.at("z").numel(), 3);
  EXPECT_EQ(t.numel(), 4);
  EXPECT_TRUE(t.contains("a"));
  EXPECT_FALSE(t.contains("q"));
}

TEST_F(TensorTreeTest, MissingLeafNamesTheKeyAndTheLeaves) {
  try {
    a.at("gamma");
    FAIL() << "expected fax::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'gamma'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("w, b"), std::string::npos) << e.what();
  }
}

TEST_F(TensorTreeTest, Arithmetic) {
  EXPECT_TRUE(at::equal(add(a, b).at("w"), at::tensor({3.0, 2.0, 2.0, 5.0}).view({2, 2})));
  EXPECT_TRUE(at::equal(sub(a, b).at("b"), at::tensor({-3.5, -3.0})));
  EXPECT_TRUE(at::equal(scale(a, 2.0).at("b"), at::tensor({1.0, -2.0})));
  EXPECT_TRUE(at::equal(axpy(-0.5, b, a).at("w"), at::tensor({0.0, 2.0, 3.5, 3.5}).view({2, 2})));
  EXPECT_TRUE(at::equal((a + b).at("b"), add(a, b).at("b")));
  EXPECT_TRUE(at::equal((3.0 * a - a).at("w"), (a * 2.0).at("w")));
  // dot: w: 2 + 0 - 3 + 4 = 3, b: 2 - 2 = 0.
  EXPECT_DOUBLE_EQ(dot(a, b).item<double>(), 3.0);
  // 1 + 4 + 9 + 16 + 0.25 + 1
  EXPECT_DOUBLE_EQ(squared_norm(a).item<double>(), 31.25);
  EXPECT_DOUBLE_EQ(squared_norm(zeros_like(a)).item<double>(), 0.0);
}

TEST_F(TensorTreeTest, TensorFactorsCarryGradients) {
  at::Tensor lr = at::scalar_tensor(0.1, at::kDouble).requires_grad_(true);
  const at::Tensor loss = squared_norm(axpy(lr, b, a));
  const at::Tensor g = torch::autograd::grad({loss}, {lr})[0];
  // d/dlr |a + lr b|^2 = 2 <a + lr b, b>
  const double expected = 2.0 * dot(axpy(0.1, b, a), b).item<double>();
  EXPECT_NEAR(g.item<double>(), expected, 1e-12);
  EXPECT_NEAR(scale(b, lr).at("b")[0].item<double>(), 0.4, 1e-15);
}

TEST_F(TensorTreeTest, CloneAndDetachCutSharingAndGraphs) {
  TensorTree c = clone(a);
  c.at("w").add_(1.0);
  EXPECT_DOUBLE_EQ(a.at("w")[0][0].item<double>(), 1.0);
  TensorTree leaves = clone(a);
  requires_grad_(leaves);
  const TensorTree d = detach(scale(leaves, 2.0));
  EXPECT_FALSE(d.at("w").requires_grad());
  EXPECT_TRUE(leaves.at("b").requires_grad());
}

TEST_F(TensorTreeTest, MismatchedStructureIsAnError) {
  TensorTree other{{"w", at::zeros({2, 2})}, {"c", at::zeros({2})}};
  EXPECT_THROW(add(a, other), Error);
  TensorTree shorter{{"w", at::zeros({2, 2})}};
  EXPECT_THROW(dot(a, shorter), Error);
  TensorTree reordered{{"b", at::zeros({2})}, {"w", at::zeros({2, 2})}};
  EXPECT_THROW(sub(a, reordered), Error);
}

TEST_F(TensorTreeTest, FlattenRoundTrips) {
  const at::Tensor flat = flatten(a);
  EXPECT_TRUE(at::equal(flat, at::tensor({1.0, 2.0, 3.0, 4.0, 0.5, -1.0})));
  const TensorTree back = unflatten(flat * 2, a);
  EXPECT_EQ(back.names(), a.names());
  EXPECT_TRUE(at::equal(back.at("w"), a.at("w") * 2));
  EXPECT_THROW(unflatten(at::zeros({5}, at::kDouble), a), Error);
  TensorTree mixed{{"x", at::zeros({2})}, {"i", at::zeros({2}, at::kLong)}};
  EXPECT_THROW(flatten(mixed), Error);
}

TEST_F(TensorTreeTest, FlattenIsDifferentiable) {
  TensorTree leaves = clone(a);
  requires_grad_(leaves);
  const at::Tensor flat = flatten(leaves);
  const at::Tensor loss = (flat * at::arange(6, at::kDouble)).sum();
  const auto g = torch::autograd::grad({loss}, {leaves.at("w"), leaves.at("b")});
  EXPECT_TRUE(at::equal(g[0], at::arange(4, at::kDouble).view({2, 2})));
  EXPECT_TRUE(at::equal(g[1], at::tensor({4.0, 5.0})));
}

TEST_F(TensorTreeTest, StackUnstackNarrowCat) {
  const TensorTree s = stack({a, b, a});
  EXPECT_EQ(s.at("w").sizes(), (at::IntArrayRef{3, 2, 2}));
  EXPECT_EQ(leading_size(s), 3);
  const auto parts = unstack(s);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_TRUE(bitwise_equal(parts[1], b));
  const TensorTree tail = narrow(s, 1, 2);
  EXPECT_EQ(leading_size(tail), 2);
  const TensorTree joined = cat({narrow(s, 0, 1), tail});
  EXPECT_TRUE(bitwise_equal(joined, s));
  TensorTree ragged{{"x", at::zeros({3, 1})}, {"y", at::zeros({2, 1})}};
  EXPECT_THROW(leading_size(ragged), Error);
}

TEST_F(TensorTreeTest, BitwiseEqualSeesOneUlp) {
  TensorTree c = clone(a);
  EXPECT_TRUE(bitwise_equal(a, c));
  c.at("b")[0] = std::nextafter(0.5, 1.0);
  EXPECT_FALSE(bitwise_equal(a, c));
  EXPECT_FALSE(bitwise_equal(at::zeros({2}), at::zeros({2}, at::kDouble)));
}

TEST_F(TensorTreeTest, FiniteRowsSeesEveryNonFiniteValueAndNoOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float big = std::numeric_limits<float>::max();
  // Rows: finite; NaN; +Inf; Inf and -Inf (their sum is NaN); finite values whose sum overflows;
  // finite in "w" but not in "b".
  const at::Tensor w = at::tensor({1.0f, 2.0f, nan, 0.0f, inf, 0.0f, inf, -inf, big, big, 1.0f, 1.0f}).view({6, 2});
  const at::Tensor b = at::tensor({0.0f, 0.0f, 0.0f, 0.0f, 0.0f, -inf}).view({6, 1});
  const at::Tensor finite = finite_rows(TensorTree{{"w", w}, {"b", b}});
  EXPECT_TRUE(at::equal(finite, at::tensor({1, 0, 0, 0, 1, 0}).to(at::kBool))) << finite;
}

}  // namespace
}  // namespace fax
