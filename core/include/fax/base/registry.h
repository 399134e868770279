#pragma once

#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <fax/base/config.h>
#include <fax/base/error.h>

namespace fax {

/// What every registry of fax holds about an entry, whatever it makes (an algorithm from a plugin,
/// a model, a data set): the name an experiment picks it by, one line of description, its settings
/// (relative to its section: "algorithm.", "model.", "data."), and how to make one.
template <class Created, class... Args>
struct RegistryEntry {
  std::string name;
  std::string description;
  std::vector<ConfigKey> keys;
  std::function<Created(Args...)> create;
};

/// The entry called `name` of a registry of entries with a `name` member; throws fax::Error
/// listing the available names when there is none. `what` names the kind: "data set", "model".
template <class Entry>
const Entry& find_entry(const std::vector<Entry>& registry, const std::string& name, const char* what) {
  std::vector<std::string> names;
  for (const auto& entry : registry) {
    if (entry.name == name) return entry;
    names.push_back(entry.name);
  }
  throw Error(fmt::format("unknown {} '{}' (available: {})", what, name, fmt::join(names, ", ")));
}

}  // namespace fax
