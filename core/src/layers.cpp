#include <fax/layers.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <oneapi/dnnl/dnnl.h>
#include <torch/csrc/autograd/custom_function.h>

#include <fax/error.h>

namespace fax {
namespace {

// The layer is batched over clients when its weight has one more axis than an unbatched one.
bool batched(const at::Tensor& w, int64_t unbatched_dim) { return w.dim() == unbatched_dim + 1; }

// Whether fax's own kernels take x: a CPU tensor of float or double (others go to ATen).
bool own_kernel_takes(const at::Tensor& x) {
  return x.is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble);
}

// fax's kernels neither promote nor move: `op`'s operands share the first one's type and device.
void check_alike(const char* op, std::initializer_list<std::reference_wrapper<const at::Tensor>> operands) {
  const at::Tensor& first = *operands.begin();
  const bool alike = std::all_of(operands.begin(), operands.end(), [&](const at::Tensor& t) {
    return t.scalar_type() == first.scalar_type() && t.device() == first.device();
  });
  if (alike) return;
  std::vector<std::string> names;
  for (const at::Tensor& t : operands) names.push_back(t.toString());
  throw Error(fmt::format("{}: operands differ in type or device ({})", op, fmt::join(names, ", ")));
}

// Reshapes a per-client parameter [k, n] (or [n]) to broadcast against [k, ..., n] (or [..., n])
// with `middle` axes in between.
at::Tensor per_client(const at::Tensor& p, int64_t middle, bool is_batched) {
  if (!is_batched) return p;
  std::vector<int64_t> shape{p.size(0)};
  for (int64_t i = 0; i < middle; ++i) shape.push_back(1);
  shape.push_back(p.size(-1));
  return p.view(shape);
}

// `sizes` with its last axis resized to n: the shape of a product or a linear layer's output.
std::vector<int64_t> with_last(at::IntArrayRef sizes, int64_t n) {
  std::vector<int64_t> shape(sizes.begin(), sizes.end() - 1);
  shape.push_back(n);
  return shape;
}

// 2x2 max pooling. LibTorch 1.13's NCHW max_pool2d kernel on the CPU is scalar and general
// (dilation, padding): ~22% of a CNN round. This one pools the planes of a contiguous tensor and
// keeps, per output, which corner won (0..3, row-major) for the backward pass. It picks the corner
// max_pool2d picks: the first maximum in row-major order, or the last NaN; so values, gradients
// and double gradients carry the same bits as max_pool2d's.
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Planes {
  int64_t count, h, w;  // input planes [count, h, w]; outputs [count, h / 2, w / 2]
  int64_t out_size() const { return (h / 2) * (w / 2); }
};

// Runs f(first, end) over ranges of planes on LibTorch's intra-op threads.
template <typename F>
void for_planes(const Planes& p, F f) {
  at::parallel_for(0, p.count, std::max<int64_t>(1, 32768 / (p.h * p.w)), f);
}

// Whether `candidate` (at corner `later`) replaces `best` (at corner `earlier`) under max_pool2d's
// choice: a NaN beats numbers and earlier NaNs; among numbers the larger wins, the earlier on ties.
// Bitwise operators, not && and ||: without branches the compiler vectorises the loops below.
template <typename T>
bool replaces(T candidate, T best, T later, T earlier) {
  return (candidate > best) | ((candidate == best) & (later < earlier)) |
         ((candidate != candidate) & ((best == best) | (later > earlier)));
}

template <typename T>
void pool_planes(const T* x, T* out, uint8_t* corners, const Planes& p, int64_t first, int64_t end) {
  const int64_t h2 = p.h / 2, w2 = p.w / 2, n = p.out_size();
  // Per plane: the maxima of each column's two rows (contiguous), then of each pair of columns,
  // then the corners as bytes; three loops the compiler vectorises. Corners are kept as T until
  // the last loop so that every loop works on one element width.
  std::vector<T> column_max(2 * n), column_corner(2 * n), corner(n);
  for (int64_t plane = first; plane < end; ++plane) {
    for (int64_t i = 0; i < h2; ++i) {
      const T* top = x + (plane * p.h + 2 * i) * p.w;
      const T* bottom = top + p.w;
      T* m = column_max.data() + i * 2 * w2;
      T* c = column_corner.data() + i * 2 * w2;
      for (int64_t j = 0; j < 2 * w2; ++j) {
        const bool lower = replaces<T>(bottom[j], top[j], 2, 0);
        m[j] = lower ? bottom[j] : top[j];
        c[j] = lower ? 2 : 0;
      }
    }
    T* o = out + plane * n;
    for (int64_t j = 0; j < n; ++j) {
      const T left = column_max[2 * j], right = column_max[2 * j + 1];
      const T left_corner = column_corner[2 * j], right_corner = column_corner[2 * j + 1] + 1;
      const bool take_right = replaces(right, left, right_corner, left_corner);
      o[j] = take_right ? right : left;
      corner[j] = take_right ? right_corner : left_corner;
    }
    uint8_t* co = corners + plane * n;
    for (int64_t j = 0; j < n; ++j) co[j] = static_cast<uint8_t>(corner[j]);
  }
}

// Calls f(window_row(plane, i)) for every row i of windows of every plane, on LibTorch's threads.
// A WindowRow points at the window's two input rows, at its outputs and at its corners, given as
// T so that the loops over a row work on one element width and vectorise.
template <typename T>
struct WindowRow {
  T* up;
  T* down;
  T* out;
  const T* corner;
};

template <typename T, typename F>
void for_window_rows(const Planes& p, T* x, T* out, const uint8_t* corners, F f) {
  const int64_t n = p.out_size(), w2 = p.w / 2;
  for_planes(p, [&](int64_t first, int64_t end) {
    std::vector<T> corner(n);
    for (int64_t plane = first; plane < end; ++plane) {
      for (int64_t j = 0; j < n; ++j) corner[j] = corners[plane * n + j];
      for (int64_t i = 0; i < p.h / 2; ++i) {
        T* up = x + (plane * p.h + 2 * i) * p.w;
        f(WindowRow<T>{up, up + p.w, out + plane * n + i * w2, corner.data() + i * w2});
      }
    }
  });
}

// grad_x = P^T grad_out: each output's gradient to its corner, zero elsewhere. `+ 0` as in
// max_pool2d's backward (it adds into zeros), which turns -0 into +0.
at::Tensor scatter_to_corners(const at::Tensor& grad_out, const at::Tensor& corners, const Planes& p) {
  at::Tensor g = grad_out.contiguous();
  // An odd last row or column belongs to no window; every other element is written below.
  const bool uncovered = p.h % 2 != 0 || p.w % 2 != 0;
  at::Tensor grad_x = uncovered ? at::zeros({p.count, p.h, p.w}, g.options()) : at::empty({p.count, p.h, p.w}, g.options());
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "fax::max_pool2 backward", [&] {
    const int64_t w2 = p.w / 2;
    for_window_rows<scalar_t>(p, grad_x.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(), corners.data_ptr<uint8_t>(),
                              [w2](WindowRow<scalar_t> r) {
                                for (int64_t j = 0; j < w2; ++j) {
                                  const scalar_t v = r.out[j] + scalar_t(0), c = r.corner[j], zero = 0;
                                  r.up[2 * j] = c == 0 ? v : zero;
                                  r.up[2 * j + 1] = c == 1 ? v : zero;
                                  r.down[2 * j] = c == 2 ? v : zero;
                                  r.down[2 * j + 1] = c == 3 ? v : zero;
                                }
                              });
  });
  return grad_x;
}

