#include <algorithm>
#include <functional>

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include <fax/nn/builtin_models.h>
#include <fax/nn/layers.h>

#include "helpers.h"
#include "kernels.h"

namespace fax {
namespace {

// k clients' parameters, each from its own stream.
std::vector<TensorTree> client_params(const Model& model, int64_t k) {
  std::vector<TensorTree> out;
  for (int64_t i = 0; i < k; ++i) out.push_back(model.init(client_generator(5, 0, i)));
  return out;
}

// The batched forward over k clients equals each client's own unbatched forward.
void expect_batched_matches_per_client(const Model& model, const at::Tensor& x) {
  const int64_t k = x.size(0);
  const auto params = client_params(model, k);
  const at::Tensor batched = model.forward(stack(params), x);
  for (int64_t i = 0; i < k; ++i) {
    const at::Tensor alone = model.forward(params[i], x[i]);
    ASSERT_EQ(batched[i].sizes(), alone.sizes()) << model.describe();
    EXPECT_TRUE(at::allclose(batched[i], alone, 1e-5, 1e-5))
        << model.describe() << " client " << i << ": max difference " << (batched[i] - alone).abs().max().item<double>();
  }
}

class ModelsTest : public test::SeededTest {};

TEST_F(ModelsTest, SoftmaxRegressionBatchedMatchesPerClient) {
  expect_batched_matches_per_client(SoftmaxRegression(12, 4), at::randn({3, 5, 12}));
}

TEST_F(ModelsTest, MlpBatchedMatchesPerClient) {
  Mlp mlp({1, 28, 28}, {200, 200}, 10);
  EXPECT_EQ(mlp.describe(), "mlp(784-200-200-10)");
  EXPECT_EQ(mlp.forward_flops(), 2 * (784 * 200 + 200 * 200 + 200 * 10));
  expect_batched_matches_per_client(mlp, at::randn({3, 4, 1, 28, 28}));
}

TEST_F(ModelsTest, CnnBatchedMatchesPerClient) {
  Cnn cnn({1, 28, 28}, 10);
  const TensorTree p = cnn.init(client_generator(0, 0, 0));
  EXPECT_EQ(p.at("fc1.w").sizes(), (at::IntArrayRef{64 * 7 * 7, 512}));
  // McMahan et al.'s CNN has 1,663,370 parameters on 28x28x1 inputs.
  EXPECT_EQ(p.numel(), 1663370);
  expect_batched_matches_per_client(cnn, at::randn({3, 2, 1, 28, 28}));
}

TEST_F(ModelsTest, CnnWidthsAreSettings) {
  CnnOptions o;
  o.channels = {4, 8, 16};
  o.kernel = 3;
  o.dense = {32, 16};
  const Cnn cnn({3, 20, 20}, 7, o);
  EXPECT_EQ(cnn.describe(), "cnn(3x20x20: conv3x3x4, pool, conv3x3x8, pool, conv3x3x16, pool, dense 32, dense 16, dense 7)");
  const TensorTree p = cnn.init(client_generator(0, 0, 0));
  EXPECT_EQ(p.at("conv3.w").sizes(), (at::IntArrayRef{16, 8, 3, 3}));
  EXPECT_EQ(p.at("fc1.w").sizes(), (at::IntArrayRef{16 * 2 * 2, 32}));  // 20 -> 10 -> 5 -> 2
  EXPECT_EQ(p.at("fc3.w").sizes(), (at::IntArrayRef{16, 7}));
  expect_batched_matches_per_client(cnn, at::randn({3, 2, 3, 20, 20}));
  o.same_padding = false;
  o.kernel = 9;
  EXPECT_THROW(Cnn({3, 20, 20}, 7, o), Error);  // 20 -> 12 -> 6 -> nothing left
}

// The non-IID benchmark's LeNet (Li et al. 2022): 28x28 -> 24 -> 12 -> 8 -> 4 without padding.
TEST_F(ModelsTest, LenetBatchedMatchesPerClient) {
  const Cnn lenet({1, 28, 28}, 10, lenet_options());
  const TensorTree p = lenet.init(client_generator(0, 0, 0));
  EXPECT_EQ(p.at("fc1.w").sizes(), (at::IntArrayRef{16 * 4 * 4, 120}));
  // conv 6*25+6, conv 16*6*25+16, dense 256*120+120, 120*84+84, 84*10+10.
  EXPECT_EQ(p.numel(), 156 + 2416 + 30840 + 10164 + 850);
  EXPECT_EQ(lenet.forward_flops(), 2 * (24 * 24 * 6 * 25 + 8 * 8 * 16 * 6 * 25 + 256 * 120 + 120 * 84 + 84 * 10));
  expect_batched_matches_per_client(lenet, at::randn({3, 2, 1, 28, 28}));
  expect_batched_matches_per_client(Cnn({3, 32, 32}, 10, lenet_options()), at::randn({2, 2, 3, 32, 32}));
}

// A CNN's features by LibTorch's own NCHW layers, one client's: what Cnn::input_features computes
// with the batch innermost (kernels.h) where the CPU has AVX-512, and with these layers elsewhere.
at::Tensor reference_features(const TensorTree& p, const at::Tensor& x, size_t convs, int64_t padding) {
  at::Tensor h = x;
  for (size_t l = 1; l <= convs; ++l) {
    const at::Tensor z = at::conv2d(h, p.at(fmt::format("conv{}.w", l)), p.at(fmt::format("conv{}.b", l)), 1, padding);
    h = at::relu(at::max_pool2d(z, {2, 2}, {2, 2}));
  }
  return h.flatten(1);
}

void expect_close(const at::Tensor& ours, const at::Tensor& theirs, double tolerance, const std::string& what) {
  ASSERT_EQ(ours.sizes(), theirs.sizes()) << what;
  const double scale = std::max(1.0, theirs.abs().max().item<double>());
  EXPECT_LE((ours - theirs).abs().max().item<double>(), tolerance * scale) << what;
}

struct CnnCase {
  std::string what;
  std::vector<int64_t> input;  // [channels, height, width]
  CnnOptions options;
  int64_t clients, batch;
  at::ScalarType type;
};

CnnOptions cnn_options(std::vector<int64_t> channels, int64_t kernel, bool same_padding) {
  CnnOptions o;
  o.channels = std::move(channels);
  o.kernel = kernel;
  o.same_padding = same_padding;
  return o;
}

// Values, gradients (wrt the images and every convolution's weights and biases) and, in double,
// gradients of gradients agree with LibTorch's layers: batched over clients and per client, for
// batches that fill the vector lanes and batches that leave some empty, with and without padding,
// for every register block the kernels pick (channel counts divisible by 8, 6, 4, 3 and none); and
// McMahan's wide cnn, which stays on LibTorch's convolutions.
TEST_F(ModelsTest, CnnFeaturesMatchLibTorchLayers) {
  const std::vector<CnnCase> cases{
      {"lenet, a full batch", {1, 28, 28}, lenet_options(), 2, 64, at::kFloat},
      {"lenet on colour, 5 images", {3, 32, 32}, lenet_options(), 2, 5, at::kFloat},
      {"McMahan's cnn, 20 images", {1, 28, 28}, CnnOptions(), 2, 20, at::kFloat},
      {"3x3, odd widths", {3, 20, 20}, cnn_options({4, 8, 10}, 3, true), 3, 9, at::kDouble},
      {"odd sizes, 17 images", {2, 15, 13}, cnn_options({6, 12}, 3, false), 2, 17, at::kDouble},
      {"lenet in double", {1, 28, 28}, lenet_options(), 1, 12, at::kDouble}};
  for (const CnnCase& c : cases) {
    SCOPED_TRACE(c.what);
    const Cnn cnn(c.input, 10, c.options);
    const size_t convs = c.options.channels.size();
    const int64_t padding = c.options.same_padding ? c.options.kernel / 2 : 0;
    const double tolerance = c.type == at::kFloat ? 2e-5 : 1e-12;
    const TensorTree params =
        stack(client_params(cnn, c.clients)).map([&](const at::Tensor& t) { return t.to(c.type).requires_grad_(true); });
    std::vector<int64_t> shape{c.clients, c.batch};
    shape.insert(shape.end(), c.input.begin(), c.input.end());
    const at::Tensor x = at::randn(shape, c.type).requires_grad_(true);
    const at::Tensor ours = cnn.input_features(params, x);
    std::vector<at::Tensor> per_client;
    for (int64_t i = 0; i < c.clients; ++i) {
      const TensorTree client = params.map([i](const at::Tensor& t) { return t[i]; });
      per_client.push_back(reference_features(client, x[i], convs, padding));
      expect_close(cnn.input_features(client, x[i]), per_client.back(), tolerance, fmt::format("client {} alone", i));
    }
    const at::Tensor theirs = at::stack(per_client);
    expect_close(ours, theirs, tolerance, "batched values");

    std::vector<at::Tensor> leaves{x};
    std::vector<std::string> names{"x"};
    for (size_t l = 1; l <= convs; ++l)
      for (const char* leaf : {"w", "b"}) {
        names.push_back(fmt::format("conv{}.{}", l, leaf));
        leaves.push_back(params.at(names.back()));
      }
    const at::Tensor r = at::randn(ours.sizes(), c.type);
    const bool twice = c.type == at::kDouble;
    const auto ours_grads = torch::autograd::grad({(ours * r).sum()}, leaves, {}, true, twice);
    const auto their_grads = torch::autograd::grad({(theirs * r).sum()}, leaves, {}, true, twice);
    for (size_t j = 0; j < leaves.size(); ++j) expect_close(ours_grads[j], their_grads[j], tolerance, "gradient wrt " + names[j]);
    const auto& widths = c.options.channels;
    if (kernels::batch_inner_takes(x, c.options.kernel) && *std::max_element(widths.begin(), widths.end()) <= 16) {
      // fax's own kernels (narrow CNNs): a client's bits depend neither on its chunk nor on threads.
      for (int64_t i = 0; i < c.clients; ++i)
        EXPECT_TRUE(at::equal(ours[i], cnn.input_features(params.map([i](const at::Tensor& t) { return t[i]; }), x[i])));
      const int threads = at::get_num_threads();
      at::set_num_threads(threads == 1 ? 2 : 1);
      const at::Tensor again = cnn.input_features(params, x);
      const auto again_grads = torch::autograd::grad({(again * r).sum()}, leaves);
      at::set_num_threads(threads);
      EXPECT_TRUE(at::equal(again, ours));
      for (size_t j = 0; j < leaves.size(); ++j) EXPECT_TRUE(at::equal(again_grads[j], ours_grads[j])) << names[j];
    }
    if (!twice) continue;
    // Hypergradient FedAvg differentiates through the local steps' gradients.
    const auto squares = [](const std::vector<at::Tensor>& g) {
      at::Tensor s = g[0].pow(2).sum();
      for (size_t j = 1; j < g.size(); ++j) s = s + g[j].pow(2).sum();
      return s;
    };
    const auto ours_twice = torch::autograd::grad({squares(ours_grads)}, leaves, {}, true);
    const auto their_twice = torch::autograd::grad({squares(their_grads)}, leaves, {}, true);
    for (size_t j = 0; j < leaves.size(); ++j)
      expect_close(ours_twice[j], their_twice[j], 1e-10, "second derivative wrt " + names[j]);
  }
  // Images that do not fit the weights (channels, clients) are an error, not a stray read.
  const Cnn lenet({1, 28, 28}, 10, lenet_options());
  const TensorTree two = stack(client_params(lenet, 2));
  EXPECT_ANY_THROW(lenet.input_features(two, at::randn({2, 3, 3, 28, 28})));
  EXPECT_ANY_THROW(lenet.input_features(two, at::randn({3, 3, 1, 28, 28})));
  const TensorTree elsewhere = two.map([](const at::Tensor& t) { return t.to(at::kMeta); });
  EXPECT_ANY_THROW(lenet.input_features(elsewhere, at::randn({2, 3, 1, 28, 28})));
  // An empty batch gives empty features.
  EXPECT_EQ(lenet.input_features(two, at::randn({2, 0, 1, 28, 28})).sizes(), (at::IntArrayRef{2, 0, 256}));
}

TEST_F(ModelsTest, ResNetBatchedMatchesPerClient) {
  // ResNet-18 on CIFAR-10 has the parameters of its BatchNorm twin: 11,173,962.
  EXPECT_EQ(ResNet({3, 32, 32}, 10).num_parameters(), 11173962);
  ResNetOptions narrow;
  narrow.width = 8;
  const ResNet resnet({3, 32, 32}, 10, narrow);
  EXPECT_EQ(resnet.describe(), "resnet18_gn(3x32x32: width 8, 2 groups, 10 classes)");
  const TensorTree p = resnet.init(client_generator(0, 0, 0));
  EXPECT_EQ(p.at("stage4.block1.shortcut.w").sizes(), (at::IntArrayRef{64, 32, 1, 1}));
  EXPECT_FALSE(p.contains("stage1.block1.shortcut.w"));
  expect_batched_matches_per_client(resnet, at::randn({3, 2, 3, 32, 32}));
}

TEST_F(ModelsTest, GroupNormBatchedMatchesPerClient) {
  const at::Tensor x = at::randn({3, 2, 4, 5, 5}), gamma = at::randn({3, 4}), beta = at::randn({3, 4});
  const at::Tensor batched = fax::group_norm(x, 2, gamma, beta);
  for (int64_t i = 0; i < 3; ++i)
    EXPECT_TRUE(at::allclose(batched[i], at::group_norm(x[i], 2, gamma[i], beta[i], 1e-5), 1e-5, 1e-6));
  EXPECT_THROW(fax::group_norm(x, 3, gamma, beta), Error);
}

TEST_F(ModelsTest, TransformerBatchedMatchesPerClient) {
  TransformerLm lm({50, 16, 2, 32, 4});
  expect_batched_matches_per_client(lm, at::randint(0, 50, {3, 2, 16}, at::kLong));
  // Shorter sequences than the context work too.
  expect_batched_matches_per_client(lm, at::randint(0, 50, {2, 3, 9}, at::kLong));
  EXPECT_THROW(lm.forward(lm.init(client_generator(0, 0, 0)), at::zeros({1, 17}, at::kLong)), Error);
}

TEST_F(ModelsTest, SizesAreKnownWithoutAllocating) {
  // The memory estimate's parameter counts equal what init() builds.
  const SoftmaxRegression softmax(12, 4);
  const Mlp mlp({1, 28, 28}, {200, 100}, 10);
  const Cnn cnn({3, 32, 32}, 100);
  const Cnn lenet({3, 32, 32}, 100, lenet_options());
  ResNetOptions narrow;
  narrow.width = 4;
  const ResNet resnet({3, 32, 32}, 10, narrow);
  const TransformerLm lm({50, 16, 3, 32, 4});
  for (const Model* m : std::vector<const Model*>{&softmax, &mlp, &cnn, &lenet, &resnet, &lm}) {
    EXPECT_EQ(m->num_parameters(), m->init(client_generator(0, 0, 0)).numel()) << m->describe();
    EXPECT_GT(m->activations_per_example(), 0) << m->describe();
  }
  EXPECT_EQ(mlp.activations_per_example(), 200 + 100 + 10);
  // Absurd widths saturate instead of overflowing (nothing is allocated to find out).
  const Mlp huge({1, 28, 28}, {int64_t{1} << 40, int64_t{1} << 40}, 10);
  EXPECT_EQ(huge.num_parameters(), std::numeric_limits<int64_t>::max());
  const TransformerLm wide({int64_t{1} << 40, 1 << 20, 1 << 10, int64_t{1} << 30, 1});
  EXPECT_EQ(wide.num_parameters(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(wide.activations_per_example(), std::numeric_limits<int64_t>::max());
}

TEST_F(ModelsTest, TransformerIsCausal) {
  TransformerLm lm({30, 12, 2, 16, 2});
  const TensorTree p = lm.init(client_generator(1, 0, 0));
  const at::Tensor x = at::randint(0, 30, {2, 12}, at::kLong);
  at::Tensor changed = x.clone();
  changed.narrow(1, 7, 5).random_(0, 30);
  const at::Tensor a = lm.forward(p, x), b = lm.forward(p, changed);
  EXPECT_TRUE(at::allclose(a.narrow(1, 0, 7), b.narrow(1, 0, 7), 1e-6, 1e-6)) << "the past sees the future";
  EXPECT_FALSE(at::allclose(a.narrow(1, 7, 5), b.narrow(1, 7, 5))) << "later positions ignore their inputs";
}

// Both of fax::conv2d's paths: a loop over clients below 16 input channels, groups from 16 up.
TEST_F(ModelsTest, BatchedConvolutionEqualsPerClientConvolution) {
  for (int64_t channels : {4, 16}) {
    const at::Tensor x = at::randn({3, 2, channels, 8, 8}).requires_grad_();
    const at::Tensor w = at::randn({3, 5, channels, 3, 3}).requires_grad_();
    const at::Tensor b = at::randn({3, 5});
    const at::Tensor out = fax::conv2d(x, w, b, 1);
    ASSERT_EQ(out.sizes(), (at::IntArrayRef{3, 2, 5, 8, 8}));
    const at::Tensor unbiased = fax::conv2d(x, w, {}, 1);
    const auto grads = torch::autograd::grad({out.square().sum()}, {x, w});
    for (int64_t i = 0; i < 3; ++i) {
      const at::Tensor xi = x[i].detach().requires_grad_(), wi = w[i].detach().requires_grad_();
      const at::Tensor expected = at::conv2d(xi, wi, b[i], 1, 1);
      EXPECT_TRUE(at::allclose(out[i], expected, 1e-5, 1e-5)) << channels << " channels, client " << i;
      EXPECT_TRUE(at::allclose(unbiased[i], at::conv2d(xi, wi, {}, 1, 1), 1e-5, 1e-5)) << channels << " channels";
      const auto expected_grads = torch::autograd::grad({expected.square().sum()}, {xi, wi});
      EXPECT_TRUE(at::allclose(grads[0][i], expected_grads[0], 1e-4, 1e-4)) << channels << " channels, client " << i;
      EXPECT_TRUE(at::allclose(grads[1][i], expected_grads[1], 1e-4, 1e-4)) << channels << " channels, client " << i;
    }
  }
}

// fax::max_pool2 runs its own kernel; it must pick max_pool2d's corner everywhere (ties, NaN,
// -inf, odd sizes, a grouped convolution's transposed layout), so values, gradients and second
// derivatives carry max_pool2d's bits.
// Same NaNs, and the same bits elsewhere (so -0 and +0 differ).
bool same(const at::Tensor& a, const at::Tensor& b) {
  const auto bits = [](const at::Tensor& t) {
    return t.nan_to_num(0).contiguous().view(t.scalar_type() == at::kFloat ? at::kInt : at::kLong);
  };
  return a.sizes() == b.sizes() && at::equal(a.isnan(), b.isnan()) && at::equal(bits(a), bits(b));
}

TEST_F(ModelsTest, MaxPoolMatchesLibTorchBitwise) {
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    // [b, k, c, h, w] memory viewed as [k, b, c, h, w]; relu's zeros and rounding make ties. 37
    // images: the batch-inner layout below pools them in whole vectors and a remainder.
    constexpr int64_t images = 37;
    at::Tensor base = at::relu(at::randn({images, 3, 4, 7, 9}, dtype)).mul(4).round();
    for (const int64_t i : {int64_t{0}, int64_t{20}}) {
      base[i][0][0][0][0] = NAN;  // NaN first in its window
      base[i][0][0][1][1] = NAN;  // two NaNs: the later wins
      base[i][0][0][0][1] = NAN;
      base[i + 1][2][3][2].fill_(-INFINITY);  // windows of -inf only
      base[i + 1][2][3][3].fill_(-INFINITY);
      base[i + 1][1][1][5][3] = -0.0;
    }
    const at::Tensor x = base.transpose(0, 1).requires_grad_(true);
    const at::Tensor ours = fax::max_pool2(x);
    const at::Tensor theirs = at::max_pool2d(x.reshape({-1, 4, 7, 9}), {2, 2}, {2, 2}).view({3, images, 4, 3, 4});
    ASSERT_TRUE(same(ours, theirs)) << dtype;
    EXPECT_GT(ours.isnan().sum().item<int64_t>(), 0);
    const at::Tensor up = at::randn(ours.sizes(), dtype).requires_grad_(true);
    up.detach()[0][0][0][0][0] = -0.0;
    const auto grad = [&](const at::Tensor& y) {
      return torch::autograd::grad({(y * up).sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    };
    const at::Tensor g_ours = grad(ours), g_theirs = grad(theirs);
    EXPECT_TRUE(same(g_ours, g_theirs)) << dtype;
    EXPECT_GT((g_ours == 0).sum().item<int64_t>(), 3 * g_ours.numel() / 4 - 1);
    const at::Tensor v = at::randn(x.sizes(), dtype);
    const auto second = [&](const at::Tensor& g) { return torch::autograd::grad({(g * v).sum()}, {up})[0]; };
    const at::Tensor second_theirs = second(g_theirs);
    EXPECT_TRUE(same(second(g_ours), second_theirs)) << dtype;
    // The batch-inner layout [k, c, h, w, images] of narrow CNNs' convolutions pools alike.
    const at::Tensor inner =
        kernels::max_pool2_batch_inner(x.permute({0, 2, 3, 4, 1}).contiguous()).permute({0, 4, 1, 2, 3});
    ASSERT_TRUE(same(inner, theirs)) << dtype;
    const at::Tensor g_inner = grad(inner);
    EXPECT_TRUE(same(g_inner, g_theirs)) << dtype;
    EXPECT_TRUE(same(second(g_inner), second_theirs)) << dtype;
  }
  // The CNN applies ReLU after the pooling: the same values and gradients as before it (the sign
  // of a zero aside: relu(max(-0, -1)) is -0, max(relu(-0), relu(-1)) may be +0; `+ 0` makes -0 +0).
  const at::Tensor z = (at::randn({2, 3, 4, 8, 8}).mul(4).round() + 0.0).requires_grad_(true);
  const at::Tensor relu_first = at::max_pool2d(at::relu(z).reshape({-1, 4, 8, 8}), {2, 2}, {2, 2}).view({2, 3, 4, 4, 4});
  const at::Tensor relu_after = at::relu(fax::max_pool2(z));
  ASSERT_TRUE(same(relu_first, relu_after));
  const at::Tensor up = at::randn(relu_after.sizes());
  EXPECT_TRUE(same(torch::autograd::grad({relu_first}, {z}, {up})[0], torch::autograd::grad({relu_after}, {z}, {up})[0]));
  // Other dtypes go to max_pool2d itself.
  const at::Tensor half = at::randn({2, 3, 4, 6}).to(at::kBFloat16);
  EXPECT_TRUE(at::equal(fax::max_pool2(half), at::max_pool2d(half, {2, 2}, {2, 2})));
}

// ours(inputs) against theirs(inputs), in the outputs' type: values, gradients with respect to
// every input that requires one, and second derivatives (of the gradients' inner product with
// random directions, with respect to the upstream gradient and to the first input), each compared
// by `equal` (default: to 1e-12).
using Layer = std::function<at::Tensor(const std::vector<at::Tensor>&)>;
using Compare = std::function<bool(const at::Tensor&, const at::Tensor&)>;
bool close(const at::Tensor& a, const at::Tensor& b) { return at::allclose(a, b, 1e-12, 1e-12); }
bool close_float(const at::Tensor& a, const at::Tensor& b) { return at::allclose(a, b, 1e-5, 1e-5); }
// `close` for double, `close_float` for float.
Compare close_in(at::ScalarType type) { return type == at::kFloat ? Compare(close_float) : Compare(close); }
void expect_same_to_second_order(const Layer& ours_fn, const Layer& theirs_fn, const std::vector<at::Tensor>& inputs,
                                 const Compare& equal = close) {
  const at::Tensor ours = ours_fn(inputs), theirs = theirs_fn(inputs);
  ASSERT_EQ(ours.sizes(), theirs.sizes());
  EXPECT_TRUE(equal(ours, theirs)) << (ours - theirs).abs().max().item<double>();
  std::vector<at::Tensor> wrt;
  for (const at::Tensor& x : inputs)
    if (x.requires_grad()) wrt.push_back(x);
  if (ours.numel() == 0 || wrt.empty()) return;
  const at::Tensor up = at::randn(ours.sizes(), ours.options()).requires_grad_(true);
  const auto first = [&](const at::Tensor& y) {
    return torch::autograd::grad({(y * up).sum()}, wrt, {}, /*retain_graph=*/true, /*create_graph=*/true);
  };
  const auto g_ours = first(ours), g_theirs = first(theirs);
  at::Tensor ours_dot = at::zeros({}, ours.options()), theirs_dot = at::zeros({}, ours.options());
  for (size_t i = 0; i < wrt.size(); ++i) {
    EXPECT_TRUE(equal(g_ours[i], g_theirs[i])) << "gradient " << i;
    const at::Tensor v = at::randn(wrt[i].sizes(), wrt[i].options());
    ours_dot = ours_dot + (g_ours[i] * v).sum();
    theirs_dot = theirs_dot + (g_theirs[i] * v).sum();
  }
  const auto second = [&](const at::Tensor& dot) { return torch::autograd::grad({dot}, {up, wrt[0]}, {}, true, false, true); };
  const auto h_ours = second(ours_dot), h_theirs = second(theirs_dot);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(h_ours[i].defined(), h_theirs[i].defined()) << "second derivative " << i;
    if (h_ours[i].defined()) {
      EXPECT_TRUE(equal(h_ours[i], h_theirs[i])) << "second derivative " << i;
    }
  }
}

// Leaves to differentiate with respect to.
std::vector<at::Tensor> leaves(const std::vector<at::Tensor>& xs) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& x : xs) out.push_back(x.detach().requires_grad_(true));
  return out;
}

// batched_matmul against at::matmul (times the scale), for operands laid out row-major,
// column-major (a transposed view), as heads of a fused projection (permuted, strided leading
// axes), with no unit stride (copied first) and with degenerate sizes; in double (BLAS) and float
// (oneDNN), each to its own precision.
TEST_F(ModelsTest, BatchedMatmulMatchesMatmulInEveryLayout) {
  const double scale = 0.3;
  for (const at::ScalarType type : {at::kDouble, at::kFloat}) {
    const auto rand = [&](at::IntArrayRef shape) { return at::randn(shape, type); };
    const auto check = [&](const at::Tensor& a, const at::Tensor& b, const std::string& what) {
      SCOPED_TRACE(what + " in " + c10::toString(type));
      expect_same_to_second_order([&](const auto& in) { return fax::batched_matmul(in[0], in[1], scale); },
                                  [&](const auto& in) { return at::matmul(in[0], in[1]) * scale; }, leaves({a, b}),
                                  close_in(type));
      EXPECT_TRUE(fax::batched_matmul(a, b).is_contiguous());
    };
    check(rand({2, 3, 4, 5}), rand({2, 3, 5, 6}), "row-major");
    check(rand({2, 3, 5, 4}).transpose(-2, -1), rand({2, 3, 6, 5}).transpose(-2, -1), "column-major");
    // q and k heads of a fused [n, t, 3, h, hd] projection, as attention reads them.
    const std::vector<at::Tensor> qkv = rand({2, 7, 3, 4, 5}).permute({2, 0, 3, 1, 4}).unbind(0);
    check(qkv[0], qkv[1].transpose(-2, -1), "heads of a fused projection");
    check(rand({2, 4, 7, 7}), qkv[2], "attention weights by v heads");
    check(rand({3, 4, 10}).narrow(-1, 0, 9).slice(-1, 0, 9, 2), rand({3, 5, 2}), "no unit stride");
    check(rand({3, 1, 4}), rand({3, 4, 1}), "a row by a column");
    check(rand({3, 4, 1}), rand({3, 1, 5}), "an outer product");
    check(rand({2, 5}), rand({5, 3}), "no leading axis");
    check(rand({2, 3, 0}), rand({2, 0, 4}), "empty inner axis");
    check(rand({0, 3, 4}), rand({0, 4, 2}), "no matrices");
  }
  const at::Tensor a = at::randn({4, 6, 8}), b = at::randn({4, 8, 3});
  EXPECT_THROW(fax::batched_matmul(a, b.transpose(-2, -1)), Error);
  EXPECT_THROW(fax::batched_matmul(a, at::randn({3, 8, 3})), Error);
  EXPECT_THROW(fax::batched_matmul(a, b.to(at::kDouble)), Error);
}

// batched_matmul with an addend against at::matmul plus it: a full [..., m, n] addend (transposed
// too), a row broadcast to every row ([..., 1, n] and [n]), one broadcast to every matrix (a
// stride-0 leading axis), an empty inner axis (the addend alone); values, gradients (the addend's
// summed to its shape) and second derivatives, in double and float. An addend that does not
// broadcast, or of another type, is an error.
TEST_F(ModelsTest, BatchedMatmulAddsItsAddend) {
  const double scale = -0.7;
  for (const at::ScalarType type : {at::kDouble, at::kFloat}) {
    const auto rand = [&](at::IntArrayRef shape) { return at::randn(shape, type); };
    const auto check = [&](const std::vector<at::Tensor>& in, const std::string& what) {
      SCOPED_TRACE(what + " in " + c10::toString(type));
      expect_same_to_second_order([&](const auto& x) { return fax::batched_matmul(x[0], x[1], scale, x[2]); },
                                  [&](const auto& x) { return at::matmul(x[0], x[1]) * scale + x[2]; }, in,
                                  close_in(type));
    };
    check(leaves({rand({3, 4, 5}), rand({3, 5, 6}), rand({3, 4, 6})}), "full");
    const std::vector<at::Tensor> t = leaves({rand({3, 4, 5}), rand({3, 5, 6}), rand({3, 6, 4})});
    check({t[0], t[1], t[2].transpose(-2, -1)}, "transposed");
    check(leaves({rand({3, 4, 5}), rand({3, 5, 6}), rand({3, 1, 6})}), "a row per matrix");
    check(leaves({rand({4, 5}), rand({5, 6}), rand({6})}), "a row, no leading axis");
    const std::vector<at::Tensor> s = leaves({rand({3, 4, 5}), rand({3, 5, 6}), rand({1, 4, 6})});
    check({s[0], s[1], s[2].expand({3, 4, 6})}, "broadcast matrix");
    check(leaves({rand({2, 3, 0}), rand({2, 0, 4}), rand({2, 3, 4})}), "empty inner axis");
  }
  const at::Tensor a = at::randn({2, 3, 4}), b = at::randn({2, 4, 5});
  EXPECT_THROW(fax::batched_matmul(a, b, 1.0, at::randn({2, 4, 5})), Error);
  EXPECT_THROW(fax::batched_matmul(a, b, 1.0, at::randn({2, 3, 5}, at::kDouble)), Error);
}

// batched_matmul_add_ writes batched_matmul's sum with an addend into the addend itself, bit for
// bit: float and double, a transposed operand, an empty inner axis (nothing added), a subset of
// c's matrices. A c that is not contiguous or not the product's shape, rows out of range, of the
// wrong count or type, or a product that needs a gradient, are refused.
TEST_F(ModelsTest, BatchedMatmulAddInPlaceHasTheBitsOfTheAddend) {
  for (const at::ScalarType type : {at::kDouble, at::kFloat}) {
    for (const int64_t inner : {5, 0}) {
      const at::Tensor a = at::randn({3, inner, 4}, type).transpose(-2, -1), b = at::randn({3, inner, 6}, type);
      const at::Tensor c = at::randn({3, 4, 6}, type);
      const at::Tensor expected = fax::batched_matmul(a, b, -0.7, c);
      at::Tensor in_place = c.clone();
      fax::batched_matmul_add_(in_place, a, b, -0.7);
      EXPECT_EQ(test::bytes_of(in_place), test::bytes_of(expected)) << c10::toString(type) << ", inner " << inner;
    }
  }
  // With rows: those matrices of c move, each as batched_matmul on the gathered rows would; the
  // others keep their bits. batched_matmul_rows reads b's matrices by row the same way.
  for (const at::ScalarType type : {at::kDouble, at::kFloat}) {
    const at::Tensor a = at::randn({2, 5, 4}, type).transpose(-2, -1), b = at::randn({2, 5, 6}, type);
    const at::Tensor c = at::randn({4, 4, 6}, type), rows = at::tensor({3, 1}, at::kLong);
    const at::Tensor expected = c.clone().index_copy_(0, rows, fax::batched_matmul(a, b, -0.7, c.index_select(0, rows)));
    const at::Tensor in_place = c.clone();
    fax::batched_matmul_add_(in_place, a, b, -0.7, rows);
    EXPECT_EQ(test::bytes_of(in_place), test::bytes_of(expected)) << c10::toString(type);
    const at::Tensor many = at::randn({4, 5, 6}, type);
    EXPECT_EQ(test::bytes_of(fax::batched_matmul_rows(a, many, rows, -0.7)),
              test::bytes_of(fax::batched_matmul(a, many.index_select(0, rows), -0.7)))
        << c10::toString(type);
  }
  const at::Tensor a = at::randn({2, 3, 4}), b = at::randn({2, 4, 5});
  const at::Tensor four = at::randn({4, 3, 5});
  EXPECT_THROW(fax::batched_matmul_add_(four, a, b, 1.0, at::tensor({0, 4}, at::kLong)), Error);
  EXPECT_THROW(fax::batched_matmul_add_(four, a, b, 1.0, at::tensor({0}, at::kLong)), Error);
  EXPECT_THROW(fax::batched_matmul_add_(four, a, b, 1.0, at::tensor({0, 1}, at::kInt)), Error);
  EXPECT_THROW(fax::batched_matmul_rows(a, at::randn({4, 4, 5}), at::tensor({-1, 0}, at::kLong)), Error);
  EXPECT_THROW(fax::batched_matmul_add_(at::randn({2, 5, 3}).transpose(-2, -1), a, b), Error);
  EXPECT_THROW(fax::batched_matmul_add_(at::randn({2, 3, 4}), a, b), Error);
  EXPECT_THROW(fax::batched_matmul_add_(at::randn({2, 3, 5}), a.requires_grad_(), b), Error);
}

// A per-client linear layer against baddbmm (each client's rows times its weights plus its bias):
// inputs with one and two example axes, weights broadcast to every client (a stride-0 clients
// axis), an input that needs no gradient (a model's data), an empty inner axis; in double and
// float; mismatched shapes too.
TEST_F(ModelsTest, LinearPerClientMatchesBaddbmm) {
  const auto reference = [](const std::vector<at::Tensor>& in) {
    const at::Tensor& x = in[0];
    const at::Tensor rows = x.flatten(1, -2);
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
    shape.push_back(in[1].size(2));
    return at::baddbmm(in[2].unsqueeze(1), rows, in[1]).view(shape);
  };
  const auto ours = [](const std::vector<at::Tensor>& in) { return fax::linear(in[0], in[1], in[2]); };
  for (const at::ScalarType type : {at::kDouble, at::kFloat}) {
    const auto rand = [&](at::IntArrayRef shape) { return at::randn(shape, type); };
    const auto check = [&](const std::vector<at::Tensor>& in, const std::string& what) {
      SCOPED_TRACE(what + " in " + c10::toString(type));
      expect_same_to_second_order(ours, reference, in, close_in(type));
    };
    check(leaves({rand({3, 5, 4}), rand({3, 4, 6}), rand({3, 6})}), "rows");
    check(leaves({rand({3, 2, 5, 4}), rand({3, 4, 6}), rand({3, 6})}), "sequences of rows");
    const std::vector<at::Tensor> shared = leaves({rand({1, 4, 6}), rand({1, 6})});
    check({rand({3, 5, 4}).requires_grad_(true), shared[0].expand({3, 4, 6}), shared[1].expand({3, 6})},
          "broadcast weights");
    const std::vector<at::Tensor> params = leaves({rand({3, 4, 6}), rand({3, 6})});
    check({rand({3, 5, 4}), params[0], params[1]}, "data input");
    check(leaves({rand({3, 5, 0}), rand({3, 0, 6}), rand({3, 6})}), "empty inner axis");
  }
  const at::Tensor x = at::randn({2, 5, 4}), w = at::randn({2, 4, 3}), b = at::randn({2, 3});
  EXPECT_THROW(fax::linear(x, w, at::randn({2, 4})), Error);
  EXPECT_THROW(fax::linear(x, at::randn({2, 5, 3}), b), Error);
  EXPECT_THROW(fax::linear(x, w.to(at::kDouble), b.to(at::kDouble)), Error);
}

// A linear layer without a clients axis against addmm, for [b, in] and [b, t, in] inputs, in
// double and float; operands of mixed types are an error.
TEST_F(ModelsTest, LinearWithoutClientsMatchesAddmm) {
  const auto reference = [](const std::vector<at::Tensor>& in) {
    std::vector<int64_t> shape(in[0].sizes().begin(), in[0].sizes().end() - 1);
    shape.push_back(in[1].size(1));
    return at::addmm(in[2], in[0].reshape({-1, in[0].size(-1)}), in[1]).view(shape);
  };
  const auto ours = [](const std::vector<at::Tensor>& in) { return fax::linear(in[0], in[1], in[2]); };
  for (const at::ScalarType type : {at::kDouble, at::kFloat}) {
    const auto rand = [&](at::IntArrayRef shape) { return at::randn(shape, type); };
    SCOPED_TRACE(c10::toString(type));
    expect_same_to_second_order(ours, reference, leaves({rand({5, 4}), rand({4, 6}), rand({6})}), close_in(type));
    expect_same_to_second_order(ours, reference, leaves({rand({2, 5, 4}), rand({4, 6}), rand({6})}), close_in(type));
  }
  EXPECT_THROW(fax::linear(at::randn({5, 4}), at::randn({4, 6}, at::kDouble), at::randn({6}, at::kDouble)), Error);
}

// cross_entropy per label, [k, b] and [k, b, t], against the log-probability of the label negated:
// the same bits in values, gradients and second derivatives; a label out of range is an error.
TEST_F(ModelsTest, CrossEntropyIsTheNegatedLogProbabilityBitwise) {
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{3, 5}, {2, 3, 4}}) {
      std::vector<int64_t> logits_shape = shape;
      logits_shape.push_back(7);
      SCOPED_TRACE(c10::toString(dtype));
      const at::Tensor logits = (4 * at::randn(logits_shape, dtype)).requires_grad_(true);
      const at::Tensor labels = at::randint(0, 7, shape, at::kLong);
      expect_same_to_second_order([](const auto& in) { return cross_entropy(in[0], in[1]); },
                                  [](const auto& in) {
                                    return at::log_softmax(in[0], -1).gather(-1, in[1].unsqueeze(-1)).squeeze(-1).neg();
                                  },
                                  {logits, labels}, same);
    }
  }
  EXPECT_ANY_THROW(cross_entropy(at::randn({2, 3}), at::tensor({0, 3}, at::kLong)));
  EXPECT_ANY_THROW(cross_entropy(at::randn({2, 3}), at::tensor({0, -1}, at::kLong)));
}

