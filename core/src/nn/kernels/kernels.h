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

/// 2x2 max pooling of the planes of x [planes, h, w] or [planes, h, w, inner] (contiguous; with
/// `inner`, each of a plane's inner elements is pooled on its own): values, gradients and double
/// gradients carry max_pool2d's bits.
at::Tensor max_pool2_planes(const at::Tensor& x);

// Convolutions with the batch innermost (conv_batch_inner.cpp): images [k, c, h, w, n], each
// client's n images in the vector lanes, n a whole number of vectors (zero images pad it). Stride
// 1, kernels of 3x3 or 5x5, CPU float or double with AVX-512.

/// Whether the batch-inner convolutions run x (the CPU has AVX-512 and x fits the list above).
bool batch_inner_takes(const at::Tensor& x, int64_t kernel_size);
/// x [k, b, c, h, w] -> [k, c, h + 2 padding, w + 2 padding, n]: zeros around and after the images.
at::Tensor to_batch_inner(const at::Tensor& x, int64_t padding);
/// Zeros around the planes of x [k, c, h, w, n].
at::Tensor pad_batch_inner(const at::Tensor& x, int64_t padding);
/// x [k, c, h, w, n] -> [k, images, c * h * w] (NCHW's flatten order), the first `images` images.
at::Tensor flatten_batch_inner(const at::Tensor& x, int64_t images);
/// x [k, c, h, w, n] * w [k, o, c, K, K] + bias [k, o] (or undefined): [k, o, h - K + 1, w - K + 1, n].
/// Differentiable any number of times, on the same kernels.
at::Tensor conv2d_batch_inner(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias);
/// 2x2 max pooling of x [k, c, h, w, n] over h and w (max_pool2_planes).
at::Tensor max_pool2_batch_inner(const at::Tensor& x);

}  // namespace fax::kernels
