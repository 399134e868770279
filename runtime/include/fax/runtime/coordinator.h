#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fax/base/cohort.h>
#include <fax/base/tensor_tree.h>
#include <fax/runtime/remote.h>
#include <fax/spmd/mesh.h>

namespace fax {

struct CoordinatorOptions {
  /// HOST:PORT to listen on (port 0: any free port; address() says which).
  std::string listen = "127.0.0.1:0";
  /// Workers to wait for before the first task.
  int workers = 1;
  /// Shared secret every worker must present; a worker without it is refused. Required.
  std::string token;
  /// A worker silent for this long (no heartbeat, no message) is dropped.
  double timeout_s = 30;
  /// How often workers send a heartbeat.
  double heartbeat_s = 1;
  /// A new connection must authenticate (say hello with the token) within this many seconds, or
  /// it is closed; at most `max_unauthenticated` may be waiting at once (more are closed at once).
  double handshake_s = 10;
  int max_unauthenticated = 64;
  /// Where allreduces go; broadcast, allgather and barrier always go through the coordinator.
  Collectives collectives = Collectives::tensorpipe;
  /// The resolved experiment (YAML) every worker loads.
  std::string experiment;
  /// The floating-point mode of the coordinator's own sums (TensorPipe allreduces), as the
  /// executors' (MeshOptions::flush_denormals).
  bool flush_denormals = true;
  /// What the experiment resolves to here (algorithm build, data, model; see WorkerSetup): a worker
  /// whose setup reports something else would not compute the same bits, and is refused. Empty:
  /// not checked.
  std::string identity;
  LogFn log;
};

/// The coordinator of remote executors (TensorPipe over TCP): listens for `fax-run worker`
/// processes, authenticates them with the shared token, sends them the experiment and runs tasks
/// on them. Worker e of a task is executor e: it runs the program on the logical shards that
/// ShardLayout gives executor e. Collectives go through the coordinator, which sums shard partials
/// in shard order (the same arithmetic as the local backend), or, with Collectives::gloo, the
/// allreduces go between the workers with that same arithmetic; either way results are
/// bit-identical to a local run with the same logical shards and threads per executor.
///
/// A worker that disconnects or stays silent past the timeout is dropped: the task is aborted on
/// the others and run again from its start on the remaining workers (a task's inputs are kept
/// until it completes, and its result does not depend on the executor count). A worker that
/// connects later is given work from the next task on.
class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions options);
  /// Tells the workers the run is over.
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  /// The HOST:PORT workers connect to.
  std::string address() const;
  /// Blocks until `options.workers` workers are ready. Throws fax::Error when a worker cannot load
  /// the experiment, or when `stop` says so.
  void wait_for_workers(const std::function<bool()>& stop = {});
  /// Workers connected, authenticated and ready now.
  int ready_workers() const;
  /// Gloo groups formed so far: one more each time the workers running a task change (0 with
  /// TensorPipe collectives).
  int64_t gloo_generations() const;

  /// Runs a task on E = min(ready workers, logical_shards) executors; `input(e, layout)` is
  /// executor e's input. Returns each executor's reply, in executor order. A program that throws
  /// on a worker fails the task with that worker's message (fax::Error); a dropped worker makes it
  /// run again on the others; with no worker left it waits up to the timeout for one to connect.
  std::vector<TensorTree> run(TaskKind kind, RoundInfo info, const Cohort& cohort, int64_t logical_shards,
                              const std::function<TensorTree(int executor, const ShardLayout& layout)>& input);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fax