TEST_F(ModelsTest, EmbeddingAndLayerNormPerClient) {
  const at::Tensor table = at::randn({3, 7, 4});
  const at::Tensor ids = at::randint(0, 7, {3, 2, 5}, at::kLong);
  const at::Tensor looked_up = fax::embedding(ids, table);
  const at::Tensor gamma = at::randn({3, 4}), beta = at::randn({3, 4});
  const at::Tensor normed = fax::layer_norm(looked_up, gamma, beta);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(at::equal(looked_up[i], at::embedding(table[i], ids[i])));
    EXPECT_TRUE(at::allclose(normed[i], at::layer_norm(looked_up[i], {4}, gamma[i], beta[i], 1e-5), 1e-5, 1e-6));
  }
}

// Models are differentiable end to end: the gradient of a scalar of the output in one input
// coordinate agrees with finite differences (float64).
TEST_F(ModelsTest, CnnGradientMatchesFiniteDifferences) {
  Cnn cnn({1, 8, 8}, 3);
  const TensorTree p = cnn.init(client_generator(2, 0, 0)).map([](const at::Tensor& t) { return t.to(at::kDouble); });
  const at::Tensor x = at::randn({2, 1, 8, 8}, at::kDouble).requires_grad_(true);
  const at::Tensor g = torch::autograd::grad({cnn.forward(p, x).pow(2).sum()}, {x})[0];
  const double eps = 1e-6;
  for (int64_t idx : {3, 17, 64 + 40}) {
    at::Tensor plus = x.detach().clone(), minus = x.detach().clone();
    plus.view({-1})[idx] += eps;
    minus.view({-1})[idx] -= eps;
    const double numeric = (cnn.forward(p, plus).pow(2).sum() - cnn.forward(p, minus).pow(2).sum()).item<double>() / (2 * eps);
    EXPECT_NEAR(g.reshape({-1})[idx].item<double>(), numeric, 1e-5 * std::max(1.0, std::abs(numeric)));
  }
}

