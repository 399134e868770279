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

#include "contract_run.h"

namespace fax {
namespace {

using test::ContractRun;
using test::small_data;

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
  if (model->num_parameters() >= 0) {
    EXPECT_EQ(model->num_parameters(), params[0].numel());
  }
  EXPECT_GT(model->forward_flops(), 0);
}

TEST_P(ModelContract, FedAvgHasTheSameBitsOnOneAndTwoExecutors) { expect_same_bits_on_one_and_two_executors(); }

TEST_P(ModelContract, ACheckpointResumesWithTheBitsOfAnUninterruptedRun) {
  expect_resume_with_the_bits_of_an_uninterrupted_run(model_plugin->name);
}

}  // namespace
}  // namespace fax
