#include "setup.h"

#include <thread>

#include <fax/base/error.h>
#include <fax/io/config_yaml.h>
#include <fax/runtime/experiment.h>
#include <fax/train/aggregation.h>

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

// The entry of `registry` named `name`, else the plugin file `name` names on the loader's path,
// loaded by `load` (which returns the entry to use); `what` names the kind for messages.
template <class Entry, class Load>
const Entry* builtin_or_plugin(const std::string& name, const std::vector<Entry>& registry, const char* what,
                               const PluginLoader& loader, Load&& load) {
  if (name.find('/') == std::string::npos) {
    for (const auto& entry : registry)
      if (entry.name == name) return &entry;
  }
  const auto path = loader.locate(name);
  if (!path) {
    std::vector<std::string> names;
    for (const auto& entry : registry) names.push_back(entry.name);
    throw Error(fmt::format("unknown {} '{}' (built in: {}; nor is there a {} plugin fax_{}.so in {})", what, name,
                            fmt::join(names, ", "), what, name, fmt::join(loader.search_path(), ", ")));
  }
  return load(*path);
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
  setup.dataset = find_named(setup.config, schema, "data.name", [&](const std::string& n) {
    return builtin_or_plugin(n, dataset_registry(), "data set", loader, [&](const std::string& path) {
      setup.dataset_plugin = load_dataset_plugin_file(path);
      setup.dataset_from_plugin = std::make_shared<DatasetEntry>(DatasetEntry{*setup.dataset_plugin, nullptr});
      return setup.dataset_from_plugin.get();
    });
  });
  setup.model = find_named(setup.config, schema, "model.name", [&](const std::string& n) {
    return builtin_or_plugin(n, model_registry(), "model", loader, [&](const std::string& path) {
      setup.model_plugin = load_model_plugin_file(path);
      return static_cast<const ModelEntry*>(setup.model_plugin.get());
    });
  });
  setup.plugin = find_named(setup.config, schema, "algorithm.name", [&](const std::string& n) { return loader.load(n); });
  schema.add_all(setup.dataset->keys, "data");
  schema.add_all(setup.model->keys, "model");
  schema.add_all(setup.plugin->keys, "algorithm");
  for (ConfigKey& key : aggregation_keys(setup.config.raw("aggregation.stages", ""),
                                         setup.config.raw_origin("aggregation.stages", "aggregation.stages").str()))
    schema.add(std::move(key));
  setup.config.resolve(schema);
  // Automatic threads become a number here, so the run log, remote workers and a resume get it.
  if (setup.config.get_int("execution.threads") == 0) {
    const int threads = automatic_threads(setup.config.get_int("execution.logical_shards"));
    setup.config.set("execution.threads", std::to_string(threads),
                     {fmt::format("{} (0: {} hardware threads / execution.logical_shards)",
                                  setup.config.origin("execution.threads").str(), std::thread::hardware_concurrency()),
                      0, 0});
    setup.config.resolve(schema);
  }
  return setup;
}

std::string experiment_identity(const ExperimentSetup& setup, const FederatedDataset& data, const Model& model) {
  const auto from = [](const auto& plugin) {
    return plugin ? fmt::format(" from plugin {}", file_fingerprint(plugin->path)) : std::string();
  };
  return fmt::format("algorithm {} {}, data {}{}, model {}{}", setup.plugin->name, file_fingerprint(setup.plugin->path),
                     data.describe(), from(setup.dataset_plugin), model.describe(), from(setup.model_plugin));
}

std::string run_identity(const ExperimentSetup& setup, const FederatedDataset& data, const Model& model) {
  // The simulated clock's traces are inputs like the data: a changed trace is another timeline.
  const auto clock = SimulatedClock::from_config(setup.config);
  return experiment_identity(setup, data, model) + (clock ? ", clock " + clock->describe() : "");
}

}  // namespace fax::cli
