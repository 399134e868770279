#pragma once

#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>

#include <fax/base/tensor_tree.h>

namespace fax {

template <class T>
inline constexpr bool is_federated_payload_v =
    std::is_same_v<T, at::Tensor> || std::is_same_v<T, TensorTree>;

namespace detail {
/// The value and accessors shared by both placements. Server and Clients derive from it separately
/// and are unrelated types: neither converts to the other, so a primitive that takes one rejects
/// the other at compile time.
template <class T>
class Placed {
  static_assert(is_federated_payload_v<T>, "a placed value holds an at::Tensor or a fax::TensorTree");

 public:
  using value_type = T;
  Placed() = default;
  explicit Placed(T value) : value_(std::move(value)) {}
  const T& value() const& { return value_; }
  T& value() & { return value_; }
  T value() && { return std::move(value_); }
  const T* operator->() const { return &value_; }
  T* operator->() { return &value_; }

 private:
  T value_;
};
}  // namespace detail

/// A server-placed value: one tensor (or tree), replicated on every executor.
template <class T>
class Server : public detail::Placed<T> {
 public:
  using detail::Placed<T>::Placed;
};

/// A clients-placed value: one row per client along a leading clients axis. Inside a program it
/// holds only this executor's clients, in cohort order.
template <class T>
class Clients : public detail::Placed<T> {
 public:
  using detail::Placed<T>::Placed;
};

template <class T>
Server(T) -> Server<T>;
template <class T>
Clients(T) -> Clients<T>;

}  // namespace fax
