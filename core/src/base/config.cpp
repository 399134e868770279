#include <fax/base/config.h>
#include <fax/base/settings.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <unordered_set>

#include <fax/base/error.h>

namespace fax {
namespace {

bool parse_int(const std::string& text, int64_t& out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data() + (text.size() > 1 && text[0] == '+'), end, out);
  return ec == std::errc() && ptr == end;
}

bool parse_float(const std::string& text, double& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && std::isfinite(out);
}

bool parse_bool(const std::string& text, bool& out) {
  static const char* yes[] = {"true", "True", "TRUE", "yes", "Yes", "on", "On"};
  static const char* no[] = {"false", "False", "FALSE", "no", "No", "off", "Off"};
  for (const char* y : yes)
    if (text == y) return out = true, true;
  for (const char* n : no)
    if (text == n) return out = false, true;
  return false;
}

ConfigValue parse_value(const ConfigKey& key, const std::string& text, const ConfigOrigin& where) {
  auto wrong_type = [&]() {
    return Error(fmt::format("{}: {}: expected {} {}, got '{}'", where.str(), key.name,
                             key.type == KeyType::Int ? "an" : "a", to_string(key.type), text));
  };
  auto check_range = [&](double v) {
    const bool below = key.min_exclusive ? v <= key.min : v < key.min;
    FAX_CHECK(!below && v <= key.max, "{}: {}: {} is out of range (must be {})", where.str(), key.name, text,
              describe_constraints(key));
  };
  switch (key.type) {
    case KeyType::Int: {
      int64_t v = 0;
      if (!parse_int(text, v)) throw wrong_type();
      check_range(static_cast<double>(v));
      return v;
    }
    case KeyType::Float: {
      double v = 0;
      if (!parse_float(text, v)) throw wrong_type();
      check_range(v);
      return v;
    }
    case KeyType::Bool: {
      bool v = false;
      if (!parse_bool(text, v)) throw wrong_type();
      return v;
    }
    case KeyType::String: {
      if (!key.choices.empty() && std::find(key.choices.begin(), key.choices.end(), text) == key.choices.end()) {
        throw Error(fmt::format("{}: {}: '{}' is not one of: {}", where.str(), key.name, text, fmt::join(key.choices, ", ")));
      }
      return text;
    }
  }
  FAX_ASSERT(false, "unknown key type");
  return text;
}

std::string section_of(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? "" : name.substr(0, dot);
}

// The closest known key: by its last part among keys of the same section (a typo in the key), or
// by the whole dotted name (a typo in the section).
std::string suggestion(const Schema& schema, const std::string& name) {
  const std::string section = section_of(name);
  const std::string leaf = name.substr(section.empty() ? 0 : section.size() + 1);
  const ConfigKey* best = nullptr;
  size_t best_distance = std::string::npos;
  for (const auto& key : schema.keys()) {
    size_t d = edit_distance(name, key.name);
    if (section_of(key.name) == section) d = std::min(d, edit_distance(leaf, key.name.substr(key.name.rfind('.') + 1)));
    if (d < best_distance) {
      best_distance = d;
      best = &key;
    }
  }
  if (best == nullptr || best_distance > std::max<size_t>(2, leaf.size() / 3)) return "";
  return fmt::format(" (did you mean '{}'?)", best->name);
}

std::string format_value(const ConfigValue& v) {
  return std::visit([](const auto& x) -> std::string {
    using T = std::decay_t<decltype(x)>;
    if constexpr (std::is_same_v<T, bool>) return x ? "true" : "false";
    else if constexpr (std::is_same_v<T, std::string>) return x;
    else if constexpr (std::is_same_v<T, double>) {
      // Keep floats recognisable as floats ("1.0", not "1") in the resolved YAML.
      std::string text = fmt::format("{}", x);
      return text.find_first_of(".en") == std::string::npos ? text + ".0" : text;
    } else return fmt::format("{}", x);
  }, v);
}

}  // namespace

namespace detail {

std::string default_text(int64_t value) { return format_value(value); }
std::string default_text(uint64_t value) { return fmt::format("{}", value); }
std::string default_text(double value) { return format_value(value); }
std::string default_text(bool value) { return format_value(value); }
std::string default_text(const std::string& value) { return value; }

}  // namespace detail

const char* to_string(KeyType type) {
  switch (type) {
    case KeyType::Int: return "integer";
    case KeyType::Float: return "float";
    case KeyType::Bool: return "bool";
    case KeyType::String: return "string";
  }
  return "?";
}

std::string describe_constraints(const ConfigKey& key) {
  if (!key.choices.empty()) return fmt::format("one of {}", fmt::join(key.choices, ", "));
  const bool has_min = std::isfinite(key.min);
  const bool has_max = std::isfinite(key.max);
  if (has_min && has_max) return fmt::format("in {}{}, {}]", key.min_exclusive ? "(" : "[", key.min, key.max);
  if (has_min) return fmt::format("{} {}", key.min_exclusive ? ">" : ">=", key.min);
  if (has_max) return fmt::format("<= {}", key.max);
  return "";
}

ConfigKey int_key(std::string name, std::string default_value, std::string doc, double min, double max) {
  return {std::move(name), KeyType::Int, std::move(default_value), std::move(doc), min, max, false, {}};
}

