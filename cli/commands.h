#pragma once

#include <string>
#include <vector>

namespace fax::cli {

struct RunOptions {
  std::string experiment;
  std::vector<std::string> overrides;
  std::string output;  ///< empty: <experiment stem>.h5
  std::vector<std::string> plugin_dirs;
  bool dry_run = false;
  bool quiet = false;
};

struct ResumeOptions {
  std::string run;
  std::vector<std::string> plugin_dirs;
  bool quiet = false;
};

struct PluginsOptions {
  std::vector<std::string> plugin_dirs;
};

struct InspectOptions {
  std::string run;
  int last = 10;
};

int run_command(const RunOptions& options);
int resume_command(const ResumeOptions& options);
int plugins_command(const PluginsOptions& options);
int inspect_command(const InspectOptions& options);

}  // namespace fax::cli
