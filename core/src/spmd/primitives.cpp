#include <fax/spmd/primitives.h>

#include <algorithm>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace fax {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The sum of no rows of x (an empty shard's): -0.0, the identity of floating-point addition
// (x + -0.0 is x bit for bit, where +0.0 would turn a sum of -0.0 into +0.0), so the shard-ordered
// sum of the others is unchanged; computed from x so that a gradient still reaches it.
at::Tensor empty_sum(const at::Tensor& x) {
  const at::Tensor zero = x.narrow(0, 0, 0).sum(0, false, x.scalar_type());
  return at::isFloatingType(x.scalar_type()) ? zero.neg() : zero;
}

// Sum of rows [r.begin, r.end) of x, strictly in row order: one elementwise add per row, so the
// bits do not depend on LibTorch's thread count or reduction blocking.
// Adds rows [r.begin, r.end) of x to `total` (undefined: starts from the first row); out of place
// when a gradient must flow through. map_sum_clients streams through the same adds. With
// `weights` (in x's type), row i is first multiplied by weights[i]: one row at a time, in cache.
at::Tensor add_rows_in_order(at::Tensor total, const at::Tensor& x, Range r, const at::Tensor& weights = {}) {
  if (!total.defined() && r.size() == 0) {
    std::vector<int64_t> shape(x.dim(), 1);
    shape[0] = x.size(0);
    return empty_sum(weights.defined() ? x * weights.view(shape) : x);
  }
  const bool graph = at::GradMode::is_enabled();
  for (int64_t i = r.begin; i < r.end; ++i) {
    const at::Tensor row = weights.defined() ? x.select(0, i) * weights.select(0, i) : x.select(0, i);
    if (!total.defined()) {
      total = weights.defined() ? row.contiguous() : row.clone(at::MemoryFormat::Contiguous);
    } else if (graph && (row.requires_grad() || total.requires_grad())) {
      total = total + row;
    } else {
      total.add_(row);
    }
  }
  return total;
}

at::Tensor ordered_row_sum(const at::Tensor& x, Range r) { return add_rows_in_order({}, x, r); }

variable_list sum_values(at::TensorList xs);
variable_list broadcast_values(at::TensorList xs);

// Clients -> server. Forward: per-shard partial sums, then the communicator's shard-ordered
// allreduce. Backward: broadcast (no communication).
struct SumFn : public torch::autograd::Function<SumFn> {
  static variable_list forward(AutogradContext*, at::TensorList xs) {
    const Program& p = Program::current();
    for (const auto& x : xs) detail::check_rows("sum input", x.dim() > 0 ? x.size(0) : -1, p.local_size());
    std::vector<ShardPartial> partials;
    const Range shards = p.local_shards();
    for (int64_t s = shards.begin; s < shards.end; ++s) {
      ShardPartial partial{s, {}};
      for (const auto& x : xs) partial.values.push_back(ordered_row_sum(x, p.shard_rows(s)));
      partials.push_back(std::move(partial));
    }
    return p.communicator().allreduce_sum(partials);
  }

  static variable_list backward(AutogradContext*, variable_list grads) { return broadcast_values(grads); }
};

// Server -> clients. Forward: an expanded view (no copy, no communication). Backward: sum, whose
// forward is the allreduce.
struct BroadcastFn : public torch::autograd::Function<BroadcastFn> {
  static variable_list forward(AutogradContext*, at::TensorList xs) {
    const int64_t n = Program::current().local_size();
    variable_list out;
    out.reserve(xs.size());
    for (const auto& x : xs) {
      std::vector<int64_t> shape{n};
      shape.insert(shape.end(), x.sizes().begin(), x.sizes().end());
      out.push_back(x.unsqueeze(0).expand(shape));
    }
    return out;
  }

  static variable_list backward(AutogradContext*, variable_list grads) { return sum_values(grads); }
};