ConfigKey float_key(std::string name, std::string default_value, std::string doc, double min, double max,
                    bool min_exclusive) {
  return {std::move(name), KeyType::Float, std::move(default_value), std::move(doc), min, max, min_exclusive, {}};
}

ConfigKey positive_float_key(std::string name, std::string default_value, std::string doc) {
  return float_key(std::move(name), std::move(default_value), std::move(doc), 0, std::numeric_limits<double>::infinity(),
                   true);
}

ConfigKey bool_key(std::string name, std::string default_value, std::string doc) {
  ConfigKey key;
  key.name = std::move(name);
  key.type = KeyType::Bool;
  key.default_value = std::move(default_value);
  key.doc = std::move(doc);
  return key;
}

ConfigKey string_key(std::string name, std::string default_value, std::string doc, std::vector<std::string> choices) {
  ConfigKey key;
  key.name = std::move(name);
  key.type = KeyType::String;
  key.default_value = std::move(default_value);
  key.doc = std::move(doc);
  key.choices = std::move(choices);
  return key;
}

std::string ConfigOrigin::str() const {
  return line > 0 ? fmt::format("{}:{}:{}", source, line, column) : source;
}

void Schema::add(ConfigKey key) {
  FAX_ASSERT(find(key.name) == nullptr, "config key '{}' declared twice", key.name);
  keys_.push_back(std::move(key));
}

void Schema::add_all(const std::vector<ConfigKey>& keys, const std::string& prefix) {
  for (ConfigKey key : keys) {
    key.name = prefix + "." + key.name;
    add(std::move(key));
  }
}

const ConfigKey* Schema::find(const std::string& name) const {
  for (const auto& key : keys_)
    if (key.name == name) return &key;
  return nullptr;
}

Config Config::from_written(std::vector<Written> settings) {
  Config config;
  std::unordered_set<std::string> names;
  for (auto& w : settings) {
    FAX_ASSERT(names.insert(w.name).second, "setting '{}' given twice", w.name);
    config.entries_.push_back({w.name, w.text, w.origin, w.key_origin, w.text});
  }
  return config;
}

void Config::set(const std::string& name, const std::string& text, const ConfigOrigin& origin) {
  put({name, text, origin, origin, text});
  resolved_ = false;
}

void Config::put(Entry e) {
  for (auto& existing : entries_) {
    if (existing.name == e.name) {
      existing = std::move(e);
      return;
    }
  }
  entries_.push_back(std::move(e));
}

std::string Config::raw(const std::string& name, const std::string& fallback) const {
  for (const auto& e : entries_)
    if (e.name == name) return e.text;
  return fallback;
}

ConfigOrigin Config::raw_origin(const std::string& name, const std::string& fallback) const {
  for (const auto& e : entries_)
    if (e.name == name) return e.origin;
  return {fallback, 0, 0};
}

void Config::resolve(const Schema& schema) {
  std::vector<Entry> resolved;
  for (const auto& e : entries_) {
    const ConfigKey* key = schema.find(e.name);
    if (key == nullptr) {
      throw Error(fmt::format("{}: unknown key '{}'{}", e.key_origin.str(), e.name, suggestion(schema, e.name)));
    }
  }
  for (const auto& key : schema.keys()) {
    auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == key.name; });
    if (it != entries_.end()) {
      resolved.push_back({key.name, it->text, it->origin, it->key_origin, parse_value(key, it->text, it->origin)});
    } else {
      const ConfigOrigin where{"default of " + key.name, 0, 0};
      resolved.push_back({key.name, key.default_value, where, where, parse_value(key, key.default_value, where)});
    }
  }
  entries_ = std::move(resolved);
  resolved_ = true;
}

bool Config::has(const std::string& name) const {
  return std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == name; });
}

const Config::Entry& Config::entry(const std::string& name, const char* wanted) const {
  FAX_ASSERT(resolved_, "config read before resolve(): {}", name);
  for (const auto& e : entries_)
    if (e.name == name) return e;
  FAX_ASSERT(false, "config key '{}' ({}) is not in the schema", name, wanted);
  return entries_.front();
}

int64_t Config::get_int(const std::string& name) const {
  const auto* v = std::get_if<int64_t>(&entry(name, "integer").value);
  FAX_ASSERT(v != nullptr, "config key '{}' is not an integer", name);
  return *v;
}

double Config::get_float(const std::string& name) const {
  const auto* v = std::get_if<double>(&entry(name, "float").value);
  FAX_ASSERT(v != nullptr, "config key '{}' is not a float", name);
  return *v;
}

bool Config::get_bool(const std::string& name) const {
  const auto* v = std::get_if<bool>(&entry(name, "bool").value);
  FAX_ASSERT(v != nullptr, "config key '{}' is not a bool", name);
  return *v;
}

const std::string& Config::get_string(const std::string& name) const {
  const auto* v = std::get_if<std::string>(&entry(name, "string").value);
  FAX_ASSERT(v != nullptr, "config key '{}' is not a string", name);
  return *v;
}

ConfigOrigin Config::origin(const std::string& name) const { return entry(name, "any").origin; }

std::vector<std::pair<std::string, std::string>> Config::settings() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : entries_) out.emplace_back(e.name, resolved_ ? format_value(e.value) : e.text);
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace fax
