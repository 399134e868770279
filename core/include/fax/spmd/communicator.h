#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace fax {

/// One logical shard's contribution to an allreduce: the partial sum over its clients (in client
/// order) of each value being reduced.
struct ShardPartial {
  int64_t shard = 0;
  std::vector<at::Tensor> values;
};

/// Collectives over the executors of a mesh. Every executor calls the same collectives in the same
/// order (SPMD); a backend may check that and fail with fax::Error when they disagree.
class Communicator {
 public:
  virtual ~Communicator() = default;

  /// This executor's index and the number of executors.
  virtual int rank() const = 0;
  virtual int size() const = 0;

  /// Sums, for each value j, the partials of all logical shards of the mesh *in shard order*:
  /// ((p_0 + p_1) + p_2) + ... This executor passes the partials of the shards it owns. The result
  /// has the same bits on every executor and does not depend on how shards map to executors.
  virtual std::vector<at::Tensor> allreduce_sum(const std::vector<ShardPartial>& partials) = 0;

  /// Every executor returns its own copy of `root`'s `values` (the arguments of other ranks are
  /// ignored but must have the same count).
  virtual std::vector<at::Tensor> broadcast(const std::vector<at::Tensor>& values, int root) = 0;

  /// Every executor returns `local` of every rank, in rank order.
  virtual std::vector<at::Tensor> allgather(const at::Tensor& local) = 0;

  virtual void barrier() = 0;

  /// This rank's program failed: every collective of every rank that waits now or starts later
  /// throws fax::Error carrying `reason`, so no rank stays blocked.
  virtual void abort(const std::string& reason) = 0;

  /// This rank's program returned. A rank that waits in, or later enters, a collective this rank
  /// will never join fails with fax::Error instead of blocking: the programs were not SPMD.
  virtual void finish() = 0;
};

}  // namespace fax
