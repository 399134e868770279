// The contract every plugin keeps, checked for each fax_*.so in the build's plugin folder (a new
// plugin gets these cases without editing a list): its keys are documented and their defaults
// valid; rounds run through the experiment driver with the same bits on 1 and 2 executors; and a
// run resumed from a checkpoint file has the bits of one that never stopped. An algorithm plugin
// runs with softmax regression; a model plugin runs under fedavg, on 8x8 one-channel images (the
// shape a template model must accept), and its batched forward equals each client's own.

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

// The plugins of `kind` in the build's plugin folder.
std::vector<std::string> plugins_found(const std::string& kind) {
  std::vector<std::string> paths;
  for (const auto& entry : fs::directory_iterator(FAX_TEST_PLUGIN_DIR)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind("fax_", 0) == 0 && entry.path().extension() == ".so" && plugin_kind(entry.path().string()) == kind)
      paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

// 6 clients of examples shaped `shape`, 3 classes.
std::unique_ptr<InMemoryDataset> small_data(std::vector<int64_t> shape) {
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

void expect_same_bits(const TensorTree& a, const TensorTree& b) {
  ASSERT_EQ(a.names(), b.names());
  for (const auto& [name, t] : a) {
    EXPECT_TRUE(test::bytes_of(t) == test::bytes_of(b.at(name))) << name;
  }
}

// Keys documented, relative to their section, with valid defaults.
void expect_documented_keys(const std::vector<ConfigKey>& keys, const std::string& section) {
  for (const auto& key : keys) {
    EXPECT_FALSE(key.doc.empty()) << key.name;
    EXPECT_EQ(key.name.find('.'), std::string::npos) << key.name << ": keys are relative to " << section << ".";
  }
  Schema schema;
  schema.add_all(keys, section);
  Config defaults;
  EXPECT_NO_THROW(defaults.resolve(schema));
}

// A run of an algorithm and a model on a small problem: 6 clients, 4 per round over 2 logical shards.
class ContractRun {
 protected:
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
    const fs::path dir = fs::path(::testing::TempDir()) / ("contract-" + name);
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
    for (const auto& [leaf, t] : resumed.state.params) moved = moved || !at::equal(t, point.state.params.at(leaf));
    EXPECT_TRUE(moved);
    expect_same_bits(resumed.state.params, straight.state.params);
    expect_same_bits(resumed.state.extra, straight.state.extra);
    fs::remove_all(dir);
  }

  std::shared_ptr<const Plugin> plugin;
  std::unique_ptr<Model> model;
  std::unique_ptr<InMemoryDataset> data;
};

class PluginContract : public ContractRun, public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    plugin = load_plugin_file(GetParam());
    model = std::make_unique<SoftmaxRegression>(4, 3);
    data = small_data({4});
  }

};

// A model plugin under fedavg, made with its default settings for 8x8 images of 3 classes.
class ModelContract : public ContractRun, public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    plugin = load_plugin_file(fs::path(FAX_TEST_PLUGIN_DIR) / "fax_fedavg.so");
    model_plugin = load_model_plugin_file(GetParam());
    Schema schema;
    schema.add_all(model_plugin->keys, "model");
    Config defaults;
    defaults.resolve(schema);
    model = model_plugin->create(defaults, {{1, 8, 8}, 3});
    data = small_data({1, 8, 8});
  }
  std::shared_ptr<const ModelPlugin> model_plugin;
};

const auto plugin_file_name = [](const ::testing::TestParamInfo<std::string>& info) {
  return fs::path(info.param).stem().string();  // fax_fedavg
};
INSTANTIATE_TEST_SUITE_P(Found, PluginContract, ::testing::ValuesIn(plugins_found(kAlgorithmPlugin)), plugin_file_name);
INSTANTIATE_TEST_SUITE_P(Found, ModelContract, ::testing::ValuesIn(plugins_found(kModelPlugin)), plugin_file_name);

TEST(PluginContracts, FindPlugins) {
  EXPECT_GE(plugins_found(kAlgorithmPlugin).size(), 8u) << FAX_TEST_PLUGIN_DIR;
  EXPECT_GE(plugins_found(kModelPlugin).size(), 1u) << FAX_TEST_PLUGIN_DIR;
}

TEST_P(PluginContract, KeysAreDocumentedAndTheirDefaultsValid) {
  EXPECT_FALSE(plugin->description.empty());
  EXPECT_FALSE(plugin->keys.empty());
  EXPECT_EQ(fs::path(GetParam()).stem().string(), "fax_" + plugin->name);
  expect_documented_keys(plugin->keys, "algorithm");
}

TEST_P(PluginContract, RoundsHaveTheSameBitsOnOneAndTwoExecutors) { expect_same_bits_on_one_and_two_executors(); }

TEST_P(PluginContract, ACheckpointResumesWithTheBitsOfAnUninterruptedRun) {
  expect_resume_with_the_bits_of_an_uninterrupted_run(plugin->name);
}

TEST_P(ModelContract, KeysAreDocumentedAndTheirDefaultsValid) {
  EXPECT_FALSE(model_plugin->description.empty());
  EXPECT_EQ(fs::path(GetParam()).stem().string(), "fax_" + model_plugin->name);
  expect_documented_keys(model_plugin->keys, "model");
}

// The forward pass batched over 3 clients equals each client's own, and the sizes it declares for
// the memory estimate are init()'s.
TEST_P(ModelContract, BatchedForwardEqualsEachClientAlone) {
  std::vector<TensorTree> params;
  for (int64_t i = 0; i < 3; ++i) params.push_back(model->init(client_generator(5, 0, i)));
  const at::Tensor x = at::randn({3, 4, 1, 8, 8});
  const at::Tensor batched = model->forward(stack(params), x);
  ASSERT_EQ(batched.sizes(), (at::IntArrayRef{3, 4, 3})) << model->describe();
  for (int64_t i = 0; i < 3; ++i)
    EXPECT_TRUE(at::allclose(batched[i], model->forward(params[i], x[i]), 1e-5, 1e-5)) << "client " << i;
  if (model->num_parameters() >= 0) EXPECT_EQ(model->num_parameters(), params[0].numel());
  EXPECT_GT(model->forward_flops(), 0);
}

TEST_P(ModelContract, FedAvgHasTheSameBitsOnOneAndTwoExecutors) { expect_same_bits_on_one_and_two_executors(); }

TEST_P(ModelContract, ACheckpointResumesWithTheBitsOfAnUninterruptedRun) {
  expect_resume_with_the_bits_of_an_uninterrupted_run(model_plugin->name);
}

}  // namespace
}  // namespace fax
