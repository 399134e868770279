#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace fax {

/// An ordered map name -> tensor: model parameters, optimizer state, metrics. Order is insertion
/// order and is part of the value: binary operations require both operands to have the same names
/// in the same order, and flatten() lays leaves out in that order.
class TensorTree {
 public:
  using Entry = std::pair<std::string, at::Tensor>;

  TensorTree() = default;
  TensorTree(std::initializer_list<Entry> entries);

  /// Inserts `name`, or replaces its tensor keeping its position.
  void set(const std::string& name, at::Tensor value);
  const at::Tensor& at(const std::string& name) const;
  at::Tensor& at(const std::string& name);
  bool contains(const std::string& name) const;
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  std::vector<std::string> names() const;
  std::vector<at::Tensor> tensors() const;
  /// Total number of elements over all leaves.
  int64_t numel() const;

  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }
  auto begin() { return entries_.begin(); }
  auto end() { return entries_.end(); }

  /// A tree with the same names whose leaves are `tensors` (same count, same order).
  TensorTree with_tensors(std::vector<at::Tensor> tensors) const;
  /// Applies `fn` to every leaf, keeping names.
  TensorTree map(const std::function<at::Tensor(const at::Tensor&)>& fn) const;
  /// Throws fax::Error naming the first difference when `other` has other names or order.
  void check_same_structure(const TensorTree& other, const char* operation) const;

 private:
  std::vector<Entry> entries_;
};

/// fn(a_leaf, b_leaf) for every pair of leaves of two trees of the same structure.
TensorTree zip_map(const TensorTree& a, const TensorTree& b,
                   const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& fn);

/// The same leaves with `prefix` in front of every name ("m/" + "w" -> "m/w").
TensorTree prefixed(const TensorTree& a, const std::string& prefix);
/// The leaves whose names start with `prefix`, with the prefix removed.
TensorTree unprefixed(const TensorTree& a, const std::string& prefix);
/// The leaves whose names do not start with `prefix`.
TensorTree without_prefix(const TensorTree& a, const std::string& prefix);
/// The leaves of every tree in order; a name in two trees is an error.
TensorTree join(const std::vector<TensorTree>& trees);

// Arithmetic. All of it is differentiable (built from ATen ops) and keeps names and order.
TensorTree add(const TensorTree& a, const TensorTree& b);
TensorTree sub(const TensorTree& a, const TensorTree& b);
TensorTree scale(const TensorTree& a, double s);
/// Scales every leaf by a 0-dim tensor, so the factor can carry gradients (a learned rate).
TensorTree scale(const TensorTree& a, const at::Tensor& s);
/// alpha * x + y.
TensorTree axpy(double alpha, const TensorTree& x, const TensorTree& y);
TensorTree axpy(const at::Tensor& alpha, const TensorTree& x, const TensorTree& y);
/// Sum over all leaves of the elementwise product: a 0-dim tensor.
at::Tensor dot(const TensorTree& a, const TensorTree& b);
at::Tensor squared_norm(const TensorTree& a);
TensorTree zeros_like(const TensorTree& a);
TensorTree clone(const TensorTree& a);
TensorTree detach(const TensorTree& a);
/// Sets requires_grad on every leaf (leaves must be autograd leaves) and returns the tree.
TensorTree& requires_grad_(TensorTree& a, bool requires_grad = true);

inline TensorTree operator+(const TensorTree& a, const TensorTree& b) { return add(a, b); }
inline TensorTree operator-(const TensorTree& a, const TensorTree& b) { return sub(a, b); }
inline TensorTree operator*(double s, const TensorTree& a) { return scale(a, s); }
inline TensorTree operator*(const TensorTree& a, double s) { return scale(a, s); }

/// All leaves, reshaped to 1-D and concatenated in tree order: one contiguous buffer for
/// communication. Leaves must share one dtype and device.
at::Tensor flatten(const TensorTree& a);
/// Inverse of flatten(): cuts `flat` into leaves with the names and shapes of `like`.
TensorTree unflatten(const at::Tensor& flat, const TensorTree& like);

// The clients axis: a clients-placed tree has one extra leading axis on every leaf.
/// Stacks trees of identical structure along a new leading axis.
TensorTree stack(const std::vector<TensorTree>& trees);
/// Splits along the leading axis; inverse of stack().
std::vector<TensorTree> unstack(const TensorTree& a);
/// Rows [begin, begin + length) of the leading axis of every leaf (views).
TensorTree narrow(const TensorTree& a, int64_t begin, int64_t length);
/// Concatenates trees of identical structure along the existing leading axis.
TensorTree cat(const std::vector<TensorTree>& trees);
/// Size of the leading axis, shared by every leaf (error if leaves disagree or the tree is empty).
int64_t leading_size(const TensorTree& a);

/// Per row of the leading (clients) axis, every leaf's elements side by side, as `dtype`: [rows, P].
at::Tensor flatten_rows(const TensorTree& a, at::ScalarType dtype);
/// Inverse of flatten_rows(): cuts `flat` [rows, P] into leaves with the names, shapes and dtypes of `like`.
TensorTree unflatten_rows(const at::Tensor& flat, const TensorTree& like);
/// Per row of the leading (clients) axis, the sum of every element of every leaf: [rows].
at::Tensor row_sums(const TensorTree& a);
/// Per row of the leading (clients) axis: true when every value of every leaf is finite ([rows] bool).
at::Tensor finite_rows(const TensorTree& a);
/// Each row of every leaf multiplied by its factor (factors: [rows]).
TensorTree scale_rows(const TensorTree& a, const at::Tensor& factors);

/// Bitwise equality of names, dtypes, shapes and bytes. For reproducibility checks.
bool bitwise_equal(const TensorTree& a, const TensorTree& b);
bool bitwise_equal(const at::Tensor& a, const at::Tensor& b);

}  // namespace fax
