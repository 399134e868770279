// The contract every algorithm plugin keeps, checked for each fax_*.so in the build's plugin
// folder (a new plugin gets these cases without editing a list): its keys are documented and their
// defaults valid; rounds run through the experiment driver with the same bits on 1 and 2
// executors; and a run resumed from a checkpoint file has the bits of one that never stopped.

#include <filesystem>

#include <fax/datasets/in_memory.h>
#include <fax/io/config_yaml.h>
#include <fax/io/run_log.h>
#include <fax/nn/builtin_models.h>
#include <fax/runtime/experiment.h>
#include <fax/runtime/plugin_loader.h>

#include "../core/helpers.h"

namespace fax {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> plugins_found() {
  std::vector<std::string> paths;
  for (const auto& entry : fs::directory_iterator(FAX_TEST_PLUGIN_DIR)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind("fax_", 0) == 0 && entry.path().extension() == ".so") paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

// A run of the plugin on a small problem: 6 clients, 4 per round over 2 logical shards.
class PluginContract : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    plugin = load_plugin_file(GetParam());
    at::manual_seed(0);
    std::vector<Examples> clients;
    for (int64_t n : {5, 3, 8, 4, 6, 2}) clients.push_back({at::randn({n, 4}), at::randint(0, 3, {n}, at::kLong)});
    data = std::make_unique<InMemoryDataset>(clients, Examples{at::randn({10, 4}), at::randint(0, 3, {10}, at::kLong)}, 3);
  }

  Config config(int executors, int rounds) const {
    Config c = parse_config(fmt::format("rounds: {}\ncohort:\n  size: 4\nexecution:\n  executors: {}\n"
                                        "  logical_shards: 2\nlogging:\n  eval_every: 1\n  checkpoint_every: 1\n",
                                        rounds, executors),
                            "contract.yaml");
    Schema schema = experiment_schema();
    schema.add_all(plugin->keys, "algorithm");
    c.resolve(schema);
    return c;
  }

  // The final state of `rounds` rounds (resumed from `resume` when given), logged to `log`.
  RunResult run(int executors, int rounds, RunLog* log = nullptr, const ResumePoint* resume = nullptr) const {
    const Config c = config(executors, rounds);
    auto algorithm = plugin->create();
    Experiment experiment(c, *algorithm, model, *data);
    return experiment.run(log, {}, resume);
  }

  std::shared_ptr<const Plugin> plugin;
  std::unique_ptr<InMemoryDataset> data;
  SoftmaxRegression model{4, 3};
};

void expect_same_bits(const TensorTree& a, const TensorTree& b) {
  ASSERT_EQ(a.names(), b.names());
  for (const auto& [name, t] : a) {
    EXPECT_TRUE(test::bytes_of(t) == test::bytes_of(b.at(name))) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Found, PluginContract, ::testing::ValuesIn(plugins_found()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return fs::path(info.param).stem().string();  // fax_fedavg
                         });

TEST(PluginContracts, FindPlugins) { EXPECT_GE(plugins_found().size(), 8u) << FAX_TEST_PLUGIN_DIR; }

TEST_P(PluginContract, KeysAreDocumentedAndTheirDefaultsValid) {
  EXPECT_FALSE(plugin->description.empty());
  EXPECT_FALSE(plugin->keys.empty());
  EXPECT_EQ(fs::path(GetParam()).stem().string(), "fax_" + plugin->name);
  for (const auto& key : plugin->keys) {
    EXPECT_FALSE(key.doc.empty()) << key.name;
    EXPECT_EQ(key.name.find('.'), std::string::npos) << key.name << ": keys are relative to algorithm.";
  }
  Schema schema;
  schema.add_all(plugin->keys, "algorithm");
  Config defaults;
  EXPECT_NO_THROW(defaults.resolve(schema));
}

TEST_P(PluginContract, RoundsHaveTheSameBitsOnOneAndTwoExecutors) {
  const RunResult one = run(1, 2);
  const RunResult two = run(2, 2);
  EXPECT_EQ(one.rounds_done, 2);
  // The rounds trained: the parameters moved from where init() put them.
  const Config c = config(1, 2);
  auto algorithm = plugin->create();
  const ServerState initial = Experiment(c, *algorithm, model, *data).init();
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

TEST_P(PluginContract, ACheckpointResumesWithTheBitsOfAnUninterruptedRun) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("contract-" + plugin->name);
  fs::remove_all(dir);
  fs::create_directories(dir);
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
  for (const auto& [name, t] : resumed.state.params) moved = moved || !at::equal(t, point.state.params.at(name));
  EXPECT_TRUE(moved);
  expect_same_bits(resumed.state.params, straight.state.params);
  expect_same_bits(resumed.state.extra, straight.state.extra);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fax
