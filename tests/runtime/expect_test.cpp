#include <unistd.h>

#include <cmath>
#include <filesystem>

#include <fax/base/error.h>
#include <fax/io/config_yaml.h>
#include <fax/io/run_log.h>
#include <fax/tools/expect.h>

#include "helpers.h"

namespace fax {
namespace {

namespace fs = std::filesystem;

constexpr const char* kExperiment = R"(rounds: 3
expect:
  recorded_on: fax 0.1.0, LibTorch 1.13.0, host vm (2026-12-04)
  metrics:
    - {metric: eval/accuracy, value: 0.5, tolerance: 0.01}
    - {metric: train/loss, round: 2, value: 1.4, tolerance: 0.2}
)";

TEST(ExpectSpecTest, ReadsTheSectionAndLeavesTheSettingsAlone) {
  const ExpectSpec spec = ExpectSpec::from_yaml(kExperiment, "exp.yaml");
  EXPECT_EQ(spec.recorded_on, "fax 0.1.0, LibTorch 1.13.0, host vm (2026-12-04)");
  ASSERT_EQ(spec.metrics.size(), 2u);
  EXPECT_EQ(spec.metrics[0].metric, "eval/accuracy");
  EXPECT_EQ(spec.metrics[0].round, 0);
  EXPECT_EQ(spec.metrics[1].round, 2);
  EXPECT_DOUBLE_EQ(spec.metrics[1].tolerance, 0.2);
  // The section is not a setting: the experiment's keys are only "rounds".
  EXPECT_EQ(parse_config(kExperiment, "exp.yaml").settings().size(), 1u);
  EXPECT_TRUE(ExpectSpec::from_yaml("rounds: 3\n", "exp.yaml").empty());
}

TEST(ExpectSpecTest, AMalformedSectionNamesFileLineAndField) {
  const auto error = [](const std::string& section) {
    return test::error_of([&] { ExpectSpec::from_yaml("rounds: 1\nexpect:\n" + section, "exp.yaml"); });
  };
  EXPECT_EQ(error("  metrics: [{metric: a, value: 1, tolerance: 0}]\n"),
            "exp.yaml:3:3: expect: needs metrics and recorded_on (the host and LibTorch they come from)");
  EXPECT_EQ(error("  recorded_on: x\n  metrics: [{metric: a, value: high, tolerance: 0}]\n"),
            "exp.yaml:4:32: expect value: expected a number, got 'high'");
  EXPECT_EQ(error("  recorded_on: x\n  metrics: [{metric: a, value: 1, tolerance: -1}]\n"),
            "exp.yaml:4:46: expect tolerance must not be negative");
  EXPECT_EQ(error("  recorded_on: x\n  metrics: [{metric: a, value: 1}]\n"),
            "exp.yaml:4:13: expect metrics: each entry needs metric, value and tolerance");
  EXPECT_EQ(error("  recorded_on: x\n  metrics: [{metric: a, value: 1, tolerance: 0, step: 3}]\n"),
            "exp.yaml:4:49: expect metrics: unknown key 'step' (metric, value, tolerance, round)");
  EXPECT_EQ(error("  recorded_on: x\n  metrics: [{metric: a, value: 1, tolerance: 0, round: 0}]\n"),
            "exp.yaml:4:56: expect round must be an integer in [1, 2147483647], got '0'");
  EXPECT_EQ(error("  recorded: x\n"), "exp.yaml:3:3: expect: unknown key 'recorded' (recorded_on, metrics)");
}

TEST(ExpectSpecTest, ChecksTheLastLoggedValueOrTheNamedRound) {
  const fs::path path = fs::temp_directory_path() / ("fax_expect_test_" + std::to_string(::getpid()) + ".h5");
  {
    RunLog log(path.string(), "", {});
    log.append(1, {{"train/loss", 2.0}});
    log.append(2, {{"train/loss", 1.5}, {"eval/accuracy", 0.505}});
    log.append(3, {{"train/loss", 1.0}});  // accuracy not evaluated: its last value is round 2's
  }
  const RunLogReader log(path.string());
  ExpectSpec spec = ExpectSpec::from_yaml(kExperiment, "exp.yaml");
  spec.metrics.push_back({"eval/loss", 0, 1.0, 0.1});
  spec.metrics.push_back({"train/loss", 3, 1.2, 0.1});
  spec.metrics.push_back({"eval/accuracy", 3, 0.5, 0.1});
  const std::vector<CheckResult> results = check_expectations(spec, log);
  ASSERT_EQ(results.size(), 5u);
  EXPECT_TRUE(results[0].ok) << results[0].text;
  EXPECT_EQ(results[0].text, "eval/accuracy at round 2: 0.505, expected 0.5 +- 0.01");
  EXPECT_TRUE(results[1].ok) << results[1].text;
  EXPECT_DOUBLE_EQ(results[1].got, 1.5);
  EXPECT_FALSE(results[2].ok);
  EXPECT_EQ(results[2].text, "eval/loss: not in the run log");
  EXPECT_FALSE(results[3].ok);
  EXPECT_EQ(results[3].text, "train/loss at round 3: 1, expected 1.2 +- 0.1");
  EXPECT_FALSE(results[4].ok);
  EXPECT_EQ(results[4].text, "eval/accuracy at round 3: not logged");
  // What `fax-run expect` prints reads back as the expectations it came from.
  const std::string section = expect_section(log, {"eval/accuracy", "train/loss"}, 0.01, "here");
  const ExpectSpec back = ExpectSpec::from_yaml(section, "printed");
  ASSERT_EQ(back.metrics.size(), 2u);
  EXPECT_EQ(back.recorded_on, "here");
  EXPECT_DOUBLE_EQ(back.metrics[0].value, 0.505);
  EXPECT_DOUBLE_EQ(back.metrics[1].value, 1.0);
  for (const CheckResult& r : check_expectations(back, log)) EXPECT_TRUE(r.ok) << r.text;
  EXPECT_EQ(test::error_of([&] { expect_section(log, {"eval/loss"}, 0.01, "here"); }),
            path.string() + ": eval/loss: not in the run log");
  fs::remove(path);
}

}  // namespace
}  // namespace fax
