#pragma once

/// The plugin ABI. A plugin is a shared library (built with fax_add_plugin) that exports one
/// algorithm, one model or one data set:
///
///   FAX_PLUGIN(Type): Type is a fax::Algorithm subclass, default-constructible;
///   FAX_MODEL_PLUGIN(Type): Type is a fax::Model subclass constructed from
///     (const fax::Config&, const fax::ModelShape&): the experiment and what the data needs;
///   FAX_DATASET_PLUGIN(Type): Type is a fax::FederatedDataset subclass constructed from
///     (const fax::Config&): the experiment.
///
/// Type provides:
///
///   static constexpr const char* name = "fedavg";          // algorithm.name, model.name, data.name
///   static constexpr const char* description = "...";      // one line
///   static const fax::Settings<Options>& settings();       // its settings (fax/base/settings.h),
///                                                          // relative to "algorithm.", "model."
///                                                          // or "data."
///
/// (or, instead of settings(), `static std::vector<fax::ConfigKey> keys();`).
///
/// The entry point returns a plain C struct whose first field is the ABI version, so the loader
/// can refuse a plugin from another fax before it reads anything else.

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <torch/version.h>

#include <fax/base/config.h>
#include <fax/base/settings.h>
#include <fax/base/version.h>
#include <fax/nn/model.h>
#include <fax/train/algorithm.h>
#include <fax/train/dataset.h>

/// Bumped whenever FaxPluginInfo, fax::Algorithm, fax::Model or the types they pass change
/// incompatibly.
#define FAX_PLUGIN_ABI_VERSION 10
#define FAX_PLUGIN_ENTRY_POINT "fax_plugin_info"

extern "C" {

typedef struct FaxPluginKey {
  const char* name;           /* relative to "algorithm.", "model." or "data." */
  const char* type;           /* "integer", "float", "bool" or "string" */
  const char* default_value;  /* YAML scalar text */
  const char* doc;
  double min;                 /* -inf: none */
  double max;                 /* +inf: none */
  int min_exclusive;
  const char* choices;        /* comma-separated accepted strings, or "" */
} FaxPluginKey;

typedef struct FaxPluginInfo {
  uint32_t abi_version;       /* FAX_PLUGIN_ABI_VERSION of the plugin's build: always first */
  const char* fax_version;    /* FAX_VERSION of the plugin's build */
  const char* torch_version;  /* TORCH_VERSION of the plugin's build */
  int cxx11_abi;              /* _GLIBCXX_USE_CXX11_ABI of the plugin's build */
  const char* kind;           /* "algorithm", "model" or "dataset" */
  const char* name;
  const char* description;
  const FaxPluginKey* keys;
  size_t num_keys;
  /* A new fax::Algorithm (args: NULL), fax::Model (args: a fax::ModelPluginArgs*) or
     fax::FederatedDataset (args: a fax::DatasetPluginArgs*), as void*. */
  void* (*create)(const void* args);
  void (*destroy)(void*);
} FaxPluginInfo;

typedef const FaxPluginInfo* (*FaxPluginEntry)(void);
}

namespace fax {

inline constexpr const char* kAlgorithmPlugin = "algorithm";
inline constexpr const char* kModelPlugin = "model";
inline constexpr const char* kDatasetPlugin = "dataset";

/// What a model plugin's create() gets: the resolved experiment (its keys under "model.") and the
/// shape the data set needs.
struct ModelPluginArgs {
  const Config* config;
  const ModelShape* shape;
};

/// What a data set plugin's create() gets: the resolved experiment (its keys under "data.").
struct DatasetPluginArgs {
  const Config* config;
};

}  // namespace fax

namespace fax::detail {

/// Owns the strings and arrays a FaxPluginInfo points into, for the life of the process.
class PluginInfoStorage {
 public:
  PluginInfoStorage(uint32_t abi_version, const char* fax_version, const char* torch_version, int cxx11_abi,
                    const char* kind, const char* name, const char* description, std::vector<ConfigKey> keys,
                    void* (*create)(const void*), void (*destroy)(void*));
  const FaxPluginInfo* info() const { return &info_; }

 private:
  std::vector<ConfigKey> keys_;
  std::vector<std::string> choices_;
  std::vector<FaxPluginKey> c_keys_;
  FaxPluginInfo info_{};
};

/// The keys a plugin type declares: its settings table's, or what its keys() returns.
template <class Type, class = void>
struct HasSettings : std::false_type {};
template <class Type>
struct HasSettings<Type, std::void_t<decltype(Type::settings())>> : std::true_type {};

template <class Type>
std::vector<ConfigKey> plugin_keys() {
  if constexpr (HasSettings<Type>::value) return Type::settings().keys();
  else return Type::keys();
}

}  // namespace fax::detail

/// The entry point of a plugin of `kind` whose create() is `create_expr` (a lambda of const void*).
#define FAX_PLUGIN_ENTRY(Type, kind, Base, create_expr)                                        \
  extern "C" __attribute__((visibility("default"))) const FaxPluginInfo* fax_plugin_info(void) { \
    static const ::fax::detail::PluginInfoStorage storage(                                     \
        FAX_PLUGIN_ABI_VERSION, FAX_VERSION, TORCH_VERSION, _GLIBCXX_USE_CXX11_ABI, kind,         \
        Type::name, Type::description, ::fax::detail::plugin_keys<Type>(), create_expr,        \
        [](void* made) { delete static_cast<Base*>(made); });                                  \
    return storage.info();                                                                     \
  }

/// Exports `Type` (a fax::Algorithm with static name, description and settings()) as a plugin.
#define FAX_PLUGIN(Type)                                                                       \
  FAX_PLUGIN_ENTRY(Type, ::fax::kAlgorithmPlugin, ::fax::Algorithm,                            \
                   [](const void*) -> void* { return static_cast<::fax::Algorithm*>(new Type()); })

/// Exports `Type` (a fax::Model with static name, description and settings(), constructed from
/// (const fax::Config&, const fax::ModelShape&)) as a model plugin.
#define FAX_MODEL_PLUGIN(Type)                                                                 \
  FAX_PLUGIN_ENTRY(Type, ::fax::kModelPlugin, ::fax::Model, [](const void* args) -> void* {    \
    const auto* a = static_cast<const ::fax::ModelPluginArgs*>(args);                          \
    return static_cast<::fax::Model*>(new Type(*a->config, *a->shape));                        \
  })

/// Exports `Type` (a fax::FederatedDataset with static name, description and settings(),
/// constructed from (const fax::Config&)) as a data set plugin.
#define FAX_DATASET_PLUGIN(Type)                                                                      \
  FAX_PLUGIN_ENTRY(Type, ::fax::kDatasetPlugin, ::fax::FederatedDataset, [](const void* args) -> void* { \
    const auto* a = static_cast<const ::fax::DatasetPluginArgs*>(args);                               \
    return static_cast<::fax::FederatedDataset*>(new Type(*a->config));                               \
  })
