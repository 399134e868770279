#include <fax/base/tensor_tree.h>

#include <cstring>

#include <ATen/ATen.h>

#include <fax/base/error.h>

namespace fax {
namespace {

TensorTree zip_with(const TensorTree& a, const TensorTree& b, const char* operation,
                    const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& fn) {
  a.check_same_structure(b, operation);
  std::vector<at::Tensor> out;
  out.reserve(a.size());
  auto it = b.begin();
  for (const auto& [name, x] : a) out.push_back(fn(x, (it++)->second));
  return a.with_tensors(std::move(out));
}

// A tensor's raw bytes, made contiguous: used by bitwise comparison.
bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.detach().cpu().contiguous();
  const at::Tensor cb = b.detach().cpu().contiguous();
  // An empty tensor may have no data pointer, which memcmp must not get.
  return ca.numel() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * ca.element_size()) == 0;
}

// Applies `fn` to the i-th leaves of all trees, for every i: stack and cat along the clients axis.
TensorTree combine_leaves(const std::vector<TensorTree>& trees, const char* operation,
                          const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn) {
  FAX_CHECK(!trees.empty(), "TensorTree {}: no trees given", operation);
  const TensorTree& first = trees.front();
  for (const auto& t : trees) first.check_same_structure(t, operation);
  std::vector<at::Tensor> out;
  out.reserve(first.size());
  std::vector<at::Tensor> column(trees.size());
  for (size_t leaf = 0; leaf < first.size(); ++leaf) {
    for (size_t t = 0; t < trees.size(); ++t) column[t] = (trees[t].begin() + leaf)->second;
    out.push_back(fn(column));
  }
  return first.with_tensors(std::move(out));
}

}  // namespace

TensorTree::TensorTree(std::initializer_list<Entry> entries) {
  for (const auto& [name, value] : entries) set(name, value);
}

void TensorTree::set(const std::string& name, at::Tensor value) {
  for (auto& entry : entries_) {
    if (entry.first == name) {
      entry.second = std::move(value);
      return;
    }
  }
  entries_.emplace_back(name, std::move(value));
}

const at::Tensor& TensorTree::at(const std::string& name) const {
  for (const auto& entry : entries_)
    if (entry.first == name) return entry.second;
  throw Error(fmt::format("TensorTree has no leaf '{}' (leaves: {})", name, fmt::join(names(), ", ")));
}

at::Tensor& TensorTree::at(const std::string& name) {
  return const_cast<at::Tensor&>(static_cast<const TensorTree&>(*this).at(name));
}

bool TensorTree::contains(const std::string& name) const {
  for (const auto& entry : entries_)
    if (entry.first == name) return true;
  return false;
}

std::vector<std::string> TensorTree::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& entry : entries_) out.push_back(entry.first);
  return out;
}

std::vector<at::Tensor> TensorTree::tensors() const {
  std::vector<at::Tensor> out;
  out.reserve(entries_.size());
  for (const auto& entry : entries_) out.push_back(entry.second);
  return out;
}

int64_t TensorTree::numel() const {
  int64_t n = 0;
  for (const auto& entry : entries_) n += entry.second.numel();
  return n;
}

TensorTree TensorTree::with_tensors(std::vector<at::Tensor> tensors) const {
  FAX_ASSERT(tensors.size() == entries_.size(), "{} tensors for a tree of {} leaves", tensors.size(),
             entries_.size());
  TensorTree out;
  out.entries_.reserve(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i) out.entries_.emplace_back(entries_[i].first, std::move(tensors[i]));
  return out;
}

TensorTree TensorTree::map(const std::function<at::Tensor(const at::Tensor&)>& fn) const {
  std::vector<at::Tensor> out;
  out.reserve(entries_.size());
  for (const auto& entry : entries_) out.push_back(fn(entry.second));
  return with_tensors(std::move(out));
}

void TensorTree::check_same_structure(const TensorTree& other, const char* operation) const {
  const size_t n = std::min(size(), other.size());
  for (size_t i = 0; i < n; ++i) {
    FAX_CHECK(entries_[i].first == other.entries_[i].first,
              "TensorTree {}: leaf {} is '{}' on the left but '{}' on the right", operation, i,
              entries_[i].first, other.entries_[i].first);
  }
  FAX_CHECK(size() == other.size(), "TensorTree {}: {} leaves on the left, {} on the right ({})",
            operation, size(), other.size(),
            size() > other.size() ? "extra: '" + entries_[n].first + "'"
                                  : "extra: '" + other.entries_[n].first + "'");
}

