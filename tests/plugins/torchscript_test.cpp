// TorchScript models (model.name: torchscript): a copy of the built-in MLP exported by
// experiments/fmnist_torchscript.py from the built-in's initial parameters trains like the
// built-in under FedAvg and through federated AD (FedSGD, hypergradient FedAvg with a learned client
// rate); runs have the same bits on 1 and 2 executors and after a resume; BatchNorm statistics
// are buffers; a module's own loss replaces the cross-entropy; bad files are refused.

#include <cstdlib>

#include <fax/io/hdf5.h>
#include <fax/nn/builtin_models.h>
#include <fax/nn/torchscript.h>

#include "contract_run.h"

namespace fax {
namespace {

namespace fs = std::filesystem;

// Runs the system Python (with python3-torch) on `args`; the test fails when it does not succeed.
void python(const std::string& args) {
  const std::string command = std::string(FAX_SYSTEM_PYTHON) + " " + args;
  ASSERT_EQ(std::system(command.c_str()), 0) << command << " failed (is python3-torch installed?)";
}

class TorchScriptModelTest : public test::ContractRun, public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::path(::testing::TempDir()) / "torchscript";
    fs::create_directories(dir);
    data = test::small_data({12});
  }
  void TearDown() override { fs::remove_all(dir); }

  // The module `kind` of tests/plugins/export_modules.py, loaded.
  std::unique_ptr<Model> exported(const std::string& kind) {
    const std::string path = (dir / (kind + ".pt")).string();
    python(fmt::format("{}/tests/plugins/export_modules.py {} {}", FAX_SOURCE_DIR, kind, path));
    return load_torchscript_model(path, {{12}, 3, at::kFloat});
  }

  // `rounds` rounds of `algorithm` on 1 executor with `m`.
  RunResult run_with(const Model& m, const std::string& algorithm, int rounds) {
    plugin = load_plugin_file((fs::path(FAX_TEST_PLUGIN_DIR) / ("fax_" + algorithm + ".so")).string());
    const Config c = config(1, rounds);
    auto instance = plugin->create();
    Experiment experiment(c, *instance, m, *data);
    return experiment.run(nullptr, {});
  }

  fs::path dir;
};

// The built-in MLP's initial parameters, and a TorchScript copy of it exported from them.
struct MlpPair {
  Mlp builtin{{12}, {16, 16}, 3};
  std::unique_ptr<Model> copy;
};

TEST_F(TorchScriptModelTest, CopyOfTheBuiltInMlpTrainsLikeIt) {
  MlpPair pair;
  // The parameters Experiment starts from (seed 0), written for the exporting script.
  const TensorTree init = pair.builtin.init(server_generator(0, -1));
  const std::string init_file = (dir / "init.h5").string(), pt = (dir / "mlp.pt").string();
  h5::write_file(init_file, [&](h5::Writer& w) {
    for (const auto& [name, t] : init) w.tensor(name, t);
  });
  python(fmt::format("{}/experiments/fmnist_torchscript.py {} --sizes 12,16,16,3 --init {}", FAX_SOURCE_DIR, pt,
                     init_file));
  pair.copy = load_torchscript_model(pt, {{12}, 3, at::kFloat});
  const TensorTree loaded = pair.copy->init(server_generator(0, -1));
  ASSERT_EQ(loaded.numel(), init.numel());
  EXPECT_TRUE(at::equal(loaded.at("layers.0.weight"), init.at("l0.w").t()));
  EXPECT_EQ(pair.copy->num_parameters(), init.numel());

  // FedAvg, FedSGD (the gradient through federated AD) and hypergradient FedAvg learning the
  // client rate through the local steps: the same metrics to 1e-5 over 3 rounds.
  for (const std::string algorithm : {"fedavg", "fedsgd", "hypergrad_fedavg"}) {
    SCOPED_TRACE(algorithm);
    extra_yaml = algorithm == "hypergrad_fedavg" ? "algorithm:\n  learn_client_lr: true\n" : "";
    const RunResult a = run_with(pair.builtin, algorithm, 3);
    const RunResult b = run_with(*pair.copy, algorithm, 3);
    ASSERT_EQ(a.last.size(), b.last.size());
    int compared = 0;
    for (size_t i = 0; i < a.last.size(); ++i) {
      if (a.last[i].first.rfind("time/", 0) == 0) continue;
      EXPECT_EQ(a.last[i].first, b.last[i].first);
      EXPECT_NEAR(a.last[i].second, b.last[i].second, 1e-5 * std::max(1.0, std::abs(a.last[i].second)))
          << a.last[i].first;
      ++compared;
    }
    EXPECT_GE(compared, 3);
    // Trained: the final model is not the initial one.
    EXPECT_FALSE(at::allclose(b.state.params.at("layers.0.weight"), loaded.at("layers.0.weight")));
  }
}

TEST_F(TorchScriptModelTest, SameBitsOnOneAndTwoExecutorsAndAfterAResume) {
  python(fmt::format("{}/experiments/fmnist_torchscript.py {} --sizes 12,16,3", FAX_SOURCE_DIR, (dir / "m.pt").string()));
  model = load_torchscript_model((dir / "m.pt").string(), {{12}, 3, at::kFloat});
  plugin = load_plugin_file((fs::path(FAX_TEST_PLUGIN_DIR) / "fax_fedavg.so").string());
  extra_yaml = "algorithm:\n  client_momentum: 0.9\n  weight_decay: 0.001\n";
  expect_same_bits_on_one_and_two_executors();
  expect_resume_with_the_bits_of_an_uninterrupted_run("torchscript");
}

