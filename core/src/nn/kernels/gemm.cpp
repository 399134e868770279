// The GEMM over leading axes (kernels.h).

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <oneapi/dnnl/dnnl.h>
#include <torch/csrc/autograd/custom_function.h>

#include <fax/base/error.h>
#include <fax/nn/layers.h>

#include "kernels.h"

namespace fax::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Fortran BLAS (OpenBLAS here), for double.
extern "C" void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const double* alpha, const double* a, const int* lda, const double* b, const int* ldb,
                       const double* beta, double* c, const int* ldc);

// Row-major c [m, n] = alpha op(a) op(b) + beta c, beta 0 or 1. Float goes to oneDNN's sgemm (the
// library LibTorch's convolutions run in): its JIT kernels use the CPU's widest vector units,
// where OpenBLAS's are pinned to AVX2 (measured in experiments/bench/RESULTS.md). oneDNN has no
// double GEMM.
void gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc) {
  const dnnl_status_t status = dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  FAX_CHECK(status == dnnl_success, "batched_matmul: oneDNN's sgemm failed on {}x{} by {}x{} (status {})", m, k, k, n,
            static_cast<int>(status));
}

void gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  FAX_CHECK(std::max({m, n, k, lda, ldb, ldc}) <= kMax, "batched_matmul: a matrix of {}x{} by {}x{} is too large for BLAS",
            m, k, k, n);
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k), lda_i = static_cast<int>(lda),
            ldb_i = static_cast<int>(ldb), ldc_i = static_cast<int>(ldc);
  // Row-major c = op(a) op(b) is column-major c^T = op(b)^T op(a)^T.
  dgemm_(&tb, &ta, &ni, &mi, &ki, &alpha, b, &ldb_i, a, &lda_i, &beta, c, &ldc_i);
}

// A row-major matrix [rows, cols] as a row-major GEMM reads it: itself ('N') when its columns are
// adjacent, `ld` the step between rows; its transpose stored row-major ('T') when its rows are,
// `ld` the step between columns.
struct GemmOperand {
  char trans;
  int64_t ld;
};

std::optional<GemmOperand> gemm_operand(const at::Tensor& x) {
  const int64_t rows = x.size(-2), cols = x.size(-1), row_step = x.stride(-2), col_step = x.stride(-1);
  if ((cols == 1 || col_step == 1) && (rows == 1 || row_step >= cols)) return GemmOperand{'N', rows == 1 ? cols : row_step};
  if ((rows == 1 || row_step == 1) && (cols == 1 || col_step >= rows)) return GemmOperand{'T', cols == 1 ? rows : col_step};
  return std::nullopt;
}

// x as the GEMM reads it, after a contiguous copy when neither of its last two strides is 1.
GemmOperand readable_operand(at::Tensor& x) {
  if (const std::optional<GemmOperand> in_place = gemm_operand(x)) return *in_place;
  x = x.contiguous();
  return *gemm_operand(x);
}

// out [..., m, n] (contiguous) = scale * a b, plus out's own values with `accumulate`: one GEMM a
// matrix, which adds the product to them in place, as baddbmm does. With `rows` (one leading
// axis), matrix i of a goes with matrix rows.b[i] of b and rows.out[i] of out, where given.
void gemm_into(const at::Tensor& out, at::Tensor a, at::Tensor b, double scale, bool accumulate, const MatrixRows& rows) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const int64_t lead = a.dim() - 2;
  int64_t matrices = 1;
  for (int64_t axis = 0; axis < lead; ++axis) matrices *= a.size(axis);
  if (m * n * matrices == 0) return;
  if (k == 0) {
    if (accumulate) return;
    if (rows.out == nullptr) out.zero_();
    for (int64_t i = 0; rows.out != nullptr && i < matrices; ++i) out[rows.out[i]].zero_();
    return;
  }
  const GemmOperand la = readable_operand(a), lb = readable_operand(b);
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "fax::batched_matmul", [&] {
    const scalar_t* ap = a.data_ptr<scalar_t>();
    const scalar_t* bp = b.data_ptr<scalar_t>();
    scalar_t* cp = out.data_ptr<scalar_t>();
    std::vector<int64_t> index(lead, 0);
    int64_t a_offset = 0, b_offset = 0;
    for (int64_t i = 0; i < matrices; ++i) {
      const int64_t b_at = rows.b != nullptr ? rows.b[i] * b.stride(0) : b_offset;
      const int64_t c_at = (rows.out != nullptr ? rows.out[i] : i) * m * n;
      gemm(la.trans, lb.trans, m, n, k, static_cast<scalar_t>(scale), ap + a_offset, la.ld, bp + b_at, lb.ld,
           static_cast<scalar_t>(accumulate ? 1 : 0), cp + c_at, n);
      // The next leading index, odometer-style.
      for (int64_t axis = lead - 1; axis >= 0; --axis) {
        a_offset += a.stride(axis);
        b_offset += b.stride(axis);
        if (++index[axis] < a.size(axis)) break;
        a_offset -= a.stride(axis) * a.size(axis);
        b_offset -= b.stride(axis) * b.size(axis);
        index[axis] = 0;
      }
    }
  });
}

// scale * a b, plus `addend` (broadcast to [..., m, n]) when it is defined.
at::Tensor batched_matmul_kernel(const at::Tensor& a, const at::Tensor& b, double scale, const at::Tensor& addend) {
  const std::vector<int64_t> shape = with_last(a.sizes(), b.size(-1));
  at::Tensor out = at::empty(shape, a.options());
  if (addend.defined()) out.copy_(addend.expand(shape));
  gemm_into(out, a, b, scale, addend.defined(), {});
  return out;
}

// d(a b)/da = g b^T and d(a b)/db = a^T g, both products of this function again: transposes are
// views it reads in place, and the backward is differentiable in turn. The addend's gradient is g
// summed to its shape. Only the gradients autograd asks for are computed (a layer's input often
// needs none).
struct BatchedMatmulFn : public torch::autograd::Function<BatchedMatmulFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b, double scale,
                            const c10::optional<at::Tensor>& addend) {
    ctx->save_for_backward({a, b});
    ctx->saved_data["scale"] = scale;
    if (addend) ctx->saved_data["addend"] = addend->sizes().vec();
    return batched_matmul_kernel(a, b, scale, addend.value_or(at::Tensor()));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const double scale = ctx->saved_data["scale"].toDouble();
    const at::Tensor& g = grads[0];
    // Inputs count by tensor given (a, b, an addend); the gradients returned, by argument (the scale's too).
    const auto wanted = [&](size_t input, const auto& gradient) {
      return ctx->needs_input_grad(input) ? gradient() : at::Tensor();
    };
    const auto addend = ctx->saved_data.find("addend");
    return {wanted(0, [&] { return batched_matmul(g, saved[1].transpose(-2, -1), scale); }),
            wanted(1, [&] { return batched_matmul(saved[0].transpose(-2, -1), g, scale); }), at::Tensor(),
            addend == ctx->saved_data.end() ? at::Tensor()
                                            : wanted(2, [&] { return at::sum_to(g, addend->second.toIntVector()); })};
  }
};

}  // namespace

void batched_matmul_into(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double scale, bool accumulate,
                         const MatrixRows& rows) {
  gemm_into(c, a, b, scale, accumulate, rows);
}

at::Tensor batched_matmul_product(const at::Tensor& a, const at::Tensor& b, double scale, const at::Tensor& addend) {
  return BatchedMatmulFn::apply(a, b, scale, addend.defined() ? c10::optional<at::Tensor>(addend) : c10::nullopt);
}

}  // namespace fax::kernels