// Per-shard partial sums -> server: the allreduce of SumFn for sums that map_sum_clients already
// reduced inside each shard. `flat` holds this executor's shards in order, `leaves` tensors each.
struct ShardSumFn : public torch::autograd::Function<ShardSumFn> {
  static variable_list forward(AutogradContext*, at::TensorList flat, int64_t leaves) {
    const Program& p = Program::current();
    const Range shards = p.local_shards();
    FAX_CHECK(static_cast<int64_t>(flat.size()) == shards.size() * leaves,
              "map_sum_clients: {} partial sums for {} shards of {} leaves", flat.size(), shards.size(), leaves);
    std::vector<ShardPartial> partials;
    for (int64_t s = 0; s < shards.size(); ++s) {
      partials.push_back({shards.begin + s, std::vector<at::Tensor>(flat.begin() + s * leaves, flat.begin() + (s + 1) * leaves)});
    }
    return p.communicator().allreduce_sum(partials);
  }

  // Each shard's partial enters the sum once: its gradient is the server gradient itself.
  static variable_list backward(AutogradContext*, variable_list grads) {
    const int64_t shards = Program::current().local_shards().size();
    variable_list out;
    for (int64_t s = 0; s < shards; ++s) out.insert(out.end(), grads.begin(), grads.end());
    out.emplace_back();  // leaves
    return out;
  }
};

variable_list sum_values(at::TensorList xs) { return SumFn::apply(xs); }
variable_list broadcast_values(at::TensorList xs) { return BroadcastFn::apply(xs); }

// w reshaped to [clients, 1, 1, ...] so it scales each client's row of x.
at::Tensor per_row(const at::Tensor& w, const at::Tensor& x) {
  std::vector<int64_t> shape(x.dim(), 1);
  shape[0] = w.size(0);
  return w.view(shape);
}

// The shared part of weighted_mean: sum(w * x_j) / sum(w) for each j, in one allreduce.
std::vector<at::Tensor> weighted_means(const std::vector<at::Tensor>& xs, const at::Tensor& w) {
  const Program& p = Program::current();
  FAX_CHECK(w.dim() == 1, "weighted_mean: weights must have shape [clients], got [{}]", fmt::join(w.sizes(), ", "));
  detail::check_rows("weighted_mean weights", w.size(0), p.local_size());
  std::vector<at::Tensor> terms;
  terms.reserve(xs.size() + 1);
  for (const auto& x : xs) terms.push_back(per_row(w, x) * x);
  terms.push_back(w);
  auto sums = sum_values(terms);
  const at::Tensor total = sums.back();
  sums.pop_back();
  for (auto& s : sums) s = s / total;
  return sums;
}

}  // namespace

Clients<at::Tensor> broadcast(const Server<at::Tensor>& x) {
  return Clients<at::Tensor>(broadcast_values({x.value()}).front());
}

Clients<TensorTree> broadcast(const Server<TensorTree>& x) {
  return Clients<TensorTree>(x.value().with_tensors(broadcast_values(x.value().tensors())));
}

Server<at::Tensor> sum(const Clients<at::Tensor>& x) { return Server<at::Tensor>(sum_values({x.value()}).front()); }

Server<TensorTree> sum(const Clients<TensorTree>& x) {
  return Server<TensorTree>(x.value().with_tensors(sum_values(x.value().tensors())));
}

namespace {
// The mean of no clients is their sum (-0.0), not 0 / 0.
double mean_divisor() { return static_cast<double>(std::max<int64_t>(Program::current().cohort_size(), 1)); }
}  // namespace

Server<at::Tensor> mean(const Clients<at::Tensor>& x) { return Server<at::Tensor>(sum(x).value() / mean_divisor()); }

Server<TensorTree> mean(const Clients<TensorTree>& x) {
  return Server<TensorTree>(scale(sum(x).value(), 1.0 / mean_divisor()));
}

Server<at::Tensor> weighted_mean(const Clients<at::Tensor>& x, const Clients<at::Tensor>& w) {
  return Server<at::Tensor>(weighted_means({x.value()}, w.value()).front());
}

Server<TensorTree> weighted_mean(const Clients<TensorTree>& x, const Clients<at::Tensor>& w) {
  return Server<TensorTree>(x.value().with_tensors(weighted_means(x.value().tensors(), w.value())));
}

