#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include <fax/hdf5.h>
#include <fax/tensor_tree.h>

namespace fax {

using Metrics = std::vector<std::pair<std::string, double>>;
using StringPairs = std::vector<std::pair<std::string, std::string>>;

/// One HDF5 file per run (libhdf5):
///   /config                      the resolved experiment, YAML text (string)
///   /env                         group; attributes: fax and LibTorch versions, host, seed, ... (strings)
///   /metrics/round               int64 [rounds]: the round number of each row (1-based)
///   /metrics/<name>              float64 [rounds]; NaN in rounds where the metric was not computed
///                                (a name with '/' is a nested group: /metrics/eval/accuracy)
///   /clients/id                  int64 [rounds, cohort]: the cohort's client ids (logging.per_client)
///   /clients/<name>              float64 [rounds, cohort]
///   /checkpoints/<round>/<leaf>  the state after that round, one dataset per tensor (params/w, ...)
/// Every append is flushed, so a killed run leaves a readable file.
class RunLog {
 public:
  RunLog(const std::string& path, const std::string& config_yaml, const StringPairs& env);
  ~RunLog();
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;

  const std::string& path() const { return path_; }
  /// Adds one row to every metric (NaN for the ones missing from `metrics`) and flushes.
  void append(int64_t round, const Metrics& metrics);
  /// Adds one row of per-client values: ids [cohort] int64, values name -> [cohort].
  void append_clients(const at::Tensor& ids, const std::vector<std::pair<std::string, at::Tensor>>& values);
  /// Writes /checkpoints/<round>/ with one dataset per leaf and flushes.
  void checkpoint(int64_t round, const TensorTree& state);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

/// Reads what RunLog wrote.
class RunLogReader {
 public:
  explicit RunLogReader(const std::string& path);

  std::string config() const;
  StringPairs env() const;
  std::vector<int64_t> rounds() const;
  /// Metric names (without "/metrics/" and without "round"), in name order.
  std::vector<std::string> metric_names() const;
  std::vector<double> metric(const std::string& name) const;
  /// Any numeric dataset of the file as a tensor of its shape and type ("/clients/id", ...).
  at::Tensor dataset(const std::string& name) const;
  std::vector<int64_t> checkpoint_rounds() const;
  TensorTree checkpoint(int64_t round) const;

 private:
  h5::File file_;
};

}  // namespace fax