TEST_F(ModelsTest, RegistryBuildsEveryModel) {
  for (const auto& entry : model_registry()) {
    Schema schema;
    schema.add_all(entry.keys, "model");
    Config config;
    config.resolve(schema);
    const bool text = entry.name == "transformer";
    const ModelShape tokens{{16}, 40, at::kLong};
    const ModelShape shape = text ? tokens : ModelShape{{1, 28, 28}, 10};
    if (entry.name == "torchscript") {  // needs its file (tests/plugins/torchscript_test.cpp)
      EXPECT_THROW(entry.create(config, shape), Error);
      continue;
    }
    // Models of features refuse token ids up front, and the transformer refuses features.
    const std::string refused = test::error_of([&] { entry.create(config, text ? ModelShape{{16}, 40} : tokens); });
    EXPECT_NE(refused.find(text ? "needs token sequences" : "needs numeric features"), std::string::npos) << refused;
    const auto model = entry.create(config, shape);
    EXPECT_GT(model->forward_flops(), 0) << entry.name;
    const at::Tensor x = text ? at::randint(0, 40, {2, 16}, at::kLong) : at::randn({2, 1, 28, 28});
    const at::Tensor out = model->forward(model->init(client_generator(0, 0, 0)), x);
    EXPECT_EQ(out.size(-1), text ? 40 : 10) << entry.name;
  }
  EXPECT_THROW(find_model("resnet"), Error);
}

}  // namespace
}  // namespace fax
