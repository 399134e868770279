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

class BatchInnerTest : public test::SeededTest {};

// Every register block and tail the plans pick: output channels divisible by 8, 6, 4, 3 and none,
// input channels by 6, 4 and none, image vectors that fill a group and that leave a short one.
TEST_F(BatchInnerTest, PortableKernelsMatchLibTorchAndAvx512Bits) {
  const std::vector<ConvCase> cases{{1, 6, 12, 12, 2, 5}, {6, 16, 8, 9, 5, 5}, {4, 8, 7, 7, 3, 3},
                                    {3, 12, 6, 10, 1, 3},  {2, 9, 9, 6, 4, 3},  {5, 7, 5, 5, 6, 5}};
  for (const at::ScalarType type : {at::kFloat, at::kDouble}) {
    const int64_t lanes = type == at::kFloat ? bi::Simd<float>::lanes : bi::Simd<double>::lanes;
    for (const ConvCase& c : cases) {
      const std::string what = fmt::format("{} c={} o={} {}x{} vectors={} K={}", at::toString(type), c.c, c.o, c.h, c.w, c.n, c.k);
      SCOPED_TRACE(what);
      // One client: x [c, h, w, n], weights [o, c, K, K], y [o, h-K+1, w-K+1, n].
      const at::Tensor x = at::randn({c.c, c.h, c.w, c.n * lanes}, type), wt = at::randn({c.o, c.c, c.k, c.k}, type),
                       b = at::randn({c.o}, type), g = at::randn({c.o, c.h - c.k + 1, c.w - c.k + 1, c.n * lanes}, type);
      const auto ours = type == at::kFloat ? portable_conv<float>(c.k, x, wt, b, g) : portable_conv<double>(c.k, x, wt, b, g);

      // LibTorch's convolution on the images as [n, c, h, w], with its gradients for g.
      const at::Tensor xl = x.permute({3, 0, 1, 2}).contiguous().requires_grad_(true), wl = wt.clone().requires_grad_(true);
      const at::Tensor yl = at::conv2d(xl, wl, b);
      const auto grads = torch::autograd::grad({(yl * g.permute({3, 0, 1, 2})).sum()}, {xl, wl});
      const std::vector<at::Tensor> theirs{yl.permute({1, 2, 3, 0}), grads[0].permute({1, 2, 3, 0}), grads[1]};
      const double tolerance = type == at::kFloat ? 1e-4 : 1e-11;
      const char* names[] = {"y", "dx", "dw"};
      for (int j = 0; j < 3; ++j)
        EXPECT_TRUE(at::allclose(ours[j], theirs[j], tolerance, tolerance))
            << names[j] << ": max difference " << (ours[j] - theirs[j]).abs().max().item<double>();

      // The AVX-512 kernels, through their autograd functions: the same bits.
      if (!kernels::batch_inner_takes(x, c.k)) continue;
      const at::Tensor xa = x.unsqueeze(0).requires_grad_(true), wa = wt.unsqueeze(0).requires_grad_(true);
      const at::Tensor ya = kernels::conv2d_batch_inner(xa, wa, b.unsqueeze(0));
      const auto avx_grads = torch::autograd::grad({(ya * g.unsqueeze(0)).sum()}, {xa, wa});
      const std::vector<at::Tensor> avx{ya[0], avx_grads[0][0], avx_grads[1][0]};
      for (int j = 0; j < 3; ++j) EXPECT_TRUE(at::equal(ours[j], avx[j])) << names[j];
    }
  }
}

}  // namespace
}  // namespace fax
