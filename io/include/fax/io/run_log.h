#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include <fax/base/tensor_tree.h>
#include <fax/io/hdf5.h>

namespace fax {

using Metrics = std::vector<std::pair<std::string, double>>;
using StringPairs = std::vector<std::pair<std::string, std::string>>;

/// One HDF5 file per run (libhdf5):
///   /config                      the resolved experiment, YAML text (string)
///   /env                         group; attributes: fax and LibTorch versions, host, seed, run_id, ... (strings)
///   /metrics/round               int64 [rounds]: the round number of each row (1-based)
///   /metrics/<name>              float64 [rounds]; NaN in rounds where the metric was not computed
///                                (a name with '/' is a nested group: /metrics/eval/accuracy)
///   /clients/id                  int64 [rounds, cohort]: the cohort's client ids (logging.per_client)
///   /clients/<name>              float64 [rounds, cohort]
///   /checkpoints/<round>/<leaf>  the state after that round, one dataset per tensor (params/w, ...)
/// Crash safety: the log is held in memory and the file is rewritten after every append, into a
/// new file beside it that is synced and renamed over the old one (fax/io/files.h), so a run killed
/// at any moment, or a full disk, leaves the previous or the new complete file. Checkpoints are
/// separate files, written the same way, in "<path>.checkpoints/round-<8 digits>-<run id>.h5";
/// /checkpoints/<round> is an HDF5 external link to one of them (h5py follows it), and a reader
/// follows it only to that file of the log's own checkpoint folder (RunLogReader::checkpoint).
/// A RunLog does not lock its file: the command that writes it holds a FileLock (fax/io/files.h).
class RunLog {
 public:
  /// Starts a new run log at `path` with a new run id (added to `env` as "run_id"). When no file
  /// is there the log is written at once; an existing file (and its checkpoints) is replaced only
  /// by the first commit after a round, so a run that fails before finishing one loses nothing.
  RunLog(const std::string& path, const std::string& config_yaml, const StringPairs& env);
  /// Continues the run log at `path` after round `after_round`: later rows and checkpoints (a run
  /// killed after its last checkpoint) are dropped, as are checkpoint files nothing links to.
  static RunLog resume(const std::string& path, int64_t after_round);
  ~RunLog();
  RunLog(RunLog&&) noexcept;
  RunLog& operator=(RunLog&&) noexcept;

  const std::string& path() const { return path_; }
  /// Whether nothing has been written yet because a file was there to replace (see the constructor).
  bool deferred() const;
  /// Adds one row to every metric (NaN for the ones missing from `metrics`) and, unless told not
  /// to, commits (rows not committed yet are written by the next commit).
  void append(int64_t round, const Metrics& metrics, bool commit_now = true);
  /// Adds one row of per-client values: ids [cohort] int64, values name -> [cohort] (committed
  /// with the next append or commit).
  void append_clients(const at::Tensor& ids, const std::vector<std::pair<std::string, at::Tensor>>& values);
  /// Writes the state after `round` as a checkpoint file now; the log links it from the next
  /// append or commit, so a round's metrics and its checkpoint appear in the log together. With
  /// `keep` > 0 the log then links only the newest `keep` checkpoints, and the files of the others
  /// are removed once that log is on disk (never before: a crash leaves the old log's files).
  void checkpoint(int64_t round, const TensorTree& state, int64_t keep = 0);
  /// Adds (or replaces) an /env entry, written with the next commit.
  void set_env(const std::string& key, const std::string& value);
  /// Rewrites the file with everything added so far, then removes checkpoint files that neither
  /// it nor a later commit links to (those of a replaced run, or after a crash).
  void commit();

 private:
  RunLog() = default;

  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

/// Refuses (fax::Error) when a file exists at `path` that is not a fax run log: a new run log
/// replaces only an earlier one, never a lock file, a checkpoint or anyone's data.
void check_replaceable_run_log(const std::string& path);

/// Reads what RunLog wrote. Every accessor checks the object's type and shape first, so a
/// malformed or hostile file is a fax::Error naming the file and the object, never a crash.
class RunLogReader {
 public:
  explicit RunLogReader(const std::string& path);

  const std::string& path() const { return file_.path(); }
  std::string config() const;
  StringPairs env() const;
  /// The /env entry `key`, or "" when there is none.
  std::string env(const std::string& key) const;
  std::vector<int64_t> rounds() const;
  /// Metric names (without "/metrics/" and without "round"), in name order.
  std::vector<std::string> metric_names() const;
  /// One value per round (checked: float64 [rounds]).
  std::vector<double> metric(const std::string& name) const;
  /// Any numeric dataset of the file as a tensor of its shape and type ("/clients/id", ...).
  at::Tensor dataset(const std::string& name) const;
  std::vector<int64_t> checkpoint_rounds() const;
  /// The state after `round`, read from the file the log links to, which must be that round's
  /// checkpoint of this run in the log's own checkpoint folder (nothing found elsewhere is used).
  TensorTree checkpoint(int64_t round) const;
  /// The folder beside the log at `log` that holds its checkpoints (<log>.checkpoints).
  static std::string checkpoint_folder(const std::string& log);
  /// The file name a checkpoint of `round` has in the checkpoint folder of a run with this id
  /// ("" for logs written before run ids: round-<8 digits>.h5).
  static std::string checkpoint_name(int64_t round, const std::string& run_id);
  bool has(const std::string& name) const { return file_.exists(name); }
  std::vector<std::string> datasets_below(const std::string& group) const { return file_.datasets_below(group); }

 private:
  h5::File file_;
};

}  // namespace fax
