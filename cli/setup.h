#pragma once

#include <memory>
#include <string>
#include <vector>

#include <fax/base/config.h>
#include <fax/datasets/registry.h>
#include <fax/nn/model.h>
#include <fax/runtime/plugin_loader.h>
#include <fax/train/dataset.h>

namespace fax::cli {

/// An experiment file with its overrides, checked against the full schema: fax's own keys plus
/// those of the data set, model and algorithm plugin it names.
struct ExperimentSetup {
  Config config;
  const DatasetEntry* dataset = nullptr;  ///< built in, or made from dataset_plugin
  std::shared_ptr<const DatasetPlugin> dataset_plugin;
  std::shared_ptr<const DatasetEntry> dataset_from_plugin;  // a plugin has no size estimate
  const ModelEntry* model = nullptr;  ///< built in, or model_plugin
  std::shared_ptr<const ModelPlugin> model_plugin;
  std::shared_ptr<const Plugin> plugin;
};

/// Checks `config` against the schema of the data set, model and algorithm it names.
ExperimentSetup resolve_experiment(Config config, const PluginLoader& loader);

/// What an experiment resolved to on this host, for a coordinator to compare with its workers':
/// the plugin (name and a hash of its library file: another build would compute other bits), the
/// data set and the model as they describe themselves (model and data set plugins with their
/// files' hashes).
std::string experiment_identity(const ExperimentSetup& setup, const FederatedDataset& data, const Model& model);
/// What a run log records and a resume compares: experiment_identity and the simulated clock's
/// settings and trace files (which the coordinator alone reads: workers never see the clock).
std::string run_identity(const ExperimentSetup& setup, const FederatedDataset& data, const Model& model);
/// The experiment file at `path` with its --set overrides, resolved.
ExperimentSetup load_experiment(const std::string& path, const std::vector<std::string>& overrides,
                                const PluginLoader& loader);

}  // namespace fax::cli
