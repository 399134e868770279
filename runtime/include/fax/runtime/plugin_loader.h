#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fax/base/config.h>
#include <fax/base/registry.h>
#include <fax/nn/model.h>
#include <fax/train/algorithm.h>
#include <fax/train/dataset.h>
#include <fax/train/plugin.h>

namespace fax {

/// An algorithm made by a plugin, deleted by the plugin's own code.
using AlgorithmInstance = std::unique_ptr<Algorithm, std::function<void(Algorithm*)>>;

/// Where a loaded, version-checked plugin came from. The library stays loaded for the life of the
/// process.
struct PluginOrigin {
  std::string path;
  std::string fax_version;
  std::string torch_version;
  const FaxPluginInfo* info = nullptr;
};

/// An algorithm plugin: a registry entry like a model's or a data set's (keys relative to
/// "algorithm."). create() makes a new algorithm; every call into it is guarded: an exception it
/// throws (of any type) leaves as a fax::Error naming this plugin and the call; fax's own errors
/// pass unchanged.
struct Plugin : RegistryEntry<AlgorithmInstance>, PluginOrigin {
  using Instance = AlgorithmInstance;
};

/// A model plugin: a model registry entry (keys relative to "model."), guarded the same way.
struct ModelPlugin : ModelEntry, PluginOrigin {};

/// A data set plugin: a data set registry entry (keys relative to "data."), guarded the same way.
struct DatasetPlugin : RegistryEntry<std::unique_ptr<FederatedDataset>, const Config&>, PluginOrigin {};

/// Finds plugins as fax_<name>.so in, in order: `--plugin-dir` directories, FAX_PLUGIN_PATH
/// (colon-separated), and <prefix>/lib/fax/plugins next to the running executable (the install
/// prefix, or the build tree, which has the same layout).
class PluginLoader {
 public:
  explicit PluginLoader(std::vector<std::string> plugin_dirs = {});

  const std::vector<std::string>& search_path() const { return search_path_; }

  /// Loads the plugin `name` (searched on the path) or the library at `name` when it contains a
  /// '/'. Throws fax::Error naming the search path when it is not found, and refuses a plugin built
  /// for another plugin ABI, fax version, LibTorch version or C++ ABI with both sides named.
  std::shared_ptr<const Plugin> load(const std::string& name) const;
  /// The same for a model plugin.
  std::shared_ptr<const ModelPlugin> load_model(const std::string& name) const;
  /// The same for a data set plugin.
  std::shared_ptr<const DatasetPlugin> load_dataset(const std::string& name) const;
  /// The file `name` names: `name` itself when it contains a '/', else the first fax_<name>.so on
  /// the search path; none when there is no such file.
  std::optional<std::string> locate(const std::string& name) const;

  /// The path of every fax_*.so on the search path (the first of each name), without loading any:
  /// loading runs a library's code, which fax-run plugins does in a child process per plugin.
  std::vector<std::string> candidates() const;

 private:
  // The file of the `kind` plugin `name` on the search path (or `name` itself, a path).
  std::string find(const std::string& name, const char* kind) const;
  std::vector<std::string> search_path_;
};

/// Loads and checks the algorithm plugin at `path` (no search); refuses a plugin of another kind.
std::shared_ptr<const Plugin> load_plugin_file(const std::string& path);
/// The same for a model plugin.
std::shared_ptr<const ModelPlugin> load_model_plugin_file(const std::string& path);
/// The same for a data set plugin.
std::shared_ptr<const DatasetPlugin> load_dataset_plugin_file(const std::string& path);
/// The kind of the plugin at `path` ("algorithm", "model" or "dataset"), loaded and checked.
std::string plugin_kind(const std::string& path);

/// "(N bytes, FNV-1a H)": what identifies a file's contents in an experiment's identity.
std::string file_fingerprint(const std::string& path);

}  // namespace fax