TensorTree zip_map(const TensorTree& a, const TensorTree& b,
                   const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& fn) {
  return zip_with(a, b, "zip_map", fn);
}

TensorTree prefixed(const TensorTree& a, const std::string& prefix) {
  TensorTree out;
  for (const auto& [name, t] : a) out.set(prefix + name, t);
  return out;
}

TensorTree unprefixed(const TensorTree& a, const std::string& prefix) {
  TensorTree out;
  for (const auto& [name, t] : a)
    if (name.rfind(prefix, 0) == 0) out.set(name.substr(prefix.size()), t);
  return out;
}

TensorTree without_prefix(const TensorTree& a, const std::string& prefix) {
  TensorTree out;
  for (const auto& [name, t] : a)
    if (name.rfind(prefix, 0) != 0) out.set(name, t);
  return out;
}

TensorTree join(const std::vector<TensorTree>& trees) {
  TensorTree out;
  for (const auto& tree : trees) {
    for (const auto& [name, t] : tree) {
      FAX_CHECK(!out.contains(name), "TensorTree join: leaf '{}' appears twice", name);
      out.set(name, t);
    }
  }
  return out;
}

TensorTree add(const TensorTree& a, const TensorTree& b) {
  return zip_with(a, b, "add", [](const at::Tensor& x, const at::Tensor& y) { return x + y; });
}

TensorTree sub(const TensorTree& a, const TensorTree& b) {
  return zip_with(a, b, "sub", [](const at::Tensor& x, const at::Tensor& y) { return x - y; });
}

TensorTree scale(const TensorTree& a, double s) {
  return a.map([s](const at::Tensor& x) { return x * s; });
}

TensorTree scale(const TensorTree& a, const at::Tensor& s) {
  return a.map([&s](const at::Tensor& x) { return x * s; });
}

TensorTree axpy(double alpha, const TensorTree& x, const TensorTree& y) {
  return zip_with(x, y, "axpy", [alpha](const at::Tensor& u, const at::Tensor& v) { return v.add(u, alpha); });
}

TensorTree axpy(const at::Tensor& alpha, const TensorTree& x, const TensorTree& y) {
  return zip_with(x, y, "axpy", [&alpha](const at::Tensor& u, const at::Tensor& v) { return v + alpha * u; });
}

at::Tensor dot(const TensorTree& a, const TensorTree& b) {
  a.check_same_structure(b, "dot");
  FAX_CHECK(!a.empty(), "TensorTree dot: the trees are empty");
  at::Tensor total;
  auto it = b.begin();
  for (const auto& [name, x] : a) {
    at::Tensor term = (x * (it++)->second).sum();
    total = total.defined() ? total + term : term;
  }
  return total;
}

at::Tensor squared_norm(const TensorTree& a) { return dot(a, a); }

TensorTree zeros_like(const TensorTree& a) {
  return a.map([](const at::Tensor& x) { return at::zeros_like(x); });
}

TensorTree clone(const TensorTree& a) {
  return a.map([](const at::Tensor& x) { return x.clone(); });
}

TensorTree detach(const TensorTree& a) {
  return a.map([](const at::Tensor& x) { return x.detach(); });
}

TensorTree& requires_grad_(TensorTree& a, bool requires_grad) {
  for (auto& entry : a) entry.second.requires_grad_(requires_grad);
  return a;
}

at::Tensor flatten(const TensorTree& a) {
  FAX_CHECK(!a.empty(), "TensorTree flatten: the tree is empty");
  std::vector<at::Tensor> parts;
  parts.reserve(a.size());
  const auto& first = a.begin()->second;
  for (const auto& [name, x] : a) {
    FAX_CHECK(x.scalar_type() == first.scalar_type() && x.device() == first.device(),
              "TensorTree flatten: leaf '{}' is {} on {}, but leaf '{}' is {} on {}", name,
              c10::toString(x.scalar_type()), x.device().str(), a.begin()->first,
              c10::toString(first.scalar_type()), first.device().str());
    parts.push_back(x.reshape({-1}));
  }
  return at::cat(parts);
}

TensorTree unflatten(const at::Tensor& flat, const TensorTree& like) {
  FAX_CHECK(flat.dim() == 1 && flat.numel() == like.numel(),
            "TensorTree unflatten: a buffer of {} elements for a tree of {} elements", flat.numel(),
            like.numel());
  std::vector<at::Tensor> out;
  out.reserve(like.size());
  int64_t offset = 0;
  for (const auto& [name, x] : like) {
    out.push_back(flat.narrow(0, offset, x.numel()).view(x.sizes()));
    offset += x.numel();
  }
  return like.with_tensors(std::move(out));
}

