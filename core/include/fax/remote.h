#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fax/cohort.h>
#include <fax/program.h>
#include <fax/tensor_tree.h>

namespace fax {

/// The programs a remote executor runs: an experiment's round or evaluation, or fax's own
/// allreduce probe (input "elements" and "repeats": that many allreduces of a float32 tensor of
/// that many elements per logical shard; for measuring the data plane, see fax-run bench).
enum class TaskKind : int64_t { round = 1, evaluate = 2, allreduce_probe = 3 };

/// One executor's part of a task: runs the program for `kind` on this executor's clients and
/// returns what goes back to the coordinator.
using TaskFn = std::function<TensorTree(Program& program, TaskKind kind, const TensorTree& input)>;

/// How the executors of a task reduce: through the coordinator over TensorPipe (a star: best for
/// small models and few workers), or directly between the workers over Gloo (LibTorch's
/// c10d::ProcessGroupGloo: for large models, where the coordinator's link would be the limit).
/// Both give the same bits. TensorPipe carries everything else either way.
enum class Collectives { tensorpipe, gloo };

/// Where event lines go (worker connected, refused, dropped); empty: nowhere.
using LogFn = std::function<void(const std::string& line)>;

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
  /// Workers dropped so far (disconnected or timed out).
  int dropped_workers() const;
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

struct WorkerOptions {
  /// The coordinator's HOST:PORT.
  std::string connect;
  std::string token;
  /// How long to keep trying to reach the coordinator (it may start later than the worker).
  double connect_timeout_s = 60;
  /// How this worker is named in the coordinator's log (default: host:pid).
  std::string name;
  LogFn log;
};

/// What a worker needs to run tasks: its executor settings and the task function.
struct WorkerSetup {
  int threads = 1;         ///< LibTorch intra-op threads of the executor
  int64_t vectorize = 0;   ///< clients per map_clients chunk
  std::string identity;    ///< compared with CoordinatorOptions::identity
  TaskFn run;
  std::shared_ptr<void> keep_alive;  ///< whatever `run` refers to (data set, model, plugin)
};

/// Serves one coordinator: connects, authenticates, builds the experiment it sends with `setup`,
/// runs tasks until the coordinator ends the run, and returns. Throws fax::Error when the
/// coordinator cannot be reached, refuses this worker or goes away mid-run.
void run_worker(const WorkerOptions& options, const std::function<WorkerSetup(const std::string& experiment)>& setup);

}  // namespace fax
