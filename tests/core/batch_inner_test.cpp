// The portable variant of the batch-inner convolution kernels (what builds on aarch64) against
// LibTorch's convolution, and bit for bit against the AVX-512 kernels where the CPU has them.
#define FAX_PORTABLE_SIMD
#include "batch_inner.h"

#include <string>

#include <torch/csrc/autograd/autograd.h>

#include "helpers.h"
#include "kernels.h"

namespace fax {
namespace {

namespace bi = kernels::batch_inner;

struct ConvCase {
  int64_t c, o, h, w, n;  // n: images, a multiple of the lanes
  int k;
};

// The portable kernels over all their work items, for one client: y, dx and dw.
template <typename T, int K>
std::vector<at::Tensor> portable_conv(const at::Tensor& x, const at::Tensor& wt, const at::Tensor& b, const at::Tensor& g) {
  const bi::Shape s{x.size(0), x.size(1), x.size(2), x.size(3), wt.size(0)};
  at::Tensor y = at::empty(g.sizes(), x.options()), dx = at::empty(x.sizes(), x.options()),
             dw = at::empty(wt.sizes(), x.options());
  const auto fp = bi::forward_plan(s, bi::Simd<T>::lanes);
  for (int64_t i = 0; i < fp.count(); ++i)
    bi::forward<T, K>(fp, x.data_ptr<T>(), wt.data_ptr<T>(), b.data_ptr<T>(), y.data_ptr<T>(), s, i);
  const auto dp = bi::data_grad_plan(s, bi::Simd<T>::lanes);
  for (int64_t i = 0; i < dp.count(); ++i) bi::data_grad<T, K>(dp, g.data_ptr<T>(), wt.data_ptr<T>(), dx.data_ptr<T>(), s, i);
  const auto wp = bi::weight_grad_plan(s);
  for (int64_t i = 0; i < wp.count(s, K); ++i)
    bi::weight_grad<T, K>(wp, x.data_ptr<T>(), g.data_ptr<T>(), dw.data_ptr<T>(), s, i);
  return {y, dx, dw};
}

template <typename T>
std::vector<at::Tensor> portable_conv(int k, const at::Tensor& x, const at::Tensor& wt, const at::Tensor& b, const at::Tensor& g) {
  return k == 5 ? portable_conv<T, 5>(x, wt, b, g) : portable_conv<T, 3>(x, wt, b, g);
}

// Every register block and tail the plans pick: forward blocks of 8, 6, 4 and 1 output channels
// with full groups of image vectors and short ones, data-gradient blocks of 6, 4 and 1 input
// channels likewise, weight-gradient blocks of 4, 3 (sliding) and 1, one output column among them.
const std::vector<ConvCase> kCases{{1, 6, 12, 12, 5, 5}, {6, 16, 8, 9, 5, 5}, {4, 4, 7, 7, 5, 3},
                                   {3, 12, 6, 10, 1, 3}, {2, 9, 9, 6, 4, 3}, {5, 7, 5, 5, 6, 5}};

// One case's tensors for one client: x [c, h, w, n], weights [o, c, K, K], y's gradient g
// [o, h-K+1, w-K+1, n], and the portable kernels' y, dx, dw.
struct Computed {
  at::Tensor x, wt, b, g;
  std::vector<at::Tensor> ours;
};

Computed compute(const ConvCase& c, at::ScalarType type) {
  const int64_t lanes = type == at::kFloat ? bi::Simd<float>::lanes : bi::Simd<double>::lanes;
  Computed r;
  r.x = at::randn({c.c, c.h, c.w, c.n * lanes}, type);
  r.wt = at::randn({c.o, c.c, c.k, c.k}, type);
  r.b = at::randn({c.o}, type);
  r.g = at::randn({c.o, c.h - c.k + 1, c.w - c.k + 1, c.n * lanes}, type);
  r.ours = type == at::kFloat ? portable_conv<float>(c.k, r.x, r.wt, r.b, r.g) : portable_conv<double>(c.k, r.x, r.wt, r.b, r.g);
  return r;
}

std::string describe(const ConvCase& c, at::ScalarType type) {
  return fmt::format("{} c={} o={} {}x{} vectors={} K={}", at::toString(type), c.c, c.o, c.h, c.w, c.n, c.k);
}

const char* const kNames[] = {"y", "dx", "dw"};

class BatchInnerTest : public test::SeededTest {};

TEST_F(BatchInnerTest, PortableKernelsMatchLibTorch) {
  for (const at::ScalarType type : {at::kFloat, at::kDouble})
    for (const ConvCase& c : kCases) {
      SCOPED_TRACE(describe(c, type));
      const Computed r = compute(c, type);
      // LibTorch's convolution on the images as [n, c, h, w], with its gradients for g.
      const at::Tensor xl = r.x.permute({3, 0, 1, 2}).contiguous().requires_grad_(true), wl = r.wt.clone().requires_grad_(true);
      const at::Tensor yl = at::conv2d(xl, wl, r.b);
      const auto grads = torch::autograd::grad({(yl * r.g.permute({3, 0, 1, 2})).sum()}, {xl, wl});
      const std::vector<at::Tensor> theirs{yl.permute({1, 2, 3, 0}), grads[0].permute({1, 2, 3, 0}), grads[1]};
      const double tolerance = type == at::kFloat ? 1e-4 : 1e-11;
      for (int j = 0; j < 3; ++j)
        EXPECT_TRUE(at::allclose(r.ours[j], theirs[j], tolerance, tolerance))
            << kNames[j] << ": max difference " << (r.ours[j] - theirs[j]).abs().max().item<double>();
    }
}

// The AVX-512 kernels, through their autograd functions, compute the portable variant's bits.
TEST_F(BatchInnerTest, PortableKernelsMatchAvx512Bits) {
  if (!kernels::batch_inner_takes(at::empty({1, 1, 1, 1, 16}), 5))
    GTEST_SKIP() << "this CPU runs no batch-inner kernels (no AVX-512): nothing to compare bit for bit";
  for (const at::ScalarType type : {at::kFloat, at::kDouble})
    for (const ConvCase& c : kCases) {
      SCOPED_TRACE(describe(c, type));
      const Computed r = compute(c, type);
      const at::Tensor xa = r.x.unsqueeze(0).requires_grad_(true), wa = r.wt.unsqueeze(0).requires_grad_(true);
      const at::Tensor ya = kernels::conv2d_batch_inner(xa, wa, r.b.unsqueeze(0));
      const auto grads = torch::autograd::grad({(ya * r.g.unsqueeze(0)).sum()}, {xa, wa});
      const std::vector<at::Tensor> avx{ya[0], grads[0][0], grads[1][0]};
      for (int j = 0; j < 3; ++j) EXPECT_TRUE(at::equal(r.ours[j], avx[j])) << kNames[j];
    }
}

}  // namespace
}  // namespace fax
