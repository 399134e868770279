#include <cstdio>

#include <fax/plugin_loader.h>

#include "commands.h"

namespace fax::cli {
int plugins_command(const PluginsOptions& options) {
  const PluginLoader loader(options.plugin_dirs);
  std::printf("plugin search path:\n");
  for (const auto& dir : loader.search_path()) std::printf("  %s\n", dir.c_str());
  const auto listings = loader.discover();
  if (listings.empty()) std::printf("no plugins (fax_<name>.so) found\n");
  for (const auto& listing : listings) {
    if (!listing.plugin) {
      std::printf("\nrefused: %s\n  %s\n", listing.path.c_str(), listing.error.c_str());
      continue;
    }
    const Plugin& p = *listing.plugin;
    std::printf("\n%s  (fax %s, LibTorch %s)  %s\n  %s\n", p.name.c_str(), p.fax_version.c_str(),
                p.torch_version.c_str(), p.path.c_str(), p.description.c_str());
    for (const auto& key : p.keys) {
      const std::string constraints = describe_constraints(key);
      std::printf("  algorithm.%-18s %-8s = %-8s %s%s\n", key.name.c_str(), to_string(key.type),
                  key.default_value.c_str(), key.doc.c_str(),
                  constraints.empty() ? "" : (" (" + constraints + ")").c_str());
    }
  }
  return 0;
}

}  // namespace fax::cli
