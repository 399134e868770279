#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fax {

class RunLogReader;

/// One expected result: the metric's value at `round` (0: its last logged value), within `tolerance`.
struct Expectation {
  std::string metric;
  int64_t round = 0;
  double value = 0;
  double tolerance = 0;
};

/// The expect: section of an experiment: the results a run of it as written gives, and where they
/// were recorded (host, LibTorch, date), so that a run can check itself (`fax-run run --check`):
///
///   expect:
///     recorded_on: fax 0.1.0, LibTorch 2.1.2, Debian 12 x86_64, 2 cores (2026-12-04)
///     metrics:
///       - {metric: eval/accuracy, value: 0.8483, tolerance: 0.003}
///       - {metric: eval/accuracy, round: 75, value: 0.803, tolerance: 0.01}
struct ExpectSpec {
  std::string recorded_on;
  std::vector<Expectation> metrics;

  /// The expect: section of an experiment (YAML text; `source` names it in errors); an experiment
  /// without one gives an empty spec.
  static ExpectSpec from_yaml(const std::string& text, const std::string& source);
  static ExpectSpec from_file(const std::string& path);
  bool empty() const { return metrics.empty(); }
};

/// What a run log gave for one expectation.
struct CheckResult {
  Expectation expected;
  double got = 0;    ///< NaN when the log has no such value
  bool ok = false;
  std::string text;  ///< "eval/accuracy at round 300: 0.8481, expected 0.8483 +- 0.003"
};

/// Compares a run log with the expectations, one result per expectation.
std::vector<CheckResult> check_expectations(const ExpectSpec& spec, const RunLogReader& log);

/// An expect: section for the run log's final values of `metrics`, each within `tolerance`: what
/// `fax-run expect` prints, so expected numbers come from a run, never typed.
std::string expect_section(const RunLogReader& log, const std::vector<std::string>& metrics, double tolerance,
                           const std::string& recorded_on);

}  // namespace fax
