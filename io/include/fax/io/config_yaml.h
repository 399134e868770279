#pragma once

// Experiments as YAML: reading a file or text into a fax::Config, --set overrides, and the
// resolved settings written back as YAML (the run log's /config).

#include <string>

#include <fax/base/config.h>

namespace fax {

/// Parses YAML text. `source` names it in errors (the file path). A top-level sweep: section
/// is skipped: it belongs to fax-run sweep (fax/tools/sweep.h).
Config parse_config(const std::string& text, const std::string& source);

/// The experiment file at `path`, parsed.
Config load_config(const std::string& path);

/// The text of the experiment file at `path` (fax::Error naming it when it cannot be read).
std::string read_experiment_file(const std::string& path);

/// Applies one "dotted.key=value" override (the value is a YAML scalar); later settings win.
void apply_override(Config& config, const std::string& assignment);

/// The settings as nested YAML, in their order (schema order once resolved).
std::string config_to_yaml(const Config& config);

}  // namespace fax
