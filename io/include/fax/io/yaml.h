#pragma once

// The one way fax parses YAML text (experiments, --set values, sweep sections), with the limits a
// hostile file needs.

#include <string>

#include <yaml-cpp/yaml.h>

namespace fax {

/// At most this many nodes, counting each use of an alias as a copy of what it names: an
/// experiment is a few hundred; a "billion laughs" file of a few lines would expand to 10^9.
constexpr size_t kMaxYamlNodes = 100000;

/// Parses `text` as one YAML document. fax::Error naming `source` (and line:column where known) on
/// a syntax error, nesting deeper than yaml-cpp allows, more than one document ("---"), or more
/// than kMaxYamlNodes nodes once aliases are expanded. Empty text is a null node.
YAML::Node load_yaml(const std::string& text, const std::string& source);

}  // namespace fax
