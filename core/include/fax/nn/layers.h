#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

/// Layers as pure functions of their parameters, batched over clients: when the parameters carry a
/// leading clients axis of size k, the input carries it too ([k, batch, ...]) and the whole chunk
/// runs as one kernel (batched GEMM, grouped convolution, offset embedding lookups). Without it they are
/// ordinary layers on [batch, ...]. Both give the same numbers for each client.
namespace fax {

/// x [k, b, in] with w [k, in, out], bias [k, out]; or x [b, in] with w [in, out], bias [out].
/// Extra middle axes of x (tokens) are allowed: [k, b, t, in].
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias);

/// x [k, b, c, h, w] with w [k, o, c, kh, kw], bias [k, o] (one grouped convolution over the
/// chunk); or x [b, c, h, w] with w [o, c, kh, kw], bias [o]. An undefined bias: none.
at::Tensor conv2d(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, int64_t padding,
                  int64_t stride = 1);

/// 2x2 max pooling with stride 2 over the last two axes, any number of leading axes.
at::Tensor max_pool2(const at::Tensor& x);

/// Token ids [k, b, t] into per-client tables [k, vocab, d] (one lookup into the tables stacked,
/// ids offset by client); or ids [b, t] into [vocab, d].
at::Tensor embedding(const at::Tensor& ids, const at::Tensor& table);

/// Normalises the last axis, then scales and shifts by gamma, beta ([k, d] or [d]).
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta);

/// Group normalisation of x [k, b, c, ...] (or [b, c, ...]) over `groups` groups of channels per
/// example, then a per-channel scale and shift gamma, beta ([k, c] or [c]).
at::Tensor group_norm(const at::Tensor& x, int64_t groups, const at::Tensor& gamma, const at::Tensor& beta);

/// scale * a @ b (+ addend, broadcast to [..., m, n], when given) for every index of the leading
/// axes a [..., m, k] and b [..., k, n] share (no broadcasting): out [..., m, n], contiguous. On the
/// CPU each product is one GEMM call that reads its operand where it lies (any strides with a unit
/// stride in one of the last two axes, e.g. a head of attention's fused q/k/v projection), where
/// at::matmul copies such views and dispatches one ATen call per matrix: float in oneDNN's sgemm
/// (faster than the OpenBLAS kernels LibTorch's own products use where the CPU has wider vector
/// units: experiments/bench/RESULTS.md), double in BLAS.
/// Differentiable to any order.
at::Tensor batched_matmul(const at::Tensor& a, const at::Tensor& b, double scale = 1.0,
                          const at::Tensor& addend = at::Tensor());
/// c += scale * a @ b in place, c contiguous [..., m, n] (every matrix its own): the bits of
/// batched_matmul(a, b, scale, c) without its copy of c. With `rows` ([k] int64, a [k, m, k']),
/// c [K, m, n] and c[rows[i]] += scale * a[i] @ b[i]: the matrices of a clients axis still in use,
/// without gathering them. c must not overlap a or b. Outside autograd only.
void batched_matmul_add_(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double scale = 1.0,
                         const at::Tensor& rows = at::Tensor());
/// scale * a[i] @ b[rows[i]] for a [k, m, k'], b [K, k', n], rows [k] int64: the bits of
/// batched_matmul(a, b.index_select(0, rows), scale) without gathering b. Outside autograd only.
at::Tensor batched_matmul_rows(const at::Tensor& a, const at::Tensor& b, const at::Tensor& rows, double scale = 1.0);

/// Multi-head causal self-attention of x [k, b, t, d] (or [b, t, d]) with fused projections
/// w_qkv [k, d, 3d], b_qkv [k, 3d] and w_out [k, d, d], b_out [k, d] (or without k).
at::Tensor causal_self_attention(const at::Tensor& x, const at::Tensor& w_qkv, const at::Tensor& b_qkv,
                                 const at::Tensor& w_out, const at::Tensor& b_out, int64_t heads);

}  // namespace fax
