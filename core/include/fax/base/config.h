#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace fax {

enum class KeyType { Int, Float, Bool, String };
const char* to_string(KeyType type);

/// One accepted configuration key.
struct ConfigKey {
  std::string name;           ///< dotted: "algorithm.client_lr"
  KeyType type = KeyType::Float;
  std::string default_value;  ///< YAML scalar text
  std::string doc;
  double min = -std::numeric_limits<double>::infinity();  ///< numbers: smallest accepted value
  double max = std::numeric_limits<double>::infinity();   ///< numbers: largest accepted value
  bool min_exclusive = false;                             ///< numbers: min itself is refused
  std::vector<std::string> choices;                       ///< strings: the accepted values (empty: any)
};

// Declaring keys.
ConfigKey int_key(std::string name, std::string default_value, std::string doc,
                  double min = -std::numeric_limits<double>::infinity(),
                  double max = std::numeric_limits<double>::infinity());
ConfigKey float_key(std::string name, std::string default_value, std::string doc,
                    double min = -std::numeric_limits<double>::infinity(),
                    double max = std::numeric_limits<double>::infinity(), bool min_exclusive = false);
/// A float that must be > 0 (learning rates, scales).
ConfigKey positive_float_key(std::string name, std::string default_value, std::string doc);
ConfigKey bool_key(std::string name, std::string default_value, std::string doc);
ConfigKey string_key(std::string name, std::string default_value, std::string doc,
                     std::vector<std::string> choices = {});

/// What a key accepts beyond its type, for messages and listings: "> 0", "in [0, 0.999]",
/// "one of a, b", or "" when anything of its type goes.
std::string describe_constraints(const ConfigKey& key);

/// The keys an experiment may set: fax's own sections plus those its data set, model and algorithm
/// declare. Order is declaration order and is the order of the resolved YAML.
class Schema {
 public:
  void add(ConfigKey key);
  /// Adds `keys` with `prefix` + "." in front of each name.
  void add_all(const std::vector<ConfigKey>& keys, const std::string& prefix);
  const ConfigKey* find(const std::string& name) const;
  const std::vector<ConfigKey>& keys() const { return keys_; }

 private:
  std::vector<ConfigKey> keys_;
};

using ConfigValue = std::variant<int64_t, double, bool, std::string>;

/// Where a setting came from, for error messages: "exp.yaml:3:5" or "--set a.b=1".
struct ConfigOrigin {
  std::string source;
  int line = 0;    ///< 1-based; 0 when not from a file
  int column = 0;  ///< 1-based
  std::string str() const;
};

/// An experiment's settings: what the user wrote (YAML file, --set overrides; read by
/// fax/io/config_yaml.h), then, after resolve(), every key of the schema with its typed value (the
/// user's or the default).
class Config {
 public:
  /// A setting as the user wrote it: its value's text and where the value and the key came from.
  struct Written {
    std::string name;
    std::string text;
    ConfigOrigin origin;
    ConfigOrigin key_origin;
  };
  /// Settings with distinct names, in the user's order (readers of experiment files, fax/io).
  static Config from_written(std::vector<Written> settings);

  /// Sets `name` to the value `text`; a later setting wins (--set overrides).
  void set(const std::string& name, const std::string& text, const ConfigOrigin& origin);

  /// The user's raw text for `name` (before resolution), or `fallback` when not set.
  std::string raw(const std::string& name, const std::string& fallback) const;
  /// Where the user set `name` (before resolution); `fallback` as the source when not set.
  ConfigOrigin raw_origin(const std::string& name, const std::string& fallback) const;

  /// Checks every setting against `schema` (unknown key with a did-you-mean suggestion, wrong
  /// type, out of range, not one of the choices: fax::Error naming file:line:col) and fills in
  /// the defaults of keys the user did not set.
  void resolve(const Schema& schema);
  bool resolved() const { return resolved_; }

  bool has(const std::string& name) const;
  int64_t get_int(const std::string& name) const;
  double get_float(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  const std::string& get_string(const std::string& name) const;
  /// Where the value of `name` came from ("default" for defaults).
  ConfigOrigin origin(const std::string& name) const;

  /// Every setting as (dotted name, value text), in order: schema order once resolved.
  std::vector<std::pair<std::string, std::string>> settings() const;

 private:
  struct Entry {
    std::string name;
    std::string text;
    ConfigOrigin origin;      ///< of the value
    ConfigOrigin key_origin;  ///< of the key (unknown-key errors point here)
    ConfigValue value;
  };
  const Entry& entry(const std::string& name, const char* wanted) const;
  void put(Entry entry);

  std::vector<Entry> entries_;
  bool resolved_ = false;
};

/// Edit distance, for did-you-mean suggestions.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace fax
