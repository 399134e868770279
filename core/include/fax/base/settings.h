#pragma once

// Settings declared once. An options struct states each member's default where it declares it;
// a Settings<Options> table binds a key name, help text and range to each member, once. The keys an
// experiment accepts (validation, `fax-run plugins`, the resolved YAML) and the options the code
// reads both come from that table, in the spirit of LibTorch's TORCH_ARG:
//
//   struct ServerOptions {
//     double lr = 1.0;
//     double momentum = 0.0;
//   };
//   const fax::Settings<ServerOptions>& server_settings() {
//     static const fax::Settings<ServerOptions> table = fax::Settings<ServerOptions>()
//         .add("server_lr", &ServerOptions::lr, "server learning rate", fax::positive())
//         .add("server_momentum", &ServerOptions::momentum, "server momentum", fax::in(0, 0.999));
//     return table;
//   }
//   ... server_settings().keys()                  -> ConfigKeys with defaults "1.0" and "0.0"
//   ... server_settings().read(config, "algorithm") -> ServerOptions from algorithm.server_lr, ...

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fax/base/config.h>
#include <fax/base/error.h>

namespace fax {

/// What a setting accepts beyond its type.
struct Constraint {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;
  std::vector<std::string> choices;  ///< strings only; empty: any
};

/// Numbers >= low.
inline Constraint at_least(double low) { return {low, std::numeric_limits<double>::infinity(), false, {}}; }
/// Numbers in [low, high].
inline Constraint in(double low, double high) { return {low, high, false, {}}; }
/// Numbers > 0 (learning rates, scales).
inline Constraint positive() { return {0, std::numeric_limits<double>::infinity(), true, {}}; }
/// Numbers in (low, high].
inline Constraint above(double low, double high = std::numeric_limits<double>::infinity()) { return {low, high, true, {}}; }
/// Strings among `choices`.
inline Constraint one_of(std::vector<std::string> choices) {
  Constraint c;
  c.choices = std::move(choices);
  return c;
}

namespace detail {

template <class T>
constexpr KeyType key_type() {
  if constexpr (std::is_same_v<T, bool>) return KeyType::Bool;
  else if constexpr (std::is_integral_v<T>) return KeyType::Int;
  else if constexpr (std::is_floating_point_v<T>) return KeyType::Float;
  else {
    static_assert(std::is_same_v<T, std::string>, "a setting is an integer, a float, a bool or a std::string");
    return KeyType::String;
  }
}

/// A default as the YAML scalar text a ConfigKey holds ("1.0" for a float one).
std::string default_text(int64_t value);
std::string default_text(uint64_t value);
std::string default_text(double value);
std::string default_text(bool value);
std::string default_text(const std::string& value);

template <class T>
T setting_value(const Config& config, const std::string& name) {
  if constexpr (std::is_same_v<T, bool>) return config.get_bool(name);
  else if constexpr (std::is_integral_v<T>) return static_cast<T>(config.get_int(name));
  else if constexpr (std::is_floating_point_v<T>) return static_cast<T>(config.get_float(name));
  else return config.get_string(name);
}

}  // namespace detail

/// The settings of an options struct: each a key bound to a member (see the top of this file).
/// Options must be default-constructible; its default member values are the keys' defaults.
template <class Options>
class Settings {
 public:
  /// Binds key `name` (relative to the section the table is read from) to `member`.
  template <class T>
  Settings& add(std::string name, T Options::*member, std::string doc, Constraint constraint = {}) {
    static_assert(!std::is_same_v<T, float> && !std::is_same_v<T, int32_t>,
                  "use double and int64_t (or uint64_t) members: what a Config holds");
    ConfigKey key{std::move(name), detail::key_type<T>(), "", std::move(doc), constraint.min, constraint.max,
                  constraint.min_exclusive, std::move(constraint.choices)};
    if constexpr (std::is_unsigned_v<T> && !std::is_same_v<T, bool>) {
      // A Config holds int64 (a larger value is not an integer to it): 0 .. INT64_MAX.
      if (key.min < 0) {
        key.min = 0;
        key.min_exclusive = false;
      }
      FAX_ASSERT(static_cast<uint64_t>(Options{}.*member) <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                 "setting '{}': its default does not fit an int64", key.name);
    }
    check_new(key.name);
    const std::string leaf = key.name;
    entries_.push_back({std::move(key),
                        [member, leaf](Options& o, const Config& c, const std::string& prefix) {
                          o.*member = detail::setting_value<T>(c, prefix + leaf);
                        },
                        [member](const Options& o) { return detail::default_text(o.*member); }});
    return *this;
  }

  /// Adds every setting of `table` at this level, bound to the part of Options held in `member`.
  /// Their defaults are that member's in a default Options (which may differ from Part's own).
  template <class Part>
  Settings& include(Part Options::*member, const Settings<Part>& table) {
    const auto part = std::make_shared<const Settings<Part>>(table);
    for (size_t i = 0; i < table.entries_.size(); ++i) {
      check_new(table.entries_[i].key.name);
      entries_.push_back({table.entries_[i].key,
                          [member, part, i](Options& o, const Config& c, const std::string& prefix) {
                            part->entries_[i].read(o.*member, c, prefix);
                          },
                          [member, part, i](const Options& o) { return part->entries_[i].text(o.*member); }});
    }
    return *this;
  }

  /// The keys, in the order they were added, relative to the section, with their defaults.
  std::vector<ConfigKey> keys() const {
    const Options defaults{};
    std::vector<ConfigKey> out;
    for (const auto& e : entries_) {
      out.push_back(e.key);
      out.back().default_value = e.text(defaults);
    }
    return out;
  }

  /// The options a resolved config holds under `section` ("algorithm": algorithm.server_lr, ...).
  Options read(const Config& config, const std::string& section) const {
    Options o{};
    const std::string prefix = section.empty() ? "" : section + ".";
    for (const auto& e : entries_) e.read(o, config, prefix);
    return o;
  }

 private:
  template <class>
  friend class Settings;

  // A key bound twice would be a schema with a duplicate: a bug in the table, found where it is.
  void check_new(const std::string& name) const {
    for (const auto& e : entries_) FAX_ASSERT(e.key.name != name, "setting '{}' is declared twice", name);
  }

  struct Entry {
    ConfigKey key;  // default_value filled in by keys()
    std::function<void(Options&, const Config&, const std::string& prefix)> read;
    std::function<std::string(const Options&)> text;
  };
  std::vector<Entry> entries_;
};

}  // namespace fax