// BatchNorm's running statistics are buffers: no gradient, updated by the clients' forward passes,
// averaged by FedAvg, read (not updated) by evaluation, with the same bits on 1 and 2 executors;
// FedSGD and hypergradient FedAvg train such a model too.
TEST_F(TorchScriptModelTest, BatchNormStatisticsAreAveragedBuffers) {
  model = exported("bn");
  EXPECT_TRUE(model->is_buffer("norm.running_mean"));
  EXPECT_TRUE(model->is_buffer("norm.running_var"));
  EXPECT_FALSE(model->is_buffer("norm.weight"));
  const TensorTree init = model->init(server_generator(0, -1));
  EXPECT_FALSE(init.contains("norm.num_batches_tracked"));  // an integer counter stays in the module
  EXPECT_TRUE(at::equal(init.at("norm.running_mean"), at::zeros({8})));
  plugin = load_plugin_file((fs::path(FAX_TEST_PLUGIN_DIR) / "fax_fedavg.so").string());
  expect_same_bits_on_one_and_two_executors();
  const RunResult r = run(1, 2);
  EXPECT_GT(r.state.params.at("norm.running_mean").abs().sum().item<double>(), 0.0) << "the statistics did not move";
  // Evaluation reads the running statistics: not what the training forward pass computes.
  const at::Tensor x = at::randn({5, 12});
  const TensorTree before = r.state.params.map([](const at::Tensor& t) { return t.clone(); });
  EXPECT_FALSE(at::allclose(model->forward_eval(r.state.params, x), model->forward(r.state.params, x)));
  for (const auto& [name, t] : before) EXPECT_TRUE(at::equal(t, r.state.params.at(name))) << name << " changed";
  // Through federated AD the statistics take no gradient and stay; evaluating the candidate of a
  // hypergradient round changes no buffer either.
  const RunResult sgd = run_with(*model, "fedsgd", 2);
  EXPECT_TRUE(at::equal(sgd.state.params.at("norm.running_mean"), init.at("norm.running_mean")));
  EXPECT_FALSE(at::equal(sgd.state.params.at("norm.weight"), init.at("norm.weight")));
  extra_yaml = "algorithm:\n  learn_client_lr: true\n";
  const RunResult hyper = run_with(*model, "hypergrad_fedavg", 2);
  for (const auto& [name, t] : hyper.state.params) EXPECT_TRUE(at::isfinite(t).all().item<bool>()) << name;
}

// The module's loss sees one client's batch at a time, as its forward does; runs with it keep
// their bits over executor counts.
TEST_F(TorchScriptModelTest, ModuleLossReplacesCrossEntropy) {
  model = exported("custom_loss");
  const at::Tensor logits = at::randn({4, 3}), labels = at::randint(0, 3, {4}, at::kLong);
  EXPECT_TRUE(at::allclose(model->loss(logits, labels), 2 * cross_entropy(logits, labels)));
  const at::Tensor chunk_logits = at::randn({2, 4, 3}), chunk_labels = at::randint(0, 3, {2, 4}, at::kLong);
  EXPECT_TRUE(at::allclose(model->loss(chunk_logits, chunk_labels), 2 * cross_entropy(chunk_logits, chunk_labels)));
  plugin = load_plugin_file((fs::path(FAX_TEST_PLUGIN_DIR) / "fax_fedavg.so").string());
  expect_same_bits_on_one_and_two_executors();
}

// BatchNorm with momentum None averages over num_batches_tracked: the counter starts from its
// saved value in every call, so no client sees another's count and the bits hold.
TEST_F(TorchScriptModelTest, IntegerBuffersDoNotCarryBetweenCalls) {
  model = exported("bn_counter");
  plugin = load_plugin_file((fs::path(FAX_TEST_PLUGIN_DIR) / "fax_fedavg.so").string());
  expect_same_bits_on_one_and_two_executors();
}

TEST_F(TorchScriptModelTest, RefusesFilesThatAreNotAFittingModule) {
  const auto refused = [&](const std::string& path, const ModelShape& shape, const std::string& says) {
    try {
      load_torchscript_model(path, shape);
      ADD_FAILURE() << path << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "not one line: " << e.what();
    }
  };
  refused((dir / "missing.pt").string(), {{12}, 3}, "missing.pt: No such file or directory");
  const std::string tensor = (dir / "tensor.pt").string();
  python(fmt::format("{}/tests/plugins/export_modules.py tensor {}", FAX_SOURCE_DIR, tensor));
  refused(tensor, {{12}, 3}, "is not a TorchScript module");
  exported("bn");
  refused((dir / "bn.pt").string(), {{12}, 10}, "maps inputs [2, 12] to [2, 3], but the data set needs [2, 10]");
  refused((dir / "bn.pt").string(), {{1, 28, 28}, 3}, "forward() failed");
  refused("", {{12}, 3}, "model.path: set it");
  python(fmt::format("{}/tests/plugins/export_modules.py dropout {}", FAX_SOURCE_DIR, (dir / "dropout.pt").string()));
  refused((dir / "dropout.pt").string(), {{12}, 3}, "forward() draws random numbers (aten::dropout)");
  python(fmt::format("{}/tests/plugins/export_modules.py tied {}", FAX_SOURCE_DIR, (dir / "tied.pt").string()));
  refused((dir / "tied.pt").string(), {{12}, 3}, "parameters a.weight and b.weight share their storage");
}

}  // namespace
}  // namespace fax
