#include <cmath>
#include <filesystem>
#include <set>

#include <fax/base/config.h>
#include <fax/base/error.h>
#include <fax/io/config_yaml.h>
#include <fax/tools/sweep.h>

#include "helpers.h"

namespace fax {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> labels(const std::vector<Trial>& trials) {
  std::vector<std::string> out;
  for (const auto& t : trials) out.push_back(t.label());
  return out;
}

TEST(SweepSpecTest, GridIsTheCartesianProductFirstKeySlowestThenSeeds) {
  const SweepSpec spec = SweepSpec::from_yaml(R"(
rounds: 3
sweep:
  grid:
    algorithm.client_lr: [0.01, 0.1]
    algorithm.server_lr: [1.0, 0.5, 2]
  seeds: [7, 8]
)", "exp.yaml");
  const std::vector<Trial> trials = expand(spec);
  ASSERT_EQ(trials.size(), 12u);
  EXPECT_EQ(trials[0].name, "trial-0001");
  EXPECT_EQ(trials[11].name, "trial-0012");
  EXPECT_EQ(trials[0].label(), "algorithm.client_lr=0.01 algorithm.server_lr=1.0 seed=7");
  EXPECT_EQ(trials[1].label(), "algorithm.client_lr=0.01 algorithm.server_lr=1.0 seed=8");
  EXPECT_EQ(trials[2].label(), "algorithm.client_lr=0.01 algorithm.server_lr=0.5 seed=7");
  EXPECT_EQ(trials[6].label(), "algorithm.client_lr=0.1 algorithm.server_lr=1.0 seed=7");
  EXPECT_EQ(trials[11].setting(), "algorithm.client_lr=0.1 algorithm.server_lr=2");
  EXPECT_EQ(spec.metric, "eval/accuracy");
  EXPECT_TRUE(spec.maximize);
}

TEST(SweepSpecTest, TrialsRunEverySettingsFirstSeedBeforeAnySecond) {
  const SweepSpec spec = SweepSpec::from_yaml(R"(
sweep:
  grid:
    algorithm.client_lr: [0.01, 0.1, 1]
  seeds: [7, 8]
)", "exp.yaml");
  EXPECT_EQ(launch_order(spec, expand(spec).size()), (std::vector<size_t>{0, 2, 4, 1, 3, 5}));
  const SweepSpec unseeded = SweepSpec::from_yaml("sweep:\n  grid:\n    algorithm.client_lr: [0.01, 0.1]\n", "exp.yaml");
  EXPECT_EQ(launch_order(unseeded, expand(unseeded).size()), (std::vector<size_t>{0, 1}));
}

TEST(SweepSpecTest, AGridValueMayBeAMappingOfSettingsThatGoTogether) {
  const SweepSpec spec = SweepSpec::from_yaml(R"(
sweep:
  grid:
    algorithm:
      - {name: fedavg}
      - {name: fedopt, server_optimizer: yogi, opt: {beta1: 0}}
    algorithm.client_lr: [0.1, 1]
  average_last: 4
)", "exp.yaml");
  EXPECT_EQ(labels(expand(spec)),
            (std::vector<std::string>{
                "algorithm.name=fedavg algorithm.client_lr=0.1", "algorithm.name=fedavg algorithm.client_lr=1",
                "algorithm.name=fedopt algorithm.server_optimizer=yogi algorithm.opt.beta1=0 algorithm.client_lr=0.1",
                "algorithm.name=fedopt algorithm.server_optimizer=yogi algorithm.opt.beta1=0 algorithm.client_lr=1"}));
  EXPECT_EQ(spec.average_last, 4);
}

TEST(SweepSpecTest, MeanOfLastSkipsNaN) {
  EXPECT_DOUBLE_EQ(mean_of_last({1, NAN, 2, NAN, 4, NAN}, 2), 3);
  EXPECT_DOUBLE_EQ(mean_of_last({1, 2, 4}, 1), 4);
  EXPECT_DOUBLE_EQ(mean_of_last({1, 2, 4}, 10), 7.0 / 3);
  EXPECT_TRUE(std::isnan(mean_of_last({NAN}, 3)));
}

TEST(SweepSpecTest, RepeatsCountFromTheExperimentSeed) {
  const SweepSpec spec = SweepSpec::from_yaml("seed: 5\nsweep:\n  repeats: 3\n", "exp.yaml");
  EXPECT_EQ(labels(expand(spec)), (std::vector<std::string>{"seed=5", "seed=6", "seed=7"}));
}

TEST(SweepSpecTest, RandomSamplesAreDeterministicAndInRange) {
  const std::string text = R"(
sweep:
  grid:
    algorithm.name: [fedavg, fedopt]
  random:
    samples: 50
    seed: 3
    algorithm.client_lr: {log_uniform: [0.001, 1]}
    algorithm.server_lr: {uniform: [0.5, 2]}
    algorithm.local_epochs: {int_uniform: [1, 3]}
    algorithm.server_optimizer: {choice: [adam, yogi]}
)";
  const std::vector<Trial> a = expand(SweepSpec::from_yaml(text, "exp.yaml"));
  const std::vector<Trial> b = expand(SweepSpec::from_yaml(text, "exp.yaml"));
  ASSERT_EQ(a.size(), 100u);
  EXPECT_EQ(labels(a), labels(b));
  std::set<std::string> epochs, optimizers;
  int below_001 = 0;
  for (const auto& t : a) {
    ASSERT_EQ(t.overrides.size(), 5u);
    const double client_lr = std::stod(t.overrides[1].second);
    EXPECT_GE(client_lr, 0.001);
    EXPECT_LE(client_lr, 1.0);
    below_001 += client_lr < 0.01;
    const double server_lr = std::stod(t.overrides[2].second);
    EXPECT_GE(server_lr, 0.5);
    EXPECT_LE(server_lr, 2.0);
    epochs.insert(t.overrides[3].second);
    optimizers.insert(t.overrides[4].second);
  }
  // Log-uniform over three decades puts a third of the draws in the lowest one.
  EXPECT_GT(below_001, 15);
  EXPECT_LT(below_001, 55);
  EXPECT_EQ(epochs, (std::set<std::string>{"1", "2", "3"}));
  EXPECT_EQ(optimizers, (std::set<std::string>{"adam", "yogi"}));
  // Another sample seed draws other values.
  std::string other = text;
  other.replace(other.find("seed: 3"), 7, "seed: 4");
  EXPECT_NE(labels(expand(SweepSpec::from_yaml(other, "exp.yaml"))), labels(a));
}

