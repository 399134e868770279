#pragma once

// Shared helpers of the core tests: a seeding fixture and a finite-difference check of federated
// functions whose inputs and outputs may be server- or clients-placed.

#include <functional>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fax/fax.h>

namespace fax::test {

/// Seeds LibTorch's default generator before every test (PyTorch C++ frontend style).
class SeededTest : public ::testing::Test {
 protected:
  void SetUp() override { at::manual_seed(0); }
};

enum class Place { server, clients };

/// A federated function under test: gets its input already placed (a server tensor, or this
/// executor's rows of a clients tensor) and returns its output placed the same way as `out`.
using PlacedFn = std::function<at::Tensor(Program&, const at::Tensor&)>;

struct PlacedSignature {
  Place in;
  Place out;
};

/// Vector-Jacobian product of `fn` at x (global: [N, ...] when clients-placed) with cotangent v
/// (global), computed by federated AD on `mesh`; returned global.
at::Tensor federated_vjp(Mesh& mesh, const Cohort& cohort, PlacedSignature sig, const PlacedFn& fn,
                         const at::Tensor& x, const at::Tensor& v);

/// The same product by central finite differences of <v, fn(x)>, one input element at a time.
at::Tensor finite_difference_vjp(Mesh& mesh, const Cohort& cohort, PlacedSignature sig, const PlacedFn& fn,
                                 const at::Tensor& x, const at::Tensor& v, double eps = 1e-6);

/// Expects the two products to agree (float64 inputs): max |a - b| <= atol + rtol * max |b|.
void expect_vjp_matches_finite_differences(Mesh& mesh, const Cohort& cohort, PlacedSignature sig,
                                           const PlacedFn& fn, const at::Tensor& x, double atol = 1e-7,
                                           double rtol = 1e-6);

/// Gradient of a scalar server-placed loss with respect to a server input, by federated AD and by
/// finite differences.
void expect_gradient_matches_finite_differences(Mesh& mesh, const Cohort& cohort, const PlacedFn& loss,
                                                const at::Tensor& x, double atol = 1e-7, double rtol = 1e-6);

/// The message of the fax::Error that `fn` throws (a test failure when it throws none).
template <class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected fax::Error";
  return "";
}

/// Raw bytes of a tensor, for bit-identity assertions with readable failure output.
std::vector<uint8_t> bytes_of(const at::Tensor& t);

}  // namespace fax::test
