#include "setup.h"

#include <fstream>

#include <fax/base/error.h>
#include <fax/io/config_yaml.h>
#include <fax/runtime/experiment.h>

namespace fax::cli {
namespace {

// Runs `find` on the name the user gave for `key`, prefixing its errors with where it was set.
template <class F>
auto find_named(const Config& config, const Schema& base, const std::string& key, F&& find) {
  const std::string name = config.raw(key, base.find(key)->default_value);
  try {
    return find(name);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", config.raw_origin(key, "default of " + key).str(), e.what()));
  }
}

}  // namespace

ExperimentSetup load_experiment(const std::string& path, const std::vector<std::string>& overrides,
                                const PluginLoader& loader) {
  Config config = load_config(path);
  for (const auto& assignment : overrides) apply_override(config, assignment);
  return resolve_experiment(std::move(config), loader);
}

ExperimentSetup resolve_experiment(Config config, const PluginLoader& loader) {
  ExperimentSetup setup;
  setup.config = std::move(config);

  Schema schema = experiment_schema();
  setup.dataset = find_named(setup.config, schema, "data.name", [](const std::string& n) { return &find_dataset(n); });
  setup.model = find_named(setup.config, schema, "model.name", [](const std::string& n) { return &find_model(n); });
  setup.plugin = find_named(setup.config, schema, "algorithm.name", [&](const std::string& n) { return loader.load(n); });
  schema.add_all(setup.dataset->keys, "data");
  schema.add_all(setup.model->keys, "model");
  schema.add_all(setup.plugin->keys, "algorithm");
  setup.config.resolve(schema);
  return setup;
}

std::string experiment_identity(const ExperimentSetup& setup, const FederatedDataset& data, const Model& model) {
  std::ifstream in(setup.plugin->path, std::ios::binary);
  FAX_CHECK(in.good(), "cannot read the plugin {}", setup.plugin->path);
  uint64_t hash = 14695981039346656037ull;  // FNV-1a
  int64_t size = 0;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    for (std::streamsize i = 0; i < in.gcount(); ++i) hash = (hash ^ static_cast<unsigned char>(buffer[i])) * 1099511628211ull;
    size += in.gcount();
  }
  return fmt::format("algorithm {} ({} bytes, FNV-1a {:016x}), data {}, model {}", setup.plugin->name, size, hash,
                     data.describe(), model.describe());
}

}  // namespace fax::cli
