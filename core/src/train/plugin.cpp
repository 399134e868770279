#include <fax/train/plugin.h>

#include <fmt/format.h>

namespace fax {

namespace detail {

PluginInfoStorage::PluginInfoStorage(uint32_t abi_version, const char* fax_version, const char* torch_version,
                                     int cxx11_abi, const char* kind, const char* name, const char* description,
                                     std::vector<ConfigKey> keys, void* (*create)(const void*), void (*destroy)(void*))
    : keys_(std::move(keys)) {
  for (const auto& key : keys_) choices_.push_back(fmt::format("{}", fmt::join(key.choices, ",")));
  for (size_t i = 0; i < keys_.size(); ++i) {
    const ConfigKey& k = keys_[i];
    c_keys_.push_back({k.name.c_str(), to_string(k.type), k.default_value.c_str(), k.doc.c_str(), k.min, k.max,
                       k.min_exclusive ? 1 : 0, choices_[i].c_str()});
  }
  info_ = {abi_version, fax_version, torch_version, cxx11_abi, kind, name, description, c_keys_.data(),
           c_keys_.size(), create, destroy};
}

}  // namespace detail

}  // namespace fax
