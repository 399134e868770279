#include <fax/io/config_yaml.h>

#include <unordered_map>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include <fax/base/error.h>
#include <fax/io/files.h>
#include <fax/io/yaml.h>

namespace fax {
namespace {

ConfigOrigin origin_of(const std::string& source, const YAML::Mark& mark) {
  return {source, mark.line + 1, mark.column + 1};
}

void flatten(const YAML::Node& node, const std::string& prefix, const std::string& source,
             std::vector<Config::Written>& out, std::unordered_map<std::string, ConfigOrigin>& seen);

// The aggregation pipeline as a list, [{clip: {norm: 1}}, {gaussian: {...}}, median]: its stage
// names in order become aggregation.stages ("clip,gaussian"), their settings aggregation.<stage>.*.
void flatten_stages(const YAML::Node& list, const std::string& source, const ConfigOrigin& where,
                    std::vector<Config::Written>& out, std::unordered_map<std::string, ConfigOrigin>& seen) {
  std::string stages;
  for (const YAML::Node& item : list) {
    const ConfigOrigin at = origin_of(source, item.Mark());
    std::string stage;
    if (item.IsScalar()) {
      stage = item.Scalar();
    } else {
      FAX_CHECK(item.IsMap() && item.size() == 1,
                "{}: an aggregation stage is a name or a mapping of one name to its settings, e.g. {{clip: {{norm: 1.0}}}}",
                at.str());
      const auto entry = *item.begin();
      FAX_CHECK(entry.first.IsScalar(), "{}: a stage's name must be a plain name", at.str());
      stage = entry.first.Scalar();
      FAX_CHECK(entry.second.IsMap() || entry.second.IsNull(),
                "{}: the settings of aggregation stage '{}' are a mapping of keys to values", at.str(), stage);
      if (entry.second.IsMap()) flatten(entry.second, "aggregation." + stage, source, out, seen);
    }
    FAX_CHECK(!stage.empty() && stage.find_first_of(",. ") == std::string::npos,
              "{}: '{}' is not an aggregation stage name", at.str(), stage);
    stages += (stages.empty() ? "" : ",") + stage;
  }
  const auto [first, inserted] = seen.emplace("aggregation.stages", where);
  FAX_CHECK(inserted, "{}: duplicate key 'aggregation.stages' (first set at {})", where.str(), first->second.str());
  out.push_back({"aggregation.stages", stages, where, where});
}

// Flattens a YAML map into dotted names, rejecting what the schema cannot hold. `seen` maps each
// name to where it was set, so a duplicate is found in constant time.
void flatten(const YAML::Node& node, const std::string& prefix, const std::string& source,
             std::vector<Config::Written>& out, std::unordered_map<std::string, ConfigOrigin>& seen) {
  for (const auto& item : node) {
    FAX_CHECK(item.first.IsScalar(), "{}: a key must be a plain name, not a list or a mapping",
              origin_of(source, item.first.Mark()).str());
    const std::string key = item.first.Scalar();
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    const ConfigOrigin where = origin_of(source, item.first.Mark());
    const auto [first, inserted] = seen.emplace(name, where);
    FAX_CHECK(inserted, "{}: duplicate key '{}' (first set at {})", where.str(), name, first->second.str());
    const YAML::Node& value = item.second;
    if (value.IsMap()) {
      flatten(value, name, source, out, seen);
    } else if (value.IsScalar()) {
      out.push_back({name, value.Scalar(), origin_of(source, value.Mark()), where});
    } else if (value.IsNull()) {
      throw Error(fmt::format("{}: key '{}' has no value", where.str(), name));
    } else if (name == "aggregation") {
      flatten_stages(value, source, where, out, seen);
    } else {
      throw Error(fmt::format("{}: key '{}' holds a list; it takes a single value", where.str(), name));
    }
  }
}

// Nested sections in first-appearance order, for emitting dotted keys as YAML maps.
struct Section {
  std::string value;
  std::vector<std::pair<std::string, Section>> children;

  Section& child(const std::string& name) {
    for (auto& [key, section] : children)
      if (key == name) return section;
    children.emplace_back(name, Section{});
    return children.back().second;
  }

  void emit(YAML::Emitter& out) const {
    out << YAML::BeginMap;
    for (const auto& [key, section] : children) {
      out << YAML::Key << key << YAML::Value;
      if (section.children.empty()) out << section.value;
      else section.emit(out);
    }
    out << YAML::EndMap;
  }
};

}  // namespace

Config parse_config(const std::string& text, const std::string& source) {
  YAML::Node root = load_yaml(text, source);
  if (root.IsNull()) return Config();
  FAX_CHECK(root.IsMap(), "{}: an experiment is a YAML mapping of keys to values", origin_of(source, root.Mark()).str());
  // The sweep: and expect: sections describe trials and results, not settings; fax-run sweep and
  // run --check read them (fax/tools/sweep.h, expect.h).
  root.remove("sweep");
  root.remove("expect");
  std::vector<Config::Written> flat;
  std::unordered_map<std::string, ConfigOrigin> seen;
  flatten(root, "", source, flat, seen);
  return Config::from_written(std::move(flat));
}

std::string read_experiment_file(const std::string& path) {
  return read_regular_file(path, size_t{16} << 20, "the experiment file");
}

Config load_config(const std::string& path) { return parse_config(read_experiment_file(path), path); }

void apply_override(Config& config, const std::string& assignment) {
  const auto eq = assignment.find('=');
  FAX_CHECK(eq != std::string::npos && eq > 0, "--set {}: expected dotted.key=value", assignment);
  const ConfigOrigin where{"--set " + assignment, 0, 0};
  const YAML::Node value = load_yaml(assignment.substr(eq + 1), where.str());
  FAX_CHECK(value.IsScalar(), "{}: the value must be a single scalar", where.str());
  config.set(assignment.substr(0, eq), value.Scalar(), where);
}

std::string config_to_yaml(const Config& config) {
  Section root;
  for (const auto& [name, value] : config.settings()) {
    Section* node = &root;
    size_t start = 0;
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', start)) {
      node = &node->child(name.substr(start, dot - start));
      start = dot + 1;
    }
    node->child(name.substr(start)).value = value;
  }
  YAML::Emitter out;
  root.emit(out);
  return std::string(out.c_str()) + "\n";
}

}  // namespace fax