// grad_out = P grad_x: each output reads its corner.
at::Tensor gather_from_corners(const at::Tensor& grad_x, const at::Tensor& corners, const Planes& p) {
  at::Tensor g = grad_x.contiguous();
  at::Tensor grad_out = at::empty({p.count, p.h / 2, p.w / 2}, g.options());
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "fax::max_pool2 double backward", [&] {
    const int64_t w2 = p.w / 2;
    for_window_rows<scalar_t>(p, g.data_ptr<scalar_t>(), grad_out.data_ptr<scalar_t>(), corners.data_ptr<uint8_t>(),
                              [w2](WindowRow<scalar_t> r) {
                                for (int64_t j = 0; j < w2; ++j) {
                                  const scalar_t c = r.corner[j];
                                  r.out[j] = c == 0   ? r.up[2 * j]
                                             : c == 1 ? r.up[2 * j + 1]
                                             : c == 2 ? r.down[2 * j]
                                                      : r.down[2 * j + 1];
                                }
                              });
  });
  return grad_out;
}

void save_corners(AutogradContext* ctx, const at::Tensor& corners, const Planes& p) {
  ctx->saved_data["corners"] = corners;
  ctx->saved_data["count"] = p.count;
  ctx->saved_data["h"] = p.h;
  ctx->saved_data["w"] = p.w;
}

