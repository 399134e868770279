#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fax/algorithm.h>
#include <fax/config.h>
#include <fax/plugin.h>

namespace fax {

/// A loaded, version-checked plugin. The library stays loaded for the life of the process.
struct Plugin {
  std::string path;
  std::string name;
  std::string description;
  std::string fax_version;
  std::string torch_version;
  std::vector<ConfigKey> keys;  ///< relative to "algorithm."
  const FaxPluginInfo* info = nullptr;

  using Instance = std::unique_ptr<Algorithm, std::function<void(Algorithm*)>>;
  /// A new algorithm. Every call into it is guarded: an exception it throws (of any type) leaves
  /// as a fax::Error naming this plugin and the call; fax's own errors pass unchanged.
  Instance create() const;
};

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

  /// The path of every fax_*.so on the search path (the first of each name), without loading any:
  /// loading runs a library's code, which fax-run plugins does in a child process per plugin.
  std::vector<std::string> candidates() const;

 private:
  std::vector<std::string> search_path_;
};

/// Loads and checks the library at `path` (no search).
std::shared_ptr<const Plugin> load_plugin_file(const std::string& path);

}  // namespace fax
