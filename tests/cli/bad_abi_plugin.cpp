// A plugin that claims another plugin ABI: the loader must refuse it and name both versions.
#include <fax/train/plugin.h>

extern "C" __attribute__((visibility("default"))) const FaxPluginInfo* fax_plugin_info(void) {
  static const FaxPluginInfo info = {FAX_PLUGIN_ABI_VERSION + 998, "9.9.0", TORCH_VERSION, _GLIBCXX_USE_CXX11_ABI,
                                     "algorithm", "badabi", "built for another plugin ABI", nullptr, 0, nullptr, nullptr};
  return &info;
}
