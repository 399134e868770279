#pragma once

#include <string>
#include <vector>

#include <fmt/format.h>

#include <fax/error.h>

namespace fax {

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
