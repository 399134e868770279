#pragma once

#include <cstdint>
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

struct BenchOptions {
  bool quick = false;
  int executors = 0;  ///< 0: one per hardware thread
  std::string output = "bench.h5";
  std::vector<std::string> plugin_dirs;
  int64_t rss_probe = 0;  ///< internal: run one case at this cohort size and print the peak RSS
};

int run_command(const RunOptions& options);
int bench_command(const BenchOptions& options);
int resume_command(const ResumeOptions& options);
int plugins_command(const PluginsOptions& options);
int inspect_command(const InspectOptions& options);

}  // namespace fax::cli
