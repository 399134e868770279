#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fax/base/tensor_tree.h>
#include <fax/runtime/remote.h>

namespace fax {

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
