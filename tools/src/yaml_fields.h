#pragma once

// Reading the scalar fields of the experiment sections fax-run's tools own (sweep:, expect:):
// checked, with errors that name the file, line, column and field.

#include <cmath>
#include <cstdint>
#include <string>

#include <yaml-cpp/yaml.h>

#include <fax/base/error.h>

namespace fax::detail {

inline std::string where(const std::string& source, const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  return fmt::format("{}:{}:{}", source, mark.line + 1, mark.column + 1);
}

/// A finite number; `what` names the field ("sweep repeats").
inline double number(const YAML::Node& node, const std::string& source, const std::string& what) {
  double v = 0;
  FAX_CHECK(node.IsScalar() && YAML::convert<double>::decode(node, v) && std::isfinite(v),
            "{}: {}: expected a number, got '{}'", where(source, node), what, node.IsScalar() ? node.Scalar() : "");
  return v;
}

/// A whole number in [low, high], checked before any conversion (a cast out of range is undefined).
inline int64_t integer(const YAML::Node& node, const std::string& source, const std::string& what, int64_t low,
                       int64_t high) {
  const double v = number(node, source, what);
  FAX_CHECK(v == std::floor(v) && v >= static_cast<double>(low) && v <= static_cast<double>(high),
            "{}: {} must be an integer in [{}, {}], got '{}'", where(source, node), what, low, high, node.Scalar());
  return static_cast<int64_t>(v);
}

}  // namespace fax::detail
