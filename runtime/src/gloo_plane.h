#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <fax/base/error.h>
#include <fax/spmd/communicator.h>

// The Gloo data plane of remote executors: the allreduce of a task's executors goes over LibTorch's
// c10d::ProcessGroupGloo directly between the workers instead of through the coordinator, with
// the same bits as every other backend. TensorPipe stays the control plane.
namespace fax::remote {

/// A collective of the data plane failed: a peer died, or did not join within the timeout.
class CommunicationError : public Error {
 public:
  using Error::Error;
};

/// The rendezvous store of the Gloo groups (a c10d::TCPStore server on a free port), held by the
/// coordinator. Like torch.distributed's, it listens on every interface and does not authenticate.
class GlooStore {
 public:
  explicit GlooStore(double timeout_s);
  ~GlooStore();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The Gloo process group of one generation of executors. The coordinator starts a new generation
/// whenever the set of workers running a task changes (a worker dropped or joined).
class GlooGroup {
 public:
  /// Joins the group of `generation` as `rank` of `size`, through the store at store_ip:store_port;
  /// this end listens on `local_ip`, or on the interface $GLOO_SOCKET_IFNAME names. Blocks until
  /// every rank has joined; throws CommunicationError after `timeout_s`.
  GlooGroup(const std::string& store_ip, int store_port, int64_t generation, int rank, int size, double timeout_s,
            const std::string& local_ip);
  ~GlooGroup();

  int64_t generation() const { return generation_; }

  /// Communicator::allreduce_sum over the group, where rank r owns the next `shards_per_rank[r]`
  /// logical shards. An owner-sliced reduce-scatter: every rank sends slice d of each of its
  /// shards' partials to rank d (one alltoall), rank d adds the L slices it receives in shard
  /// order, and an allgather assembles the sum. A ring allreduce would add in another order.
  std::vector<at::Tensor> allreduce_sum(const std::vector<ShardPartial>& partials,
                                        const std::vector<int64_t>& shards_per_rank);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t generation_;
};

}  // namespace fax::remote