Server<at::Tensor> collect(const Clients<at::Tensor>& x) {
  const Program& p = Program::current();
  detail::check_rows("collect input", detail::rows(x.value()), p.local_size());
  return Server<at::Tensor>(at::cat(p.communicator().allgather(x.value().detach().contiguous())));
}

namespace detail {

int64_t rows(const at::Tensor& x) {
  FAX_CHECK(x.dim() > 0, "a clients value needs a leading clients axis, got a 0-dim tensor");
  return x.size(0);
}

int64_t rows(const TensorTree& x) { return leading_size(x); }

at::Tensor rows_slice(const at::Tensor& x, int64_t begin, int64_t length) { return x.narrow(0, begin, length); }
TensorTree rows_slice(const TensorTree& x, int64_t begin, int64_t length) { return narrow(x, begin, length); }

at::Tensor rows_concat(const std::vector<at::Tensor>& parts) {
  return parts.size() == 1 ? parts.front() : at::cat(parts);
}
TensorTree rows_concat(const std::vector<TensorTree>& parts) { return cat(parts); }

at::Tensor rows_select(const at::Tensor& x) { return x.select(0, 0); }
TensorTree rows_select(const TensorTree& x) { return x.map([](const at::Tensor& t) { return t.select(0, 0); }); }
at::Tensor rows_unsqueeze(const at::Tensor& x) { return x.unsqueeze(0); }
TensorTree rows_unsqueeze(const TensorTree& x) { return x.map([](const at::Tensor& t) { return t.unsqueeze(0); }); }

TensorTree add_rows(TensorTree acc, const TensorTree& rows, const at::Tensor& weights) {
  // Through a graph the rows are weighted whole first, as scale_rows does: a row-by-row product
  // would give the weights' and rows' derivatives other bits (sums of other shapes, signs of zeros).
  if (weights.defined() && at::GradMode::is_enabled()) {
    const auto tensors = rows.tensors();
    if (weights.requires_grad() || std::any_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) { return t.requires_grad(); }))
      return add_rows(std::move(acc), scale_rows(rows, weights));
  }
  for (const auto& [name, x] : rows) {
    const at::Tensor w = weights.defined() ? weights.to(x.scalar_type()) : at::Tensor();
    acc.set(name, add_rows_in_order(acc.contains(name) ? acc.at(name) : at::Tensor(), x, {0, x.size(0)}, w));
  }
  return acc;
}

TensorTree add_sums(TensorTree acc, const TensorTree& sums) {
  return add_rows(std::move(acc), sums.map([](const at::Tensor& t) { return t.unsqueeze(0); }));
}

TensorTree sum_shard_partials(const std::vector<TensorTree>& partials) {
  FAX_CHECK(!partials.empty(), "map_sum_clients: this executor holds no clients");
  std::vector<at::Tensor> flat;
  for (const auto& partial : partials) {
    FAX_CHECK(partial.names() == partials.front().names(), "map_sum_clients: shards summed different leaves");
    const auto tensors = partial.tensors();
    flat.insert(flat.end(), tensors.begin(), tensors.end());
  }
  return partials.front().with_tensors(
      ShardSumFn::apply(at::TensorList(flat), static_cast<int64_t>(partials.front().size())));
}

std::vector<ClientChunk> chunks(const Program& p, int64_t chunk) {
  std::vector<ClientChunk> out;
  const Range shards = p.local_shards();
  for (int64_t s = shards.begin; s < shards.end; ++s) {
    const Range r = p.shard_rows(s);
    // An empty shard is one chunk of no clients: its results give the values' structure (and
    // map_sum_clients the shard's partial sum), so every executor takes part in what follows.
    if (r.size() == 0) out.push_back({p, s, r.begin, 0});
    const int64_t step = chunk > 0 ? chunk : r.size();
    for (int64_t b = r.begin; b < r.end; b += step) out.push_back({p, s, b, std::min(step, r.end - b)});
  }
  return out;
}

void check_rows(const char* what, int64_t got, int64_t expected) {
  FAX_CHECK(got == expected, "{} has {} rows on its clients axis, but this executor holds {} clients", what, got,
            expected);
}

}  // namespace detail
}  // namespace fax
