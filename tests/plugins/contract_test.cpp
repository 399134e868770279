// The contract every plugin keeps, checked for each fax_*.so in the build's plugin folder (a new
// plugin gets these cases without editing a list): its keys are documented and their defaults
// valid; rounds run through the experiment driver with the same bits on 1 and 2 executors; and a
// run resumed from a checkpoint file has the bits of one that never stopped. An algorithm plugin
// runs with softmax regression; a model plugin runs under fedavg, on 8x8 one-channel images (the
// shape a template model must accept), and its batched forward equals each client's own.

#include <unistd.h>

#include <filesystem>
#include <fstream>

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
    // An asynchronous algorithm runs on the simulated clock: 5 of the 6 clients in flight, speeds
    // spread enough that steps use stale updates.
    if (plugin->create()->asynchronous()) {
      concurrency = 5;
      extra_yaml = "clients: {speed: {distribution: lognormal, sigma: 1}}\n";
    }
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

// FedAvg through an aggregation pipeline: every stage keeps the contract, error feedback's
// per-client residuals included (4 of 6 clients a round: rounds 2 and 3 meet clients of round 1).
class AggregationContract : public ContractRun, public ::testing::TestWithParam<std::pair<const char*, const char*>> {
 protected:
  void SetUp() override {
    plugin = load_plugin_file(fs::path(FAX_TEST_PLUGIN_DIR) / "fax_fedavg.so");
    model = std::make_unique<SoftmaxRegression>(4, 3);
    data = small_data({4});
    extra_yaml = GetParam().second;
  }
};
INSTANTIATE_TEST_SUITE_P(
    Pipelines, AggregationContract,
    ::testing::Values(
        std::make_pair("top_k_error_feedback", "aggregation: [{top_k: {fraction: 0.2, error_feedback: true}}]\n"),
        std::make_pair("random_k_error_feedback", "aggregation: [{random_k: {fraction: 0.3, error_feedback: true}}]\n"),
        std::make_pair("quantize_error_feedback",
                       "aggregation: [{clip: {norm: 0.5}}, {quantize: {bits: 3, error_feedback: true}}]\n"),
        std::make_pair("clip_gaussian", "aggregation: [{clip: {norm: 0.1}}, {gaussian: {noise_multiplier: 0.5}}]\n"),
        std::make_pair("adaptive_clip_gaussian",
                       "aggregation: [{clip: {norm: 0.1, adaptive: true, count_noise: 0.5}}, "
                       "{gaussian: {noise_multiplier: 0.5}}]\n"),
        std::make_pair("secure_sum_masked_dp",
                       "aggregation: [{clip: {norm: 0.5}}, {secure_sum: {bits: 20, range: 2, masks: true, neighbors: 2}}, "
                       "{gaussian: {noise_multiplier: 0.3}}]\n"),
        std::make_pair("krum_byzantine",
                       "aggregation: [{krum: {byzantine: 0}}]\nclients: {byzantine: {fraction: 0.2, kind: random}}\n")),
    [](const auto& info) { return std::string(info.param.first); });

TEST_P(AggregationContract, RoundsHaveTheSameBitsOnOneAndTwoExecutors) { expect_same_bits_on_one_and_two_executors(); }

TEST_P(AggregationContract, ACheckpointResumesWithTheBitsOfAnUninterruptedRun) {
  expect_resume_with_the_bits_of_an_uninterrupted_run(std::string("aggregation-") + GetParam().first);
}

TEST_P(AggregationContract, PoissonCohortsOfAnySizeHaveTheSameBitsOnOneTwoAndFourExecutors) {
  if (std::string(GetParam().first) != "krum_byzantine") {
    expect_poisson_rounds_of_any_size_with_the_same_bits(std::string("aggregation-") + GetParam().first);
    return;
  }
  // Krum needs more than 2 f + 2 updates in every round, which Poisson sampling cannot promise:
  // refused before the first round.
  try {
    run(1, 8, nullptr, nullptr, true);
    FAIL() << "expected fax::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("krum scores a fixed number of updates"), std::string::npos) << e.what();
  }
}

// A data set plugin: documented keys, valid defaults; what it loads depends on its files.
class DatasetContract : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Found, DatasetContract, ::testing::ValuesIn(plugins_found(kDatasetPlugin)), plugin_file_name);

TEST_P(DatasetContract, KeysAreDocumentedAndTheirDefaultsValid) {
  const auto plugin = load_dataset_plugin_file(GetParam());
  EXPECT_FALSE(plugin->description.empty());
  EXPECT_EQ(fs::path(GetParam()).stem().string(), "fax_" + plugin->name);
  expect_documented_keys(plugin->keys, "data");
}