// What save_corners kept.
struct SavedCorners {
  at::Tensor corners;
  Planes planes;
};

SavedCorners saved_corners(AutogradContext* ctx) {
  return {ctx->saved_data["corners"].toTensor(),
          {ctx->saved_data["count"].toInt(), ctx->saved_data["h"].toInt(), ctx->saved_data["w"].toInt()}};
}

// The pooling's backward as a function of its own, linear in grad_out: its backward is the gather.
struct ScatterFn : public torch::autograd::Function<ScatterFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad_out, const at::Tensor& corners, Planes p) {
    save_corners(ctx, corners, p);
    return scatter_to_corners(grad_out, corners, p);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads);
};

struct GatherFn : public torch::autograd::Function<GatherFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad_x, const at::Tensor& corners, Planes p) {
    save_corners(ctx, corners, p);
    return gather_from_corners(grad_x, corners, p);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const SavedCorners saved = saved_corners(ctx);
    return {ScatterFn::apply(grads[0], saved.corners, saved.planes), at::Tensor(), at::Tensor()};
  }
};

variable_list ScatterFn::backward(AutogradContext* ctx, variable_list grads) {
  const SavedCorners saved = saved_corners(ctx);
  return {GatherFn::apply(grads[0], saved.corners, saved.planes), at::Tensor(), at::Tensor()};
}

// x: [planes, h, w], contiguous.
struct MaxPool2Fn : public torch::autograd::Function<MaxPool2Fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    const Planes p{x.size(0), x.size(1), x.size(2)};
    at::Tensor out = at::empty({p.count, p.h / 2, p.w / 2}, x.options());
    at::Tensor corners = at::empty({p.count, p.h / 2, p.w / 2}, x.options().dtype(at::kByte));
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "fax::max_pool2", [&] {
      const scalar_t* xp = x.data_ptr<scalar_t>();
      scalar_t* op = out.data_ptr<scalar_t>();
      uint8_t* cp = corners.data_ptr<uint8_t>();
      for_planes(p, [&](int64_t first, int64_t end) { pool_planes(xp, op, cp, p, first, end); });
    });
    save_corners(ctx, corners, p);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const SavedCorners saved = saved_corners(ctx);
    return {ScatterFn::apply(grads[0], saved.corners, saved.planes)};
  }
};

// The leading axes of x ordered by stride, outermost first: x permuted so is usually contiguous
// without a copy, e.g. the [k, b, c, h, w] view of a grouped convolution's [b, k, c, h, w] output.
std::vector<int64_t> storage_order(const at::Tensor& x) {
  std::vector<int64_t> order(x.dim());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end() - 2, [&](int64_t a, int64_t b) { return x.stride(a) > x.stride(b); });
  return order;
}

// Fortran BLAS (OpenBLAS here), for double.
extern "C" void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const double* alpha, const double* a, const int* lda, const double* b, const int* ldb,
                       const double* beta, double* c, const int* ldc);

// Row-major c [m, n] = alpha op(a) op(b) + beta c, beta 0 or 1. Float goes to oneDNN's sgemm (the
// library LibTorch's convolutions run in): its JIT kernels use the CPU's widest vector units,
// 2-3x OpenBLAS's pinned AVX2 kernels on an AVX-512 host for every shape fax's models use (see
// experiments/bench/RESULTS.md). oneDNN has no double GEMM.
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

