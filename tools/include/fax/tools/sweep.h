#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fax {

/// One setting a trial changes, as `--set` takes it: {"algorithm.client_lr", "0.1"}.
using Override = std::pair<std::string, std::string>;

/// A key drawn at random for each sample of a random search.
struct RandomKey {
  enum class Kind { LogUniform, Uniform, IntUniform, Choice };
  std::string key;
  Kind kind = Kind::Uniform;
  double low = 0;   ///< numeric kinds: inclusive bounds
  double high = 0;
  std::vector<std::string> choices;  ///< Choice
};

/// What a sweep runs: the `sweep:` section of an experiment file plus `--grid` options.
///
///   sweep:
///     grid:                                 # every combination, first key varying slowest
///       algorithm.client_lr: [0.01, 0.1]
///       algorithm:                          # a value may be a mapping: settings that go together
///         - {name: fedavg}
///         - {name: fedopt, server_optimizer: adam}
///     random:                               # `samples` draws per grid point
///       samples: 4
///       seed: 0
///       algorithm.server_lr: {log_uniform: [0.001, 1]}   # also uniform, int_uniform, choice
///     seeds: [0, 1]                         # or repeats: R (the experiment's seed, +1, ...)
///     metric: eval/accuracy                 # ranks trials by its last logged value
///     mode: max                             # default: min for a metric named *loss, else max
///     average_last: 4                       # rank by the mean of the last 4 logged values (default 1)
struct SweepSpec {
  /// One value of a grid axis: the settings it makes (one for a scalar, several for a mapping).
  using GridValue = std::vector<Override>;
  std::vector<std::pair<std::string, std::vector<GridValue>>> grid;
  std::vector<RandomKey> random;
  int64_t samples = 0;
  uint64_t sample_seed = 0;
  std::vector<std::string> seeds;  ///< empty: every trial keeps the experiment's seed
  std::string metric = "eval/accuracy";
  bool maximize = true;
  int64_t average_last = 1;

  /// The sweep: section of an experiment (YAML text; `source` names it in errors). An experiment
  /// without one gives an empty spec.
  static SweepSpec from_yaml(const std::string& text, const std::string& source);
  static SweepSpec from_file(const std::string& path);

  /// No grid, no random keys, no seeds: nothing to sweep.
  bool empty() const { return grid.empty() && random.empty() && seeds.empty(); }
  /// "--grid key=v1,v2": adds a grid axis, replacing one over the same key.
  void add_grid(const std::string& assignment);
  /// Sets the metric; the mode follows its name unless `mode` is "max" or "min".
  void set_metric(const std::string& metric, const std::string& mode = "");
};

/// One run of a sweep.
struct Trial {
  std::string name;  ///< "trial-0001": its run log is <sweep dir>/<name>.h5
  std::vector<Override> overrides;

  /// "algorithm.client_lr=0.1 seed=1"
  std::string label() const;
  /// The label without the seed: trials with the same setting are repeats over seeds.
  std::string setting() const;
};

/// The trials of a sweep, in a fixed order: grid points, then random samples, then seeds.
std::vector<Trial> expand(const SweepSpec& spec);

/// The order a sweep runs expand(spec)'s trials (`trials` of them) in: every setting's first seed,
/// then every setting's second, ...; so a sweep stopped part-way has covered as many settings as
/// it could.
std::vector<size_t> launch_order(const SweepSpec& spec, size_t trials);

/// What the sweep index records of a trial.
struct TrialRecord {
  std::string name;
  std::vector<Override> overrides;
  std::string status = "pending";  ///< pending, running, done, failed
  double seconds = 0;              ///< wall time of the run (all attempts)
  std::string message;             ///< failed: the trial's error line
  /// Each metric's mean over its last `average_last` logged (non-NaN) values.
  std::vector<std::pair<std::string, double>> final;

  Trial trial() const { return {name, overrides}; }
  /// The final value of `metric`, NaN when the trial is not done or never logged it.
  double value(const std::string& metric) const;
};

/// The sweep index, <sweep dir>/sweep.h5 (HDF5):
///   /sweep/experiment          the experiment file's text (string)
///   /sweep/base                the --set overrides applied to every trial, one per line
///   /sweep/metric, /sweep/mode the ranking metric and "max" or "min"
///   /sweep/average_last        int64: the final values are means of this many last logged values
///   /trials/name               strings [T]
///   /trials/overrides          strings [T]: the trial's overrides, one "key=value" per line
///   /trials/status             strings [T]: pending, running, done, failed
///   /trials/message            strings [T]: a failed trial's error
///   /trials/seconds            float64 [T]
///   /trials/final/<metric>     float64 [T]: mean of the last average_last logged values; NaN where
///                              not done or not logged
/// Written whole into a temporary file renamed over the old one, like the run log.
struct SweepIndex {
  std::string experiment;
  std::vector<std::string> base;
  std::string metric;
  bool maximize = true;
  int64_t average_last = 1;
  std::vector<TrialRecord> trials;

  void write(const std::string& path) const;
  static SweepIndex read(const std::string& path);
  /// Whether the HDF5 file at `path` is a sweep index (not a run log).
  static bool is_index(const std::string& path);
};

/// Trials with the same setting (overrides but the seed), summarised over their finished seeds.
struct SettingSummary {
  std::string setting;
  std::vector<size_t> trials;  ///< indices into the index's trials, done ones only
  double mean = 0;
  double std = 0;  ///< sample standard deviation (n - 1); 0 for one trial
};

/// Settings with at least one finished trial that logged the metric, best mean first.
std::vector<SettingSummary> summarize(const SweepIndex& index);
/// The mean of the last `count` finite values of `values` (NaN when none is finite).
double mean_of_last(const std::vector<double>& values, int64_t count);
/// The index of the best finished trial by the index's metric, or -1 when none finished.
int64_t best_trial(const SweepIndex& index);

/// The sweep's results as a Markdown table: a row per value of the overrides under `rows` (a key,
/// or a prefix such as "data" for every data.* key), a column per value of those under `cols`; a
/// cell holds the mean +- sample std over seeds of the index's metric (times `scale`; the value
/// alone for one trial), and "(n=k)"
/// when it has fewer seeds than the fullest cell. A cell whose trials differ in other keys (FedProx's
/// mu) shows its best setting, tuned as the index's mode says, and names it. "-" for no result.
/// With `minutes`, a cell holds the wall time of that setting's trials instead, in minutes (mean +-
/// std over seeds, attempts cut off included; `scale` is ignored).
std::string sweep_table(const SweepIndex& index, const std::string& rows, const std::string& cols, double scale,
                        bool minutes = false);
/// "8.2 s", "1 min 44 s", "3 h 20 min".
std::string format_duration(double seconds);
/// The mean and sample standard deviation (n - 1; 0 for one value) of `values`, not empty.
std::pair<double, double> mean_and_std(const std::vector<double>& values);

/// The index with only the trials whose overrides include every `key=value` of `where`.
SweepIndex select_trials(const SweepIndex& index, const std::vector<std::string>& where);

/// Run logs as a Markdown table: a row per log (its file name without .h5), its last round, a
/// column per entry of `columns`, and the time its rounds took. A column is a metric's last finite
/// value ("eval/accuracy"), its value at a round ("eval/accuracy@75"), or the mean of its last k
/// finite values ("eval/accuracy@last4"); a trailing "%" shows it times 100 as a percentage.
/// "-" where a log has no such value.
std::string runs_table(const std::vector<std::string>& logs, const std::vector<std::string>& columns);

}  // namespace fax
