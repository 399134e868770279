#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace fax::cli {

/// fax-run sweep --launcher slurm: how the array is submitted.
struct SlurmSettings {
  std::string partition;   ///< empty: the cluster's default
  std::string time;        ///< a task's time limit as sbatch takes it; empty: the partition's
  int cpus = 0;            ///< CPUs per task; 0: the trial's executors x execution.threads
  std::string extra;       ///< more sbatch arguments, split at whitespace
  size_t max_running = 0;  ///< the array's %k; 0: no limit
};

/// A trial as its array task runs it: `fax-run resume` when its run log exists by then (a task
/// requeued or resubmitted after a checkpoint), else `fax-run run`.
struct SlurmTrial {
  size_t trial = 0;                 ///< its index in the sweep
  std::string name;                 ///< trial-NNNN: <dir>/<name>.h5 and <dir>/<name>.log
  std::vector<std::string> run;     ///< fax-run's arguments that start it
  std::vector<std::string> resume;  ///< fax-run's arguments that continue it
};

/// An array task that left the queue.
struct SlurmEnded {
  size_t trial = 0;
  std::optional<int> exit;  ///< fax-run's exit status; none: the task ended without one (killed,
                            ///< cancelled before it started, its node lost)
  double seconds = 0;       ///< the task's run time, when it said
};

/// The Slurm array tasks of one sweep directory. Each submission is recorded in <dir>/slurm/tasks
/// (job, array task, trial), so a sweep started again follows the tasks still queued instead of
/// submitting their trials twice. A task's script writes <dir>/slurm/<trial>.exit when fax-run
/// ends; a task that leaves the queue without one was stopped from outside.
class SlurmArrays {
 public:
  /// Reads the record of `dir` (absolute), whose sweep has the trials named `trials`. Throws
  /// fax::Error when Slurm's commands are not on PATH or the record names other trials.
  SlurmArrays(std::string dir, const std::vector<std::string>& trials);

  /// Whether sbatch and squeue are on PATH; check_available() throws fax::Error when not.
  static bool available();
  static void check_available();
  /// Whether `dir` records Slurm tasks (queued or not).
  static bool recorded(const std::string& dir);

  /// Asks squeue which recorded tasks are still queued (pending or running): they stay followed.
  /// The others are dropped and returned with how they ended (no status: stopped from outside).
  std::vector<SlurmEnded> adopt();

  /// The trials of the tasks followed.
  std::vector<size_t> followed() const;

  /// Submits `trials` as one array (sbatch --array=0-N[%k]) that runs `fax_run` (absolute path) from
  /// `workdir`. Throws fax::Error with sbatch's message when it refuses; nothing is recorded then.
  /// Returns the job id.
  std::string submit(const std::vector<SlurmTrial>& trials, const SlurmSettings& settings, const std::string& fax_run,
                     const std::string& workdir);

  /// The recorded tasks that have left the queue since the last call, with how they ended. A task
  /// gone without a status file is reported after a grace period (shared file systems show new
  /// files late).
  std::vector<SlurmEnded> poll();

  /// Whether any recorded task is still followed.
  bool empty() const { return tasks_.empty(); }
  /// The followed tasks' states at the last poll: "R running, P pending".
  std::string states() const;
  /// The job ids still followed, comma-separated (for scancel in messages).
  std::string jobs() const;

 private:
  struct Task {
    std::string job;
    size_t array_task = 0;
    size_t trial = 0;
    std::string name;
    double gone_since = -1;  ///< when squeue first missed it without a status file
  };
  // Per job followed, the state of each array task squeue lists.
  using Queue = std::map<std::string, std::map<size_t, std::string>>;
  // None when squeue failed this time; fax::Error after many failures in a row.
  std::optional<Queue> queue_of_jobs();
  // Drops the tasks that left `queue` and returns them; one without a status file only once it
  // has been gone `grace_s`.
  std::vector<SlurmEnded> settle(const Queue& queue, double grace_s);
  void write_record() const;
  std::string exit_path(const std::string& name) const;

  std::string dir_;
  std::vector<Task> tasks_;
  std::string name_;  ///< the arrays' job name, unique to the directory
  double squeue_failing_since_ = -1;
  size_t running_ = 0, pending_ = 0;
  std::set<std::string> reasons_;  ///< why pending tasks cannot start, as squeue says
};

}  // namespace fax::cli