// scale * a b, plus `addend` (broadcast to [..., m, n]) when it is defined: GEMM adds the product
// to it in place, as baddbmm does.
at::Tensor batched_matmul_kernel(at::Tensor a, at::Tensor b, double scale, const at::Tensor& addend) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const std::vector<int64_t> shape = with_last(a.sizes(), n);
  at::Tensor out = at::empty(shape, a.options());
  if (addend.defined()) out.copy_(addend.expand(shape));
  if (out.numel() == 0) return out;
  if (k == 0) return addend.defined() ? out : out.zero_();
  const GemmOperand la = readable_operand(a), lb = readable_operand(b);
  const int64_t lead = a.dim() - 2;
  const int64_t matrices = out.numel() / (m * n);
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "fax::batched_matmul", [&] {
    const scalar_t* ap = a.data_ptr<scalar_t>();
    const scalar_t* bp = b.data_ptr<scalar_t>();
    scalar_t* cp = out.data_ptr<scalar_t>();
    std::vector<int64_t> index(lead, 0);
    int64_t a_offset = 0, b_offset = 0;
    for (int64_t i = 0; i < matrices; ++i) {
      gemm(la.trans, lb.trans, m, n, k, static_cast<scalar_t>(scale), ap + a_offset, la.ld, bp + b_offset, lb.ld,
           static_cast<scalar_t>(addend.defined() ? 1 : 0), cp + i * m * n, n);
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

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  if (!batched(w, 2)) {
    const at::Tensor flat = x.reshape({-1, x.size(-1)});
    check_alike("linear", {x, w, bias});
    return batched_matmul(flat, w, 1.0, bias).view(with_last(x.sizes(), w.size(1)));
  }
  const int64_t k = w.size(0), n = w.size(2);
  FAX_CHECK(x.size(0) == k, "linear: input has {} clients, weights {}", x.size(0), k);
  FAX_CHECK(x.size(-1) == w.size(1), "linear: input has {} features, weights take {}", x.size(-1), w.size(1));
  FAX_CHECK(bias.dim() == 2 && bias.size(0) == k && bias.size(1) == n, "linear: bias [{}] does not match weights [{}]",
            fmt::join(bias.sizes(), ", "), fmt::join(w.sizes(), ", "));
  check_alike("linear", {x, w, bias});
  // [k, rows, d]: one product per client; a 3-axis input is that already.
  const bool rows = x.dim() == 3;
  const at::Tensor flat = rows ? x : x.reshape({k, -1, x.size(-1)});
  const at::Tensor out = batched_matmul(flat, w, 1.0, bias.unsqueeze(1));
  return rows ? out : out.view(with_last(x.sizes(), n));
}

at::Tensor conv2d(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, int64_t padding) {
  if (!batched(w, 4)) return at::conv2d(x, w, bias, 1, padding);
  // [k, b, c, h, w] -> [b, k * c, h, w]; the clients become convolution groups.
  const int64_t k = w.size(0), b = x.size(1), c = x.size(2);
  const at::Tensor grouped_x = x.transpose(0, 1).reshape({b, k * c, x.size(3), x.size(4)});
  const at::Tensor grouped_w = w.reshape({k * w.size(1), c, w.size(3), w.size(4)});
  const at::Tensor out = at::conv2d(grouped_x, grouped_w, bias.reshape({-1}), 1, padding, 1, k);
  return out.view({b, k, w.size(1), out.size(2), out.size(3)}).transpose(0, 1);
}

at::Tensor max_pool2(const at::Tensor& x) {
  const int64_t d = x.dim();
  FAX_CHECK(d >= 3, "max_pool2: input has {} axes, needs at least 3 ([..., channels, height, width])", d);
  const auto pooled_shape = [d](at::IntArrayRef sizes) {
    std::vector<int64_t> shape(sizes.begin(), sizes.end());
    shape[d - 2] /= 2;
    shape[d - 1] /= 2;
    return shape;
  };
  if (!own_kernel_takes(x) || x.numel() == 0) {
    const at::Tensor flat = x.reshape({-1, x.size(d - 3), x.size(d - 2), x.size(d - 1)});
    return at::max_pool2d(flat, {2, 2}, {2, 2}).view(pooled_shape(x.sizes()));
  }
  const std::vector<int64_t> order = storage_order(x);
  const at::Tensor in_order = x.permute(order);
  const at::Tensor pooled = MaxPool2Fn::apply(in_order.contiguous().view({-1, x.size(d - 2), x.size(d - 1)}));
  std::vector<int64_t> inverse(d);
  for (int64_t i = 0; i < d; ++i) inverse[order[i]] = i;
  return pooled.view(pooled_shape(in_order.sizes())).permute(inverse);
}

at::Tensor embedding(const at::Tensor& ids, const at::Tensor& table) {
  if (!batched(table, 2)) return at::embedding(table, ids);
  const int64_t k = table.size(0), vocab = table.size(1);
  std::vector<int64_t> offset_shape(ids.dim(), 1);
  offset_shape[0] = k;
  const at::Tensor offsets = (at::arange(k, ids.options()) * vocab).view(offset_shape);
  return at::embedding(table.reshape({k * vocab, table.size(2)}), ids + offsets);
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta) {
  const bool is_batched = batched(gamma, 1);
  const at::Tensor normalized = at::layer_norm(x, {x.size(-1)}, {}, {}, 1e-5);
  const int64_t middle = x.dim() - 2;
  return normalized * per_client(gamma, middle, is_batched) + per_client(beta, middle, is_batched);
}

at::Tensor batched_matmul(const at::Tensor& a, const at::Tensor& b, double scale, const at::Tensor& addend) {
  FAX_CHECK(a.dim() >= 2 && a.dim() == b.dim() && a.sizes().slice(0, a.dim() - 2) == b.sizes().slice(0, b.dim() - 2) &&
                a.size(-1) == b.size(-2),
            "batched_matmul: shapes [{}] and [{}] do not match ([..., m, k] and [..., k, n])", fmt::join(a.sizes(), ", "),
            fmt::join(b.sizes(), ", "));
  check_alike("batched_matmul", {a, b});
  if (addend.defined()) {
    check_alike("batched_matmul", {a, addend});
    const std::vector<int64_t> shape = with_last(a.sizes(), b.size(-1));
    FAX_CHECK(at::is_expandable_to(addend.sizes(), shape), "batched_matmul: addend [{}] does not broadcast to [{}]",
              fmt::join(addend.sizes(), ", "), fmt::join(shape, ", "));
  }
  if (!own_kernel_takes(a)) {
    const at::Tensor product = scale == 1.0 ? at::matmul(a, b) : at::matmul(a, b) * scale;
    return addend.defined() ? product + addend : product;
  }
  return BatchedMatmulFn::apply(a, b, scale, addend.defined() ? c10::optional<at::Tensor>(addend) : c10::nullopt);
}

at::Tensor causal_self_attention(const at::Tensor& x, const at::Tensor& w_qkv, const at::Tensor& b_qkv,
                                 const at::Tensor& w_out, const at::Tensor& b_out, int64_t heads) {
  const int64_t t = x.size(-2), d = x.size(-1);
  FAX_CHECK(d % heads == 0, "attention: width {} is not a multiple of {} heads", d, heads);
  const int64_t head_dim = d / heads;
  const at::Tensor qkv = linear(x, w_qkv, b_qkv);  // [..., t, 3d]
  // Every leading axis (clients, batch) folds into one batch of sequences.
  // q, k, v: [n, h, t, hd] views of qkv, read in place.
  const std::vector<at::Tensor> qkv_heads = qkv.reshape({-1, t, 3, heads, head_dim}).permute({2, 0, 3, 1, 4}).unbind(0);
  const at::Tensor scores =
      batched_matmul(qkv_heads[0], qkv_heads[1].transpose(-2, -1), 1.0 / std::sqrt(static_cast<double>(head_dim)));
  const at::Tensor mask = at::ones({t, t}, x.options().dtype(at::kBool)).triu(1);
  const at::Tensor attention = at::softmax(scores.masked_fill(mask, -std::numeric_limits<double>::infinity()), -1);
  const at::Tensor mixed = batched_matmul(attention, qkv_heads[2]).permute({0, 2, 1, 3}).reshape(x.sizes());
  return linear(mixed, w_out, b_out);
}

}  // namespace fax