// The template data set through the loader's wall: its data as written (pooled), its own errors
// prefixed with the plugin's name, and a std::exception from one of its calls turned into a fax::Error
// naming the plugin and the call.
TEST(DatasetPlugin, TemplateLoadsThroughTheGuard) {
  const auto plugin = load_dataset_plugin_file((fs::path(FAX_TEST_PLUGIN_DIR) / "fax_example_dataset.so").string());
  const fs::path csv = fs::temp_directory_path() / ("fax_dataset_plugin_" + std::to_string(::getpid()) + ".csv");
  // With a byte order mark and Windows line ends.
  std::ofstream(csv, std::ios::binary) << "\xEF\xBB\xBF# client,label,x,y\r\nb,1,0.5,2\r\na,0,1,-1\r\nb,2,3,4\r\nb,0,1,1\r\na,1,0,0\r\n";
  Schema schema;
  schema.add_all(plugin->keys, "data");
  Config config = parse_config("data: {path: " + csv.string() + ", test_fraction: 0.5}", "test");
  config.resolve(schema);
  const auto data = plugin->create(config);
  std::ofstream(csv, std::ios::binary | std::ios::app) << "a,1,2,\n";
  EXPECT_EQ(test::error_of([&] { plugin->create(config); }),
            "dataset plugin 'example_dataset' (" + plugin->path + "): " + csv.string() + ":7: '' is not a finite number");
  fs::remove(csv);
  ASSERT_EQ(data->num_clients(), 2);
  EXPECT_EQ(data->client_name(0), "b");
  EXPECT_EQ(data->num_classes(), 3);
  EXPECT_EQ(data->input_shape(), (std::vector<int64_t>{2}));
  // b keeps its first 2 of 3 rows (floor(1.5) = 1 held out), a its first 1 of 2.
  EXPECT_TRUE(at::equal(data->client(0).x, at::tensor({0.5f, 2.f, 3.f, 4.f}).view({2, 2})));
  EXPECT_TRUE(at::equal(data->test().y, at::tensor({0, 1}, at::kLong)));
  // Its training rows in one pool, through the wall: b's two, then a's one; each client its rows.
  const Examples* pool = data->pool();
  ASSERT_NE(pool, nullptr);
  EXPECT_TRUE(at::equal(pool->y, at::tensor({1, 2, 0}, at::kLong)));
  EXPECT_TRUE(at::equal(data->client_rows(0), at::tensor({0, 1}, at::kLong)));
  EXPECT_TRUE(at::equal(data->client_rows(1), at::tensor({2}, at::kLong)));
  for (int64_t c = 0; c < 2; ++c) {
    EXPECT_TRUE(at::equal(data->client(c).x, pool->x.index_select(0, data->client_rows(c)))) << c;
    EXPECT_TRUE(at::equal(data->client(c).y, pool->y.index_select(0, data->client_rows(c)))) << c;
  }
  const std::string who = "dataset plugin 'example_dataset' (" + plugin->path + ")";
  EXPECT_EQ(test::error_of([&] { data->client(7); }).rfind(who + " failed in client(): ", 0), 0u)
      << test::error_of([&] { data->client(7); });
  EXPECT_EQ(test::error_of([&] { data->client_rows(-1); }).rfind(who + " failed in client_rows(): ", 0), 0u)
      << test::error_of([&] { data->client_rows(-1); });
  EXPECT_EQ(test::error_of([&] { plugin->create(config); }),
            who + ": data.path: " + csv.string() + ": no such file");
  EXPECT_EQ(test::error_of([&] { load_model_plugin_file(plugin->path); }),
            "plugin " + plugin->path + " holds a dataset, not a model: name it in data.name");
}

TEST(PluginContracts, FindPlugins) {
  EXPECT_GE(plugins_found(kAlgorithmPlugin).size(), 8u) << FAX_TEST_PLUGIN_DIR;
  EXPECT_GE(plugins_found(kModelPlugin).size(), 1u) << FAX_TEST_PLUGIN_DIR;
  EXPECT_GE(plugins_found(kDatasetPlugin).size(), 1u) << FAX_TEST_PLUGIN_DIR;
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

TEST_P(PluginContract, PoissonCohortsOfAnySizeHaveTheSameBitsOnOneTwoAndFourExecutors) {
  if (concurrency > 0) {
    // Asynchronous training dispatches clients one at a time: there is no round to draw.
    EXPECT_NE(test::error_of([&] { run(1, 1, nullptr, nullptr, true); }).find("cohort.sampling poisson draws whole rounds"),
              std::string::npos);
    return;
  }
  expect_poisson_rounds_of_any_size_with_the_same_bits(plugin->name);
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
