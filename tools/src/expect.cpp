#include <fax/tools/expect.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <yaml-cpp/yaml.h>

#include <fax/base/error.h>
#include <fax/io/config_yaml.h>
#include <fax/io/run_log.h>
#include <fax/io/yaml.h>

#include "yaml_fields.h"

namespace fax {
namespace {

using detail::where;

Expectation parse_expectation(const YAML::Node& node, const std::string& source) {
  FAX_CHECK(node.IsMap(), "{}: expect metrics: each entry is a mapping {{metric, value, tolerance[, round]}}",
            where(source, node));
  Expectation e;
  bool has_value = false, has_tolerance = false;
  for (const auto& item : node) {
    const std::string key = item.first.Scalar();
    const YAML::Node& v = item.second;
    if (key == "metric") {
      FAX_CHECK(v.IsScalar() && !v.Scalar().empty(), "{}: expect metric is a metric name, e.g. eval/accuracy",
                where(source, v));
      e.metric = v.Scalar();
    } else if (key == "value") {
      e.value = detail::number(v, source, "expect value");
      has_value = true;
    } else if (key == "tolerance") {
      e.tolerance = detail::number(v, source, "expect tolerance");
      FAX_CHECK(e.tolerance >= 0, "{}: expect tolerance must not be negative", where(source, v));
      has_tolerance = true;
    } else if (key == "round") {
      e.round = detail::integer(v, source, "expect round", 1, std::numeric_limits<int32_t>::max());
    } else {
      FAX_CHECK(false, "{}: expect metrics: unknown key '{}' (metric, value, tolerance, round)",
                where(source, item.first), key);
    }
  }
  FAX_CHECK(!e.metric.empty() && has_value && has_tolerance, "{}: expect metrics: each entry needs metric, value and tolerance",
            where(source, node));
  return e;
}

}  // namespace

ExpectSpec ExpectSpec::from_yaml(const std::string& text, const std::string& source) {
  const YAML::Node root = load_yaml(text, source);
  ExpectSpec spec;
  if (!root.IsMap() || !root["expect"]) return spec;
  const YAML::Node expect = root["expect"];
  FAX_CHECK(expect.IsMap(), "{}: expect: is a mapping (recorded_on, metrics)", where(source, expect));
  for (const auto& item : expect) {
    const std::string key = item.first.Scalar();
    if (key == "recorded_on") {
      FAX_CHECK(item.second.IsScalar(), "{}: expect recorded_on names the host and LibTorch the numbers come from",
                where(source, item.second));
      spec.recorded_on = item.second.Scalar();
    } else if (key == "metrics") {
      FAX_CHECK(item.second.IsSequence() && item.second.size() > 0,
                "{}: expect metrics is a non-empty list of {{metric, value, tolerance[, round]}}", where(source, item.second));
      for (const auto& entry : item.second) spec.metrics.push_back(parse_expectation(entry, source));
    } else {
      FAX_CHECK(false, "{}: expect: unknown key '{}' (recorded_on, metrics)", where(source, item.first), key);
    }
  }
  FAX_CHECK(!spec.metrics.empty() && !spec.recorded_on.empty(),
            "{}: expect: needs metrics and recorded_on (the host and LibTorch they come from)", where(source, expect));
  return spec;
}

ExpectSpec ExpectSpec::from_file(const std::string& path) { return from_yaml(read_experiment_file(path), path); }

std::vector<CheckResult> check_expectations(const ExpectSpec& spec, const RunLogReader& log) {
  const std::vector<int64_t> rounds = log.rounds();
  const std::vector<std::string> names = log.metric_names();
  std::vector<CheckResult> results;
  for (const Expectation& e : spec.metrics) {
    CheckResult r{e, std::numeric_limits<double>::quiet_NaN(), false, ""};
    std::string at = e.round > 0 ? fmt::format(" at round {}", e.round) : "";
    if (std::find(names.begin(), names.end(), e.metric) == names.end()) {
      r.text = fmt::format("{}: not in the run log", e.metric);
    } else {
      const std::vector<double> values = log.metric(e.metric);
      for (size_t i = 0; i < values.size() && i < rounds.size(); ++i) {
        if (std::isnan(values[i])) continue;  // not logged that round (evaluations are every K rounds)
        if (e.round == 0 || rounds[i] == e.round) {
          r.got = values[i];
          if (e.round == 0) at = fmt::format(" at round {}", rounds[i]);
        }
      }
      r.ok = !std::isnan(r.got) && std::abs(r.got - e.value) <= e.tolerance;
      r.text = std::isnan(r.got)
                   ? fmt::format("{}{}: not logged", e.metric, at)
                   : fmt::format("{}{}: {:.6g}, expected {:.6g} +- {:.6g}", e.metric, at, r.got, e.value, e.tolerance);
    }
    results.push_back(std::move(r));
  }
  return results;
}

std::string expect_section(const RunLogReader& log, const std::vector<std::string>& metrics, double tolerance,
                           const std::string& recorded_on) {
  std::string out = fmt::format("expect:\n  recorded_on: \"{}\"\n  metrics:\n", recorded_on);
  ExpectSpec all;
  for (const std::string& m : metrics) all.metrics.push_back({m, 0, 0, 0});
  for (const CheckResult& r : check_expectations(all, log)) {
    FAX_CHECK(!std::isnan(r.got), "{}: {}", log.path(), r.text);
    out += fmt::format("    - {{metric: {}, value: {:.6g}, tolerance: {:.6g}}}\n", r.expected.metric, r.got, tolerance);
  }
  return out;
}

}  // namespace fax
