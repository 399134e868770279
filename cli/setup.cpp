#include "setup.h"

#include <fax/error.h>
#include <fax/experiment.h>

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
  Config config = Config::from_file(path);
  for (const auto& assignment : overrides) config.set(assignment);
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

}  // namespace fax::cli
