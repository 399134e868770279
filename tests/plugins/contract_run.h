#pragma once

// What the plugin contract suites share: a small federated problem, runs of an algorithm and a
// model on it through the experiment driver, and the checks of bit-identity over executor counts
// and over a resume from a checkpoint file.

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <fax/datasets/in_memory.h>
#include <fax/io/config_yaml.h>
#include <fax/io/run_log.h>
#include <fax/runtime/experiment.h>
#include <fax/runtime/plugin_loader.h>

#include "../core/helpers.h"

namespace fax::test {

// 6 clients of examples shaped `shape`, 3 classes.
inline std::unique_ptr<InMemoryDataset> small_data(std::vector<int64_t> shape) {
  at::manual_seed(0);
  const auto examples = [&](int64_t n) {
    std::vector<int64_t> sizes{n};
    sizes.insert(sizes.end(), shape.begin(), shape.end());
    return Examples{at::randn(sizes), at::randint(0, 3, {n}, at::kLong)};
  };
  std::vector<Examples> clients;
  for (int64_t n : {5, 3, 8, 4, 6, 2}) clients.push_back(examples(n));
  return std::make_unique<InMemoryDataset>(clients, examples(10), 3);
}

inline void expect_same_bits(const TensorTree& a, const TensorTree& b) {
  ASSERT_EQ(a.names(), b.names());
  for (const auto& [name, t] : a) {
    EXPECT_TRUE(test::bytes_of(t) == test::bytes_of(b.at(name))) << name;
  }
}

// A run of an algorithm and a model on a small problem: 6 clients, 4 per round over 2 logical shards.
class ContractRun {
 public:
  // With `poisson`, each client joins a round with probability 1/3 (2 of 6 on average) and the
  // cohort is cut into 4 logical shards: rounds of every size, shards left empty.
  Config config(int executors, int rounds, bool poisson = false) const {
    Config c = parse_config(fmt::format("rounds: {}\nseed: {}\ncohort:\n  size: {}\n  sampling: {}\n  concurrency: {}\n"
                                        "execution:\n  executors: {}\n  logical_shards: {}\nlogging:\n  eval_every: 1\n"
                                        "  checkpoint_every: 1\n{}",
                                        rounds, poisson ? kPoissonSeed : 0, poisson ? 2 : 4,
                                        poisson ? "poisson" : "uniform", concurrency, executors, poisson ? 4 : 2,
                                        extra_yaml),
                            "contract.yaml");
    Schema schema = experiment_schema();
    schema.add_all(plugin->keys, "algorithm");
    for (ConfigKey& key : aggregation_keys(c.raw("aggregation.stages", ""), "contract.yaml")) schema.add(std::move(key));
    c.resolve(schema);
    return c;
  }

  // The final state of `rounds` rounds (resumed from `resume` when given), logged to `log`.
  RunResult run(int executors, int rounds, RunLog* log = nullptr, const ResumePoint* resume = nullptr,
                bool poisson = false) const {
    const Config c = config(executors, rounds, poisson);
    auto algorithm = plugin->create();
    Experiment experiment(c, *algorithm, *model, *data);
    return experiment.run(log, {}, resume);
  }

  // Two rounds on 1 and 2 executors: trained, finite and with the same bits.
  void expect_same_bits_on_one_and_two_executors() const {
    const RunResult one = run(1, 2);
    const RunResult two = run(2, 2);
    EXPECT_EQ(one.rounds_done, 2);
    // The rounds trained: the parameters moved from where init() put them.
    const Config c = config(1, 2);
    auto algorithm = plugin->create();
    const ServerState initial = Experiment(c, *algorithm, *model, *data).init();
    bool moved = false;
    for (const auto& [name, t] : one.state.params) moved = moved || !at::equal(t, initial.params.at(name));
    EXPECT_TRUE(moved);
    expect_same_bits(one.state.params, two.state.params);
    expect_same_bits(one.state.extra, two.state.extra);
    for (const auto& [name, t] : one.state.params) EXPECT_TRUE(at::isfinite(t).all().item<bool>()) << name;
    ASSERT_EQ(one.last.size(), two.last.size());
    for (size_t i = 0; i < one.last.size(); ++i) {
      if (one.last[i].first == "time/round_s") continue;
      EXPECT_EQ(one.last[i].first, two.last[i].first);
      EXPECT_EQ(std::memcmp(&one.last[i].second, &two.last[i].second, sizeof(double)), 0) << one.last[i].first;
    }
  }

