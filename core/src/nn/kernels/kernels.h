#pragma once

// fax's own CPU kernels under the batched layers (private to libfax_core): a GEMM over leading
// axes on oneDNN (float) or BLAS (double), and 2x2 max pooling. Both are autograd functions whose
// backward passes are differentiable in turn. Callers check shapes, types and devices first
// (layers.cpp); the kernels take CPU float or double tensors.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace fax::kernels {

/// `sizes` with its last axis resized to n: the shape of a product or a linear layer's output.
inline std::vector<int64_t> with_last(at::IntArrayRef sizes, int64_t n) {
  std::vector<int64_t> shape(sizes.begin(), sizes.end() - 1);
  shape.push_back(n);
  return shape;
}

/// scale * a b over the leading axes ([..., m, k] by [..., k, n]), plus `addend` (broadcast to
/// [..., m, n]) when it is defined, which the GEMM accumulates into.
at::Tensor batched_matmul_product(const at::Tensor& a, const at::Tensor& b, double scale, const at::Tensor& addend);
/// Which matrix of b and of the output goes with matrix i of a (one leading axis): b[i] and
/// out[i] where null.
struct MatrixRows {
  const int64_t* b = nullptr;
  const int64_t* out = nullptr;
};

/// c = scale * a b, or c += scale * a b with `accumulate`, in place (c contiguous [..., m, n]), one
/// GEMM a matrix with the bits of batched_matmul_product; no autograd.
void batched_matmul_into(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double scale, bool accumulate,
                         const MatrixRows& rows);

/// 2x2 max pooling of the planes of x [planes, h, w] (contiguous): values, gradients and double
/// gradients carry max_pool2d's bits.
at::Tensor max_pool2_planes(const at::Tensor& x);

}  // namespace fax::kernels