TEST(SweepSpecTest, GridOptionAddsOrReplacesAnAxis) {
  SweepSpec spec = SweepSpec::from_yaml("sweep:\n  grid:\n    a.b: [1, 2]\n", "exp.yaml");
  spec.add_grid("a.b=3,4,5");
  spec.add_grid("c.d=x,y");
  EXPECT_EQ(expand(spec).size(), 6u);
  EXPECT_EQ(expand(spec).front().label(), "a.b=3 c.d=x");
  EXPECT_THROW(spec.add_grid("c.d="), Error);
  EXPECT_THROW(spec.add_grid("novalues"), Error);
  EXPECT_THROW(spec.add_grid("c.d=1,,2"), Error);
}

TEST(SweepSpecTest, MetricModeFollowsTheNameUnlessGiven) {
  SweepSpec spec;
  spec.set_metric("eval/loss");
  EXPECT_FALSE(spec.maximize);
  spec.set_metric("eval/loss", "max");
  EXPECT_TRUE(spec.maximize);
  spec.set_metric("eval/accuracy");
  EXPECT_TRUE(spec.maximize);
  EXPECT_FALSE(SweepSpec::from_yaml("sweep:\n  metric: train/loss\n  seeds: [1]\n", "e.yaml").maximize);
}

TEST(SweepSpecTest, AnExperimentWithoutASweepSectionIsEmpty) {
  EXPECT_TRUE(SweepSpec::from_yaml("rounds: 3\n", "e.yaml").empty());
  EXPECT_EQ(expand(SweepSpec{}).size(), 1u);
}