  // A run resumed from round 1's checkpoint file has the bits of one that never stopped.
  void expect_resume_with_the_bits_of_an_uninterrupted_run(const std::string& name) const {
    const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / ("contract-" + name);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "run.h5").string();
    {
      RunLog log(path, config_to_yaml(config(2, 1)), {});
      run(2, 1, &log);
    }
    const RunLogReader reader(path);
    ASSERT_EQ(reader.checkpoint_rounds(), std::vector<int64_t>{1});
    const ResumePoint point = resume_point(1, reader.checkpoint(1));
    EXPECT_EQ(point.round, 1);
    const RunResult resumed = run(2, 3, nullptr, &point);
    const RunResult straight = run(2, 3);
    EXPECT_EQ(resumed.rounds_done, 3);
    // Rounds 2 and 3 ran after the resume: the state is not round 1's.
    bool moved = false;
    for (const auto& [leaf, t] : resumed.state.params) moved = moved || !at::equal(t, point.state.params.at(leaf));
    EXPECT_TRUE(moved);
    expect_same_bits(resumed.state.params, straight.state.params);
    expect_same_bits(resumed.state.extra, straight.state.extra);
    std::filesystem::remove_all(dir);
  }

  // Poisson sampling: this seed's rounds draw cohorts of 0 and of 1 to 3 clients (the test checks
  // it). Every executor count gives the same bits, and a round without clients leaves the state
  // as it was, unless it releases DP noise.
  void expect_poisson_rounds_of_any_size_with_the_same_bits(const std::string& name) const {
    const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / ("poisson-" + name);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "run.h5").string();
    constexpr int kRounds = 8;
    RunResult one;
    {
      RunLog log(path, config_to_yaml(config(1, kRounds, true)), {});
      one = run(1, kRounds, &log, nullptr, true);
    }
    const std::vector<double> sizes = RunLogReader(path).metric("cohort/size");
    ASSERT_EQ(sizes.size(), static_cast<size_t>(kRounds));
    const auto empty = std::find(sizes.begin(), sizes.end(), 0.0);
    ASSERT_NE(empty, sizes.end()) << "no empty round: pick another kPoissonSeed";
    ASSERT_TRUE(std::any_of(sizes.begin(), sizes.end(), [](double n) { return n > 0 && n < 4; }));
    for (int executors : {2, 4}) {
      const RunResult other = run(executors, kRounds, nullptr, nullptr, true);
      expect_same_bits(one.state.params, other.state.params);
      expect_same_bits(one.state.extra, other.state.extra);
    }
    // The state before and after the first empty round.
    const Config c = config(1, kRounds, true);
    auto algorithm = plugin->create();
    const bool noised = algorithm->adds_noise() || Aggregation(c, data->num_clients(), 0).adds_noise();
    if (plugin->name == "dp_fedavg") {
      EXPECT_TRUE(noised) << "dp_fedavg adds noise (through the plugin's guard too)";
    }
    const int before = static_cast<int>(empty - sizes.begin());
    const ServerState start =
        before == 0 ? Experiment(c, *algorithm, *model, *data).init() : run(1, before, nullptr, nullptr, true).state;
    const ServerState after = run(1, before + 1, nullptr, nullptr, true).state;
    bool same = true;
    for (const auto& [leaf, t] : start.params) same = same && test::bytes_of(t) == test::bytes_of(after.params.at(leaf));
    EXPECT_EQ(same, !noised) << (noised ? "a private round without clients released no noise"
                                        : "a round without clients moved the parameters");
    std::filesystem::remove_all(dir);
  }

  static constexpr int kPoissonSeed = 8;
  std::shared_ptr<const Plugin> plugin;
  std::unique_ptr<Model> model;
  std::unique_ptr<InMemoryDataset> data;
  std::string extra_yaml;  ///< appended to the experiment (e.g. an algorithm: section)
  int64_t concurrency = 0;  ///< cohort.concurrency (asynchronous algorithms)
};


}  // namespace fax::test
