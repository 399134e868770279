#pragma once

// Secure aggregation, simulated: clients send integers modulo 2^b and the server learns only
// their sum (Bonawitz et al. 2017). A value is encoded on a fixed-point grid over a declared range
// [-R, R) with 2^b points; the sum wraps around modulo 2^b exactly as the real protocol's would
// when the cohort's total leaves the range. With pair masks each pair of clients shares a random
// vector that one adds and the other subtracts: a client's message alone is uniform modulo 2^b,
// and the masks cancel in the sum. The adjoint of a secure sum is a broadcast, as a sum's, so
// federated AD goes through it (README "Aggregation").

#include <cstdint>

#include <ATen/core/Tensor.h>

#include <fax/base/tensor_tree.h>
#include <fax/spmd/placement.h>
#include <fax/spmd/primitives.h>

namespace fax {

struct SecureSumOptions {
  int64_t bits = 32;   ///< b: values and sums are integers modulo 2^b (2..32)
  double range = 1.0;  ///< R: the grid covers [-R, R) in steps of 2R / 2^b
  bool masks = false;  ///< add pair masks that cancel in the sum
  /// Each client masks with its `neighbors` nearest cohort positions on a ring (SecAgg+'s sparse
  /// graph: cost neighbors x size instead of cohort x size); 0: with every other client.
  int64_t neighbors = 0;
};

class SecureSum {
 public:
  explicit SecureSum(SecureSumOptions o);

  /// The grid's step, 2R / 2^b.
  double step() const { return step_; }
  const SecureSumOptions& options() const { return o_; }

  /// What a chunk's clients send for their rows [k, ...]: each value clipped to [-R, R) (the share
  /// of a client's values that were is added to `clipped` [k]), rounded to the grid, plus the pair
  /// masks, as an integer modulo 2^b (int64 leaves). With `reduce` false the messages are left
  /// unreduced (each differs from the sent one by a multiple of 2^b): the masks then cancel exactly
  /// in an int64 sum, which is the cohort's signed sum on the grid, so one tree both decodes to the
  /// protocol's result and shows where it wrapped (overflows).
  TensorTree encode(const ClientChunk& chunk, const TensorTree& rows, at::Tensor& clipped, bool reduce = true) const;
  /// The server's value of a sum of what clients sent: modulo 2^b, as a signed integer, times the
  /// step, in the dtype of `like`'s leaves.
  TensorTree decode(const TensorTree& sum, const TensorTree& like) const;
  /// Values (no clients axis) rounded to the grid and wrapped into [-R, R), as integers modulo 2^b
  /// are: what noise added to a secure sum's integers leaves.
  TensorTree wrap(const TensorTree& values) const;
  /// How many coordinates of the signed sum (of unreduced messages) left the grid's integers (and
  /// wrapped in decode).
  int64_t overflows(const TensorTree& signed_sum) const;

 private:
  SecureSumOptions o_;
  double step_;
};

/// Clients -> server through a secure sum: decode(sum(encode(x))). The derivative is a sum's: its
/// backward broadcasts, so gradients through it equal the plain sum's (and higher orders work).
Server<TensorTree> secure_sum(const Clients<TensorTree>& x, const SecureSum& s);

/// `value` (a secure sum's decoded result) with the derivative of `plain` (the float sum of the
/// same rows): for map_sum_clients, which sums encoded rows that carry no gradient.
TensorTree with_sum_derivative(const TensorTree& value, const TensorTree& plain);

}  // namespace fax