TEST(SweepSpecTest, MistakesNameTheFileLineAndKey) {
  auto error_of = [](const std::string& text) {
    try {
      SweepSpec::from_yaml(text, "exp.yaml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(error_of("sweep:\n  grid:\n    algorithm.client_lr: 0.1\n"), HasSubstr("exp.yaml:3:26: sweep grid algorithm.client_lr takes a non-empty list"));
  EXPECT_THAT(error_of("sweep:\n  gird:\n    a.b: [1]\n"), HasSubstr("exp.yaml:2:3: unknown sweep key 'gird'"));
  EXPECT_THAT(error_of("sweep:\n  random:\n    samples: 2\n    a.b: {normal: [0, 1]}\n"), HasSubstr("unknown distribution 'normal'"));
  EXPECT_THAT(error_of("sweep:\n  random:\n    samples: 2\n    a.b: {log_uniform: [0, 1]}\n"), HasSubstr("log_uniform needs low > 0"));
  EXPECT_THAT(error_of("sweep:\n  random:\n    samples: 2\n    a.b: {uniform: [2, 1]}\n"), HasSubstr("low 2 is above high 1"));
  EXPECT_THAT(error_of("sweep:\n  random:\n    a.b: {uniform: [0, 1]}\n"), HasSubstr("needs samples: N"));
  EXPECT_THAT(error_of("sweep:\n  mode: biggest\n"), HasSubstr("'biggest' is not max or min"));
  EXPECT_THAT(error_of("sweep:\n  grid:\n    seed: [1, 2]\n  seeds: [3]\n"), HasSubstr("seed is both a grid key"));
  EXPECT_THAT(error_of("sweep:\n  grid:\n    a b: [1, 2]\n"), HasSubstr("'a b' is not a setting a sweep can vary"));
  EXPECT_THAT(error_of("sweep: [1, 2]\n"), HasSubstr("exp.yaml:1:8: sweep: is a mapping"));
  EXPECT_THAT(error_of("sweep:\n  average_last: 0\n"), HasSubstr("exp.yaml:2:17: sweep average_last must be an integer in [1, 1000000], got '0'"));
  EXPECT_THAT(error_of("sweep:\n  random:\n    samples: 1e300\n    a.b: {uniform: [0, 1]}\n"),
              HasSubstr("random samples must be an integer in [1, 1000000]"));
  EXPECT_THAT(error_of("sweep:\n  random:\n    samples: 2\n    seed: -1\n    a.b: {uniform: [0, 1]}\n"),
              HasSubstr("random seed must be an integer in [0, 9007199254740992]"));
  EXPECT_THAT(error_of("sweep:\n  random:\n    samples: 2\n    a.b: {int_uniform: [0, 1e300]}\n"),
              HasSubstr("int_uniform takes integer bounds within +-2^53"));
  EXPECT_THAT(error_of("seed: 9223372036854775807\nsweep:\n  repeats: 2\n"), HasSubstr("overflows"));
  EXPECT_THAT(error_of("sweep:\n  grid:\n    algorithm: [{name: [a, b]}]\n"),
              HasSubstr("sweep grid algorithm.name: each setting takes a single value"));
}

TEST(SweepSpecTest, ConfigSkipsTheSweepSection) {
  Config config = parse_config("rounds: 3\nsweep:\n  grid:\n    rounds: [1, 2]\n", "e.yaml");
  EXPECT_EQ(config.raw("rounds", "?"), "3");
  EXPECT_EQ(config.settings().size(), 1u);
}

TrialRecord record(const std::string& name, std::vector<Override> overrides, const std::string& status, double accuracy) {
  TrialRecord r;
  r.name = name;
  r.overrides = std::move(overrides);
  r.status = status;
  if (!std::isnan(accuracy)) r.final = {{"eval/accuracy", accuracy}, {"train/loss", 1 - accuracy}};
  return r;
}

SweepIndex example_index() {
  SweepIndex index;
  index.experiment = "rounds: 3\n";
  index.base = {"rounds=2", "cohort.size=4"};
  index.metric = "eval/accuracy";
  index.maximize = true;
  index.average_last = 3;
  index.trials = {record("trial-0001", {{"lr", "0.1"}, {"seed", "0"}}, "done", 0.5),
                  record("trial-0002", {{"lr", "0.1"}, {"seed", "1"}}, "done", 0.7),
                  record("trial-0003", {{"lr", "1"}, {"seed", "0"}}, "done", 0.65),
                  record("trial-0004", {{"lr", "1"}, {"seed", "1"}}, "failed", NAN),
                  record("trial-0005", {{"lr", "3"}, {"seed", "0"}}, "pending", NAN)};
  index.trials[3].message = "round 2: non-finite loss";
  return index;
}

TEST(SweepIndexTest, SummaryRanksSettingsByTheirMeanOverSeeds) {
  const SweepIndex index = example_index();
  const auto settings = summarize(index);
  ASSERT_EQ(settings.size(), 2u);
  EXPECT_EQ(settings[0].setting, "lr=1");  // 0.65 from one seed beats 0.6 +- 0.141
  EXPECT_DOUBLE_EQ(settings[0].mean, 0.65);
  EXPECT_DOUBLE_EQ(settings[0].std, 0);
  EXPECT_EQ(settings[1].setting, "lr=0.1");
  EXPECT_DOUBLE_EQ(settings[1].mean, 0.6);
  EXPECT_NEAR(settings[1].std, std::sqrt(0.02), 1e-12);  // (0.1^2 + 0.1^2) / (2 - 1)
  EXPECT_EQ(settings[1].trials, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(best_trial(index), 1);

  SweepIndex by_loss = index;
  by_loss.metric = "train/loss";
  by_loss.maximize = false;
  EXPECT_EQ(best_trial(by_loss), 1);  // loss 0.3
  EXPECT_EQ(summarize(by_loss).front().setting, "lr=1");
  by_loss.metric = "no/such";
  EXPECT_EQ(best_trial(by_loss), -1);
  EXPECT_TRUE(summarize(by_loss).empty());
}

TEST(SweepIndexTest, RoundTripsThroughHdf5) {
  const auto dir = std::filesystem::temp_directory_path() / "fax_sweep_index_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "sweep.h5").string();
  const SweepIndex index = example_index();
  index.write(path);
  EXPECT_TRUE(SweepIndex::is_index(path));
  const SweepIndex back = SweepIndex::read(path);
  EXPECT_EQ(back.experiment, index.experiment);
  EXPECT_EQ(back.base, index.base);
  EXPECT_EQ(back.metric, "eval/accuracy");
  EXPECT_TRUE(back.maximize);
  EXPECT_EQ(back.average_last, 3);
  ASSERT_EQ(back.trials.size(), index.trials.size());
  for (size_t i = 0; i < index.trials.size(); ++i) {
    EXPECT_EQ(back.trials[i].name, index.trials[i].name);
    EXPECT_EQ(back.trials[i].overrides, index.trials[i].overrides);
    EXPECT_EQ(back.trials[i].status, index.trials[i].status);
    EXPECT_EQ(back.trials[i].message, index.trials[i].message);
    EXPECT_EQ(back.trials[i].final, index.trials[i].final);
  }
  std::filesystem::remove_all(dir);
}

// The table of a 2 x (FedAvg, FedProx with two mu) sweep over 2 seeds: rows by the data.* keys,
// columns by algorithm name; FedProx's cell is its better mu (named); a missing seed is counted; an
// unfinished cell is "-", one whose only finished trial failed "failed"; values scaled to percent.
TEST(SweepTableTest, RowsColumnsSeedsAndTunedSettings) {
  SweepIndex index;
  index.metric = "eval/accuracy";
  const auto add = [&](std::vector<Override> o, const std::string& seed, const std::string& status, double acc) {
    o.emplace_back("seed", seed);
    index.trials.push_back(record("trial-" + std::to_string(index.trials.size() + 1), o, status, acc));
    index.trials.back().seconds = 1000 * acc;  // for the table of minutes
  };
  const std::vector<Override> iid{{"data.partition", "iid"}};
  const std::vector<Override> lq{{"data.partition", "label_quantity"}, {"data.labels_per_client", "2"}};
  const auto with = [](std::vector<Override> o, std::vector<Override> more) {
    o.insert(o.end(), more.begin(), more.end());
    return o;
  };
  add(with(iid, {{"algorithm.name", "fedavg"}}), "0", "done", 0.90);
  add(with(iid, {{"algorithm.name", "fedavg"}}), "1", "done", 0.88);
  add(with(iid, {{"algorithm.name", "fedprox"}, {"algorithm.mu", "0.1"}}), "0", "done", 0.80);
  add(with(iid, {{"algorithm.name", "fedprox"}, {"algorithm.mu", "0.1"}}), "1", "done", 0.82);
  add(with(iid, {{"algorithm.name", "fedprox"}, {"algorithm.mu", "0.01"}}), "0", "done", 0.91);
  add(with(iid, {{"algorithm.name", "fedprox"}, {"algorithm.mu", "0.01"}}), "1", "failed", 0);
  add(with(lq, {{"algorithm.name", "fedavg"}}), "0", "done", 0.70);
  add(with(lq, {{"algorithm.name", "fedavg"}}), "1", "done", 0.74);
  add(with(lq, {{"algorithm.name", "fedprox"}, {"algorithm.mu", "0.1"}}), "0", "pending", 0);
  add(with(lq, {{"algorithm.name", "scaffold"}}), "0", "failed", 0);
  add(with(lq, {{"algorithm.name", "scaffold"}}), "1", "pending", 0);
  EXPECT_EQ(sweep_table(index, "data", "algorithm.name", 100),
            "| data | fedavg | fedprox | scaffold |\n"
            "|---|---|---|---|\n"
            "| iid | 89.0 ± 1.4 | 91.0 (n=1) (mu=0.01) | - |\n"
            "| partition=label_quantity, labels_per_client=2 | 72.0 ± 2.8 | - | failed |\n");
  EXPECT_EQ(test::error_of([&] { sweep_table(index, "data", "data", 1); }),
            "a table needs two different keys for rows and columns");
  // The same cells in minutes, of the settings the metric picked: iid FedAvg 900 s and 880 s
  // (15 and 14.67 min: mean 14.83, std 0.24), FedProx mu 0.01's 910 s, label_quantity FedAvg 700 s
  // and 740 s (11.67 and 12.33 min: mean 12.0, std 0.47); the scale does not apply.
  EXPECT_EQ(sweep_table(index, "data", "algorithm.name", 100, true),
            "| data | fedavg | fedprox | scaffold |\n"
            "|---|---|---|---|\n"
            "| iid | 14.8 ± 0.2 | 15.2 (n=1) (mu=0.01) | - |\n"
            "| partition=label_quantity, labels_per_client=2 | 12.0 ± 0.5 | - | failed |\n");
}

TEST(SweepTableTest, Durations) {
  EXPECT_EQ(format_duration(8.24), "8.2 s");
  EXPECT_EQ(format_duration(59.96), "1 min 0 s");  // not "60.0 s"
  EXPECT_EQ(format_duration(104.4), "1 min 44 s");
  EXPECT_EQ(format_duration(3599.4), "59 min 59 s");
  EXPECT_EQ(format_duration(7170), "2 h 0 min");  // rounded to the minute, not "1 h 60 min"
  EXPECT_EQ(format_duration(12000), "3 h 20 min");
}

TEST(SweepTableTest, MeanAndStd) {
  EXPECT_EQ(mean_and_std({2.0}), std::make_pair(2.0, 0.0));
  const auto [mean, spread] = mean_and_std({1.0, 2.0, 6.0});  // mean 3; squares 4 + 1 + 9 = 14, / 2
  EXPECT_DOUBLE_EQ(mean, 3.0);
  EXPECT_DOUBLE_EQ(spread, std::sqrt(7.0));
  EXPECT_EQ(test::error_of([] { mean_and_std({}); }), "the mean of no values");
}

}  // namespace
}  // namespace fax
