#include <fax/layers.h>

#include <cmath>

#include <ATen/ATen.h>

#include <fax/error.h>

namespace fax {
namespace {

// The layer is batched over clients when its weight has one more axis than an unbatched one.
bool batched(const at::Tensor& w, int64_t unbatched_dim) { return w.dim() == unbatched_dim + 1; }

// Reshapes a per-client parameter [k, n] (or [n]) to broadcast against [k, ..., n] (or [..., n])
// with `middle` axes in between.
at::Tensor per_client(const at::Tensor& p, int64_t middle, bool is_batched) {
  if (!is_batched) return p;
  std::vector<int64_t> shape{p.size(0)};
  for (int64_t i = 0; i < middle; ++i) shape.push_back(1);
  shape.push_back(p.size(-1));
  return p.view(shape);
}

}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  if (!batched(w, 2)) {
    const at::Tensor flat = x.reshape({-1, x.size(-1)});
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
    shape.push_back(w.size(1));
    return at::addmm(bias, flat, w).view(shape);
  }
  const int64_t k = w.size(0);
  FAX_CHECK(x.size(0) == k, "linear: input has {} clients, weights {}", x.size(0), k);
  const at::Tensor flat = x.reshape({k, -1, x.size(-1)});
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(w.size(2));
  return at::baddbmm(bias.unsqueeze(1), flat, w).view(shape);
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
  const at::Tensor flat = x.reshape({-1, x.size(d - 3), x.size(d - 2), x.size(d - 1)});
  const at::Tensor pooled = at::max_pool2d(flat, {2, 2}, {2, 2});
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 2);
  shape.push_back(pooled.size(2));
  shape.push_back(pooled.size(3));
  return pooled.view(shape);
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

at::Tensor causal_self_attention(const at::Tensor& x, const at::Tensor& w_qkv, const at::Tensor& b_qkv,
                                 const at::Tensor& w_out, const at::Tensor& b_out, int64_t heads) {
  const int64_t t = x.size(-2), d = x.size(-1);
  FAX_CHECK(d % heads == 0, "attention: width {} is not a multiple of {} heads", d, heads);
  const int64_t head_dim = d / heads;
  const at::Tensor qkv = linear(x, w_qkv, b_qkv);  // [..., t, 3d]
  // Every leading axis (clients, batch) folds into one batch of sequences.
  const at::Tensor seq = qkv.reshape({-1, t, 3, heads, head_dim}).permute({2, 0, 3, 1, 4});  // [3, n, h, t, hd]
  const at::Tensor scores = at::matmul(seq[0], seq[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
  const at::Tensor mask = at::ones({t, t}, x.options().dtype(at::kBool)).triu(1);
  const at::Tensor attention = at::softmax(scores.masked_fill(mask, -std::numeric_limits<double>::infinity()), -1);
  const at::Tensor mixed = at::matmul(attention, seq[2]).permute({0, 2, 1, 3}).reshape(x.sizes());
  return linear(mixed, w_out, b_out);
}

}  // namespace fax
