#include <fax/plugin_loader.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <sstream>

#include <fax/error.h>

namespace fax {
namespace fs = std::filesystem;

namespace detail {

PluginInfoStorage::PluginInfoStorage(uint32_t abi_version, const char* fax_version, const char* torch_version,
                                     int cxx11_abi, const char* name, const char* description,
                                     std::vector<ConfigKey> keys, void* (*create)(void), void (*destroy)(void*))
    : keys_(std::move(keys)) {
  for (const auto& key : keys_) choices_.push_back(fmt::format("{}", fmt::join(key.choices, ",")));
  for (size_t i = 0; i < keys_.size(); ++i) {
    const ConfigKey& k = keys_[i];
    c_keys_.push_back({k.name.c_str(), to_string(k.type), k.default_value.c_str(), k.doc.c_str(), k.min, k.max,
                       k.min_exclusive ? 1 : 0, choices_[i].c_str()});
  }
  info_ = {abi_version, fax_version, torch_version, cxx11_abi, name, description, c_keys_.data(), c_keys_.size(),
           create, destroy};
}

}  // namespace detail

namespace {

KeyType parse_key_type(const std::string& type, const std::string& key, const std::string& path) {
  for (KeyType t : {KeyType::Int, KeyType::Float, KeyType::Bool, KeyType::String})
    if (type == to_string(t)) return t;
  throw Error(fmt::format("plugin {}: key '{}' has unknown type '{}'", path, key, type));
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, sep))
    if (!part.empty()) out.push_back(part);
  return out;
}

std::string major_minor(const std::string& version) { return version.substr(0, version.rfind('.')); }

fs::path executable_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

// Libraries are never unloaded: algorithm objects and their code must outlive every run.
std::mutex loaded_mutex;
std::vector<void*> loaded_handles;

}  // namespace

Plugin::Instance Plugin::create() const {
  auto* algorithm = static_cast<Algorithm*>(info->create());
  FAX_CHECK(algorithm != nullptr, "plugin {} ({}) failed to create its algorithm", name, path);
  const FaxPluginInfo* i = info;
  return Instance(algorithm, [i](Algorithm* a) { i->destroy(a); });
}

std::shared_ptr<const Plugin> load_plugin_file(const std::string& path) {
  FAX_CHECK(fs::exists(path), "plugin {}: no such file", path);
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  FAX_CHECK(handle != nullptr, "plugin {}: cannot load: {}", path, dlerror());
  {
    std::lock_guard<std::mutex> lock(loaded_mutex);
    loaded_handles.push_back(handle);
  }
  auto entry = reinterpret_cast<FaxPluginEntry>(dlsym(handle, FAX_PLUGIN_ENTRY_POINT));
  FAX_CHECK(entry != nullptr, "plugin {}: no entry point '{}' (is FAX_PLUGIN(Type) missing?)", path,
            FAX_PLUGIN_ENTRY_POINT);
  const FaxPluginInfo* info = entry();
  FAX_CHECK(info != nullptr, "plugin {}: its entry point returned nothing", path);
  FAX_CHECK(info->abi_version == FAX_PLUGIN_ABI_VERSION,
            "plugin {} was built for plugin ABI version {}, but this fax ({}) loads plugin ABI version {}: "
            "rebuild the plugin against fax {}",
            path, info->abi_version, FAX_VERSION, FAX_PLUGIN_ABI_VERSION, FAX_VERSION);
  FAX_CHECK(major_minor(info->fax_version) == major_minor(FAX_VERSION),
            "plugin {} was built against fax {}, but this is fax {}: rebuild the plugin", path, info->fax_version,
            FAX_VERSION);
  FAX_CHECK(std::string(info->torch_version) == TORCH_VERSION,
            "plugin {} was built against LibTorch {}, but fax runs on LibTorch {}: rebuild the plugin", path,
            info->torch_version, TORCH_VERSION);
  FAX_CHECK(info->cxx11_abi == _GLIBCXX_USE_CXX11_ABI,
            "plugin {} was built with _GLIBCXX_USE_CXX11_ABI={}, but fax uses {}: rebuild the plugin", path,
            info->cxx11_abi, _GLIBCXX_USE_CXX11_ABI);

  auto plugin = std::make_shared<Plugin>();
  plugin->path = path;
  plugin->name = info->name;
  plugin->description = info->description;
  plugin->fax_version = info->fax_version;
  plugin->torch_version = info->torch_version;
  plugin->info = info;
  for (size_t i = 0; i < info->num_keys; ++i) {
    const FaxPluginKey& k = info->keys[i];
    plugin->keys.push_back({k.name, parse_key_type(k.type, k.name, path), k.default_value, k.doc, k.min, k.max,
                            k.min_exclusive != 0, split(k.choices, ',')});
  }
  return plugin;
}

PluginLoader::PluginLoader(std::vector<std::string> plugin_dirs) : search_path_(std::move(plugin_dirs)) {
  if (const char* env = std::getenv("FAX_PLUGIN_PATH")) {
    for (const auto& dir : split(env, ':')) search_path_.push_back(dir);
  }
  const fs::path exe = executable_dir();
  if (!exe.empty()) search_path_.push_back((exe.parent_path() / "lib" / "fax" / "plugins").string());
}

std::shared_ptr<const Plugin> PluginLoader::load(const std::string& name) const {
  if (name.find('/') != std::string::npos) return load_plugin_file(name);
  const std::string file = "fax_" + name + ".so";
  for (const auto& dir : search_path_) {
    const fs::path candidate = fs::path(dir) / file;
    if (fs::exists(candidate)) return load_plugin_file(candidate.string());
  }
  std::vector<std::string> available;
  for (const auto& listing : discover())
    if (listing.plugin) available.push_back(listing.plugin->name);
  throw Error(fmt::format("algorithm plugin '{}' not found: no {} in {} (available: {})", name, file,
                          fmt::join(search_path_, ", "), available.empty() ? "none" : fmt::to_string(fmt::join(available, ", "))));
}

std::vector<PluginListing> PluginLoader::discover() const {
  std::vector<PluginListing> out;
  std::vector<std::string> seen;
  for (const auto& dir : search_path_) {
    std::error_code ec;
    std::vector<fs::path> files;
    for (const auto& item : fs::directory_iterator(dir, ec)) {
      const std::string filename = item.path().filename().string();
      if (filename.rfind("fax_", 0) == 0 && item.path().extension() == ".so") files.push_back(item.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& path : files) {
      const std::string stem = path.stem().string();
      if (std::find(seen.begin(), seen.end(), stem) != seen.end()) continue;
      seen.push_back(stem);
      try {
        out.push_back({path.string(), load_plugin_file(path.string()), ""});
      } catch (const Error& e) {
        out.push_back({path.string(), nullptr, e.what()});
      }
    }
  }
  return out;
}

}  // namespace fax
