#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <fax/base/cohort.h>
#include <fax/spmd/communicator.h>
#include <fax/spmd/placement.h>

namespace fax {

/// What keys a program's random streams.
struct RoundInfo {
  uint64_t seed = 0;
  int64_t round = 0;
};

/// One executor's view of a running federated program: which clients of the cohort it holds, how
/// they are cut into logical shards, and the communicator that joins it to the other executors.
/// The primitives find it through Program::current(), which is set on executor threads only.
class Program {
 public:
  Program(const Cohort& cohort, const ShardLayout& layout, int executor, Communicator& communicator,
          RoundInfo info, int64_t vectorize);

  /// The program running on this thread; throws fax::Error outside Mesh::run.
  static Program& current();
  static bool active();

  int executor() const { return executor_; }
  int executors() const { return layout_.executors(); }
  const Cohort& cohort() const { return cohort_; }
  /// N: clients in the whole cohort, over all executors.
  int64_t cohort_size() const { return cohort_.size(); }
  const ShardLayout& layout() const { return layout_; }
  /// Cohort positions held by this executor; a clients value here has local_size() rows.
  Range local_positions() const { return local_; }
  int64_t local_size() const { return local_.size(); }
  /// Logical shards owned by this executor.
  Range local_shards() const { return layout_.executor_shards(executor_); }
  /// Rows of this executor's clients values that belong to logical shard `shard`.
  Range shard_rows(int64_t shard) const;
  uint64_t seed() const { return info_.seed; }
  int64_t round() const { return info_.round; }
  /// Clients per map_clients chunk; 0 = a whole logical shard at once.
  int64_t vectorize() const { return vectorize_; }
  Communicator& communicator() const { return communicator_; }

  /// This executor's rows of a tensor with one row per cohort position ([N, ...]).
  Clients<at::Tensor> local_rows(const at::Tensor& all) const;
  Clients<TensorTree> local_rows(const TensorTree& all) const;
  /// The cohort weights of this executor's clients, shape [local_size()].
  Clients<at::Tensor> weights(c10::ScalarType dtype = c10::ScalarType::Float) const;
  /// Builds a clients value row by row: make(client id, cohort position) returns one client's row.
  Clients<at::Tensor> clients_from(const std::function<at::Tensor(int64_t id, int64_t position)>& make) const;
  /// The random stream of the client at cohort position `position`, keyed by (seed, round, id).
  at::Generator client_generator(int64_t position) const;

 private:
  const Cohort& cohort_;
  ShardLayout layout_;
  int executor_;
  Communicator& communicator_;
  RoundInfo info_;
  int64_t vectorize_;
  Range local_;
};

/// How a mesh runs programs.
struct MeshOptions {
  /// Executor threads. Each runs the whole program on its own logical shards.
  int executors = 1;
  /// Logical shards the cohort is cut into (0: one per executor). Results depend on this number,
  /// never on `executors`; it must be at least `executors`. A cohort smaller than it (Poisson
  /// sampling draws any size, even 0) leaves shards empty: see map_clients.
  int64_t logical_shards = 0;
  /// LibTorch intra-op threads of each executor. Part of the reproducibility key: the client
  /// function's own kernels (GEMM, reductions) may split work by thread count.
  int threads_per_executor = 1;
  /// Clients per map_clients chunk (0: a whole logical shard).
  int64_t vectorize = 0;
  /// Executor threads flush subnormal floats to zero (x86's FTZ and DAZ, as TensorFlow's threads
  /// do): a saturated model's gradients are full of them, and some x86 cores take microcode
  /// assists on each (experiments/bench/RESULTS.md has the measurement). Part of the experiment: it may
  /// change rounding where a result is subnormal.
  bool flush_denormals = true;
};

namespace detail {
/// Makes `p` the current program of this thread for the scope's lifetime (what executor backends
/// do around a program).
class ProgramScope {
 public:
  explicit ProgramScope(Program& p);
  ~ProgramScope();
  ProgramScope(const ProgramScope&) = delete;
  ProgramScope& operator=(const ProgramScope&) = delete;
};
inline at::Tensor detached(const at::Tensor& x) { return x.detach(); }
TensorTree detached(const TensorTree& x);
template <class T>
struct is_server : std::false_type {};
template <class T>
struct is_server<Server<T>> : std::true_type {};
}  // namespace detail

/// Local executors (threads) that run federated programs SPMD: the same function on every
/// executor, each over its own clients, meeting in the primitives' collectives. The counterpart of
/// FAX's fax_program. Executor threads live as long as the mesh.
class Mesh {
 public:
  explicit Mesh(MeshOptions options = {});
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  const MeshOptions& options() const;

  /// Runs `program(Program&) -> Server<T>` on every executor for `cohort` and returns the result,
  /// which is the same on every executor. The result is detached from the autograd graph: take
  /// gradients inside the program. If an executor throws, the others are released from their
  /// collectives and the first error is rethrown here.
  template <class F>
  auto run(const Cohort& cohort, F&& program, RoundInfo info = {}) {
    return std::move(run_replicas(cohort, std::forward<F>(program), info).front());
  }

  /// Like run(), but returns every executor's copy of the result (for checking they agree).
  template <class F>
  auto run_replicas(const Cohort& cohort, F&& program, RoundInfo info = {}) {
    using R = std::invoke_result_t<F&, Program&>;
    static_assert(detail::is_server<R>::value, "a program returns a server-placed value (fax::Server<T>)");
    std::vector<R> out(executors());
    run_erased(cohort, info, [&](Program& p) { out[p.executor()] = R(detail::detached(program(p).value())); });
    return out;
  }

  int executors() const;

 private:
  void run_erased(const Cohort& cohort, RoundInfo info, const std::function<void(Program&)>& program);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fax
