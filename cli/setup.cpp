#include "setup.h"

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
  setup.model = find_named(setup.config, schema, "model.name", [&](const std::string& n) -> const ModelEntry* {
    if (n.find('/') == std::string::npos) {
      for (const auto& entry : model_registry())
        if (entry.name == n) return &entry;
    }
    // Not built in: a model plugin.
    const auto path = loader.locate(n);
    if (!path) {
      std::vector<std::string> names;
      for (const auto& entry : model_registry()) names.push_back(entry.name);
      throw Error(fmt::format("unknown model '{}' (built in: {}; nor is there a model plugin fax_{}.so in {})", n,
                              fmt::join(names, ", "), n, fmt::join(loader.search_path(), ", ")));
    }
    setup.model_plugin = load_model_plugin_file(*path);
    return setup.model_plugin.get();
  });
  setup.plugin = find_named(setup.config, schema, "algorithm.name", [&](const std::string& n) { return loader.load(n); });
  schema.add_all(setup.dataset->keys, "data");
  schema.add_all(setup.model->keys, "model");
  schema.add_all(setup.plugin->keys, "algorithm");
  setup.config.resolve(schema);
  return setup;
}

std::string experiment_identity(const ExperimentSetup& setup, const FederatedDataset& data, const Model& model) {
  const std::string model_file =
      setup.model_plugin ? fmt::format(" from plugin {}", file_fingerprint(setup.model_plugin->path)) : "";
  return fmt::format("algorithm {} {}, data {}, model {}{}", setup.plugin->name, file_fingerprint(setup.plugin->path),
                     data.describe(), model.describe(), model_file);
}

}  // namespace fax::cli
