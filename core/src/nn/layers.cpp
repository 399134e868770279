#include <fax/nn/layers.h>

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
#include <torch/csrc/autograd/custom_function.h>

#include <fax/base/error.h>

#include "kernels/kernels.h"

namespace fax {
namespace {

using kernels::with_last;

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

// The leading axes of x ordered by stride, outermost first: x permuted so is usually contiguous
// without a copy, e.g. the [k, b, c, h, w] view of a grouped convolution's [b, k, c, h, w] output.
std::vector<int64_t> storage_order(const at::Tensor& x) {
  std::vector<int64_t> order(x.dim());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end() - 2, [&](int64_t a, int64_t b) { return x.stride(a) > x.stride(b); });
  return order;
}

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

at::Tensor conv2d(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, int64_t padding, int64_t stride) {
  if (!batched(w, 4)) return at::conv2d(x, w, bias, stride, padding);
  const int64_t k = w.size(0), b = x.size(1), c = x.size(2);
  // oneDNN runs a grouped convolution with few input channels per group as im2col and many tiny
  // GEMMs, but one client's convolution on its direct JIT kernels: faster below 16 channels, a
  // little slower from 16 up (experiments/bench/RESULTS.md, "Small convolutions").
  if (c < 16) {
    std::vector<at::Tensor> outs;
    outs.reserve(k);
    for (int64_t j = 0; j < k; ++j) outs.push_back(at::conv2d(x[j], w[j], bias.defined() ? bias[j] : bias, stride, padding));
    return at::stack(outs);
  }
  // [k, b, c, h, w] -> [b, k * c, h, w]; the clients become convolution groups.
  const at::Tensor grouped_x = x.transpose(0, 1).reshape({b, k * c, x.size(3), x.size(4)});
  const at::Tensor grouped_w = w.reshape({k * w.size(1), c, w.size(3), w.size(4)});
  const at::Tensor out =
      at::conv2d(grouped_x, grouped_w, bias.defined() ? bias.reshape({-1}) : bias, stride, padding, 1, k);
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
  const at::Tensor pooled = kernels::max_pool2_planes(in_order.contiguous().view({-1, x.size(d - 2), x.size(d - 1)}));
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

at::Tensor group_norm(const at::Tensor& x, int64_t groups, const at::Tensor& gamma, const at::Tensor& beta) {
  const bool is_batched = batched(gamma, 1);
  const int64_t channel_axis = is_batched ? 2 : 1;
  FAX_CHECK(x.dim() > channel_axis && x.size(channel_axis) == gamma.size(-1) && x.size(channel_axis) % groups == 0,
            "group_norm: input [{}] needs {} channels in {} groups", fmt::join(x.sizes(), ", "), gamma.size(-1),
            groups);
  // Each example normalises on its own, so the clients fold into the batch.
  const at::Tensor examples = is_batched ? x.flatten(0, 1) : x;
  const at::Tensor normalized = at::group_norm(examples, groups, {}, {}, 1e-5).view(x.sizes());
  const int64_t trailing = x.dim() - channel_axis - 1;
  const auto shaped = [&](const at::Tensor& p) {
    std::vector<int64_t> shape(p.sizes().begin(), p.sizes().end());
    if (is_batched) shape.insert(shape.begin() + 1, 1);  // the batch axis
    shape.insert(shape.end(), trailing, 1);
    return p.view(shape);
  };
  return normalized * shaped(gamma) + shaped(beta);
}

namespace {
void check_product_shapes(const at::Tensor& a, const at::Tensor& b) {
  FAX_CHECK(a.dim() >= 2 && a.dim() == b.dim() && a.sizes().slice(0, a.dim() - 2) == b.sizes().slice(0, b.dim() - 2) &&
                a.size(-1) == b.size(-2),
            "batched_matmul: shapes [{}] and [{}] do not match ([..., m, k] and [..., k, n])", fmt::join(a.sizes(), ", "),
            fmt::join(b.sizes(), ", "));
  check_alike("batched_matmul", {a, b});
}

// `rows` as batched_matmul_rows / batched_matmul_add_ take it: undefined, or [k] int64 into an axis of `size`.
std::vector<int64_t> matrix_rows(const char* op, const at::Tensor& rows, int64_t k, int64_t size) {
  if (!rows.defined()) return {};
  FAX_CHECK(rows.dim() == 1 && rows.size(0) == k && rows.scalar_type() == at::kLong, "{}: rows must be [{}] int64", op, k);
  const at::Tensor cpu = rows.cpu().contiguous();
  std::vector<int64_t> out(cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + k);
  for (int64_t r : out) FAX_CHECK(r >= 0 && r < size, "{}: row {} is outside 0..{}", op, r, size - 1);
  return out;
}

void check_outside_autograd(const char* op, std::initializer_list<std::reference_wrapper<const at::Tensor>> operands) {
  const bool graph = at::GradMode::is_enabled() &&
                     std::any_of(operands.begin(), operands.end(), [](const at::Tensor& t) { return t.requires_grad(); });
  FAX_CHECK(!graph, "{}: works outside autograd (use batched_matmul)", op);
}
}  // namespace

void batched_matmul_add_(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double scale,
                         const at::Tensor& rows) {
  check_product_shapes(a, b);
  check_alike("batched_matmul_add_", {a, c});
  check_outside_autograd("batched_matmul_add_", {a, b, c});
  std::vector<int64_t> shape = with_last(a.sizes(), b.size(-1));
  if (rows.defined()) {
    FAX_CHECK(a.dim() == 3 && c.dim() == 3, "batched_matmul_add_: rows need one leading axis (a [k, m, k'])");
    shape[0] = c.size(0);
  }
  FAX_CHECK(c.sizes() == at::IntArrayRef(shape) && c.is_contiguous(), "batched_matmul_add_: c [{}] is not a contiguous [{}]",
            fmt::join(c.sizes(), ", "), fmt::join(shape, ", "));
  const std::vector<int64_t> which = matrix_rows("batched_matmul_add_", rows, a.dim() == 3 ? a.size(0) : 0, c.size(0));
  if (!own_kernel_takes(a)) {
    const at::Tensor product = scale == 1.0 ? at::matmul(a, b) : at::matmul(a, b) * scale;
    if (rows.defined()) c.index_add_(0, rows, product);
    else c.add_(product);
    return;
  }
  kernels::batched_matmul_into(c, a, b, scale, true, {nullptr, rows.defined() ? which.data() : nullptr});
}

at::Tensor batched_matmul_rows(const at::Tensor& a, const at::Tensor& b, const at::Tensor& rows, double scale) {
  FAX_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(2) == b.size(1),
            "batched_matmul_rows: shapes [{}] and [{}] do not match ([k, m, k'] and [K, k', n])", fmt::join(a.sizes(), ", "),
            fmt::join(b.sizes(), ", "));
  check_alike("batched_matmul_rows", {a, b});
  check_outside_autograd("batched_matmul_rows", {a, b});
  const std::vector<int64_t> which = matrix_rows("batched_matmul_rows", rows, a.size(0), b.size(0));
  if (!own_kernel_takes(a)) {
    const at::Tensor product = at::matmul(a, b.index_select(0, rows));
    return scale == 1.0 ? product : product * scale;
  }
  at::Tensor out = at::empty({a.size(0), a.size(1), b.size(2)}, a.options());
  kernels::batched_matmul_into(out, a, b, scale, false, {which.data(), nullptr});
  return out;
}

at::Tensor batched_matmul(const at::Tensor& a, const at::Tensor& b, double scale, const at::Tensor& addend) {
  check_product_shapes(a, b);
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
  return kernels::batched_matmul_product(a, b, scale, addend);
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