namespace {
// [n, ...] as [n, row size]; reshape's -1 cannot infer it when n is 0.
at::Tensor by_rows(const at::Tensor& t) {
  return t.reshape({t.size(0), c10::multiply_integers(t.sizes().slice(1))});
}
}  // namespace

at::Tensor flatten_rows(const TensorTree& a, at::ScalarType dtype) {
  std::vector<at::Tensor> parts;
  for (const auto& [name, t] : a) parts.push_back(by_rows(t).to(dtype));
  return at::cat(parts, 1);
}

TensorTree unflatten_rows(const at::Tensor& flat, const TensorTree& like) {
  const int64_t n = leading_size(like);
  FAX_CHECK(flat.dim() == 2 && flat.size(0) == n && flat.size(1) * n == like.numel(),
            "TensorTree unflatten_rows: a buffer of {} elements in {} dimensions for a tree of {} rows of {} elements",
            flat.numel(), flat.dim(), n, n > 0 ? like.numel() / n : 0);
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const auto& [name, t] : like) {
    const int64_t size = n > 0 ? t.numel() / n : 0;
    out.push_back(flat.narrow(1, offset, size).reshape(t.sizes()).to(t.scalar_type()));
    offset += size;
  }
  return like.with_tensors(std::move(out));
}

TensorTree stack(const std::vector<TensorTree>& trees) {
  return combine_leaves(trees, "stack", [](const std::vector<at::Tensor>& xs) { return at::stack(xs); });
}

std::vector<TensorTree> unstack(const TensorTree& a) {
  const int64_t n = leading_size(a);
  std::vector<TensorTree> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) out.push_back(a.map([i](const at::Tensor& x) { return x.select(0, i); }));
  return out;
}

TensorTree narrow(const TensorTree& a, int64_t begin, int64_t length) {
  return a.map([=](const at::Tensor& x) { return x.narrow(0, begin, length); });
}

TensorTree cat(const std::vector<TensorTree>& trees) {
  if (trees.size() == 1) return trees.front();
  return combine_leaves(trees, "cat", [](const std::vector<at::Tensor>& xs) { return at::cat(xs); });
}

int64_t leading_size(const TensorTree& a) {
  FAX_CHECK(!a.empty(), "TensorTree: an empty tree has no clients axis");
  const int64_t n = a.begin()->second.dim() > 0 ? a.begin()->second.size(0) : -1;
  for (const auto& [name, x] : a) {
    FAX_CHECK(x.dim() > 0 && x.size(0) == n,
              "TensorTree: leaf '{}' has shape {} but the clients axis of leaf '{}' has size {}", name,
              fmt::to_string(fmt::join(x.sizes(), "x")), a.begin()->first, n);
  }
  return n;
}

at::Tensor row_sums(const TensorTree& a) {
  FAX_CHECK(!a.empty(), "TensorTree row_sums: the tree is empty");
  at::Tensor total;
  for (const auto& [name, t] : a) {
    const at::Tensor rows = t.flatten(1).sum(1);
    total = total.defined() ? total + rows : rows;
  }
  return total;
}

at::Tensor finite_rows(const TensorTree& a) {
  FAX_CHECK(!a.empty(), "TensorTree finite_rows: the tree is empty");
  at::Tensor finite;
  for (const auto& [name, t] : a) {
    // NaN and Inf carry into a row's sum, so a finite sum settles the row in one cheap pass; only
    // rows whose sum is not (a non-finite value, or finite values that overflow) are checked value
    // by value.
    const at::Tensor flat = by_rows(t.detach());
    at::Tensor rows = at::isfinite(flat.sum(1));
    if (!rows.all().item<bool>()) {
      const at::Tensor suspects = at::logical_not(rows).nonzero().flatten();
      rows.index_copy_(0, suspects, at::isfinite(flat.index_select(0, suspects)).all(1));
    }
    finite = finite.defined() ? finite & rows : rows;
  }
  return finite;
}

TensorTree scale_rows(const TensorTree& a, const at::Tensor& factors) {
  return a.map([&](const at::Tensor& t) {
    std::vector<int64_t> shape(t.dim(), 1);
    shape[0] = t.size(0);
    return t * factors.view(shape).to(t.scalar_type());
  });
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) { return same_bytes(a, b); }

bool bitwise_equal(const TensorTree& a, const TensorTree& b) {
  if (a.names() != b.names()) return false;
  auto it = b.begin();
  for (const auto& [name, x] : a)
    if (!same_bytes(x, (it++)->second)) return false;
  return true;
}

}  // namespace fax
