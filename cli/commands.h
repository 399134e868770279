#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <fax/runtime/remote.h>
#include <fax/tools/sweep.h>

#include "sweep_slurm.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fax::cli {

/// fax-run bench's measure of the data plane, a task `fax-run worker` serves besides the
/// experiment's: input "elements" and "repeats", that many allreduces of a float32 tensor of that
/// many elements per logical shard; an empty reply.
constexpr TaskKind kAllreduceProbe = static_cast<TaskKind>(100);
TensorTree allreduce_probe(Program& program, const TensorTree& input);

/// Remote executors for run and resume: the coordinator side.
struct RemoteFlags {
  int workers = 0;          ///< 0: local executor threads
  std::string listen;       ///< HOST:PORT; empty: 127.0.0.1:29500
  std::string token_file;   ///< empty: $FAX_TOKEN
  double timeout_s = 30;    ///< a worker silent this long is dropped
  double handshake_s = 10;  ///< a new connection that has not authenticated after this long is closed
  std::string collectives = "tensorpipe";  ///< where allreduces go: tensorpipe | gloo
  /// Told the address the coordinator listens on, before it waits for the workers (fax-run launch
  /// under torchrun publishes it in the launcher's store).
  std::function<void(const std::string& address)> on_listening;
  /// fax-run launch: the launcher starts every rank at once, so rank 0 waits at most this long for
  /// them all (a rank that died or was refused would hold the job until its time limit); 0: no limit.
  double join_timeout_s = 0;
};

struct RunOptions {
  std::string experiment;
  std::vector<std::string> overrides;
  std::string output;  ///< empty: <experiment stem>.h5
  std::vector<std::string> plugin_dirs;
  bool dry_run = false;
  bool quiet = false;
  bool force = false;  ///< run although a safety check refuses (recorded in the log)
  bool check = false;  ///< compare the finished run with the experiment's expect: section
  RemoteFlags remote;
};

struct ResumeOptions {
  std::string run;
  std::vector<std::string> plugin_dirs;
  bool quiet = false;
  bool force = false;  ///< resume although a safety check refuses (recorded in the log)
  RemoteFlags remote;
};

struct WorkerCommandOptions {
  std::string connect;
  std::string token_file;  ///< empty: $FAX_TOKEN
  std::vector<std::string> plugin_dirs;
  double connect_timeout_s = 60;
  std::string name;
  bool quiet = false;
};

struct LaunchOptions {
  RunOptions run;  ///< rank 0's run; remote.workers and remote.listen come from the environment
  double connect_timeout_s = 60;
};

struct PluginsOptions {
  std::vector<std::string> plugin_dirs;
  std::string probe;  ///< internal: load this one library and print its listing (run in a child)
};

struct InspectOptions {
  std::string run;
  int last = 10;
};

struct ExpectOptions {
  std::string run;
  std::vector<std::string> metrics{"eval/accuracy"};
  double tolerance = 0.005;
};

struct TableOptions {
  std::vector<std::string> inputs;  ///< a sweep directory or its sweep.h5; or run logs
  std::string rows, cols;
  std::vector<std::string> metrics;  ///< a sweep's: at most one (empty: the sweep's); run logs': the columns
  std::vector<std::string> where;    ///< a sweep's trials to keep, KEY=VALUE
  double scale = 1.0;
  bool minutes = false;  ///< a sweep's cells: its trials' wall time, not the metric
};

struct BenchOptions {
  bool quick = false;
  int executors = 0;  ///< 0: one per hardware thread
  std::string output = "bench.h5";
  std::vector<std::string> plugin_dirs;
  int64_t rss_probe = 0;  ///< internal: run one case at this cohort size and print the peak RSS
  std::string small_cohort_probe;  ///< internal: "mlp|cnn:threads", time the small-cohort case and print its round
};

struct SweepOptions {
  std::string experiment;
  std::string output;  ///< the sweep directory; empty: <experiment stem>.sweep
  std::vector<std::string> grid;
  std::vector<std::string> overrides;
  std::vector<std::string> plugin_dirs;
  int executors = 0;  ///< the budget of executors for all trials at once; 0: one per hardware thread
  std::string metric;  ///< empty: the sweep section's (default eval/accuracy)
  std::string mode;    ///< empty: the sweep section's, else max / min
  bool retry_failed = false;
  bool dry_run = false;
  bool quiet = false;
  std::string launcher = "local";  ///< local: child processes; slurm: one job array
  SlurmSettings slurm;
};

struct PlotOptions {
  std::vector<std::string> runs;  ///< run logs and sweep indexes
  std::string metric = "eval/accuracy";
  std::string x = "round";  ///< round, or time: the simulated time (time/simulated_s)
  std::string output = "plot.svg";
  std::string title;
  bool log_y = false;
  int width = 800;
  int height = 480;
};

int run_command(const RunOptions& options);
int bench_command(const BenchOptions& options);
int resume_command(const ResumeOptions& options);
int plugins_command(const PluginsOptions& options);
int inspect_command(const InspectOptions& options);
int expect_command(const ExpectOptions& options);
int table_command(const TableOptions& options);
int sweep_command(const SweepOptions& options);
int plot_command(const PlotOptions& options);
int worker_command(const WorkerCommandOptions& options);
int launch_command(const LaunchOptions& options);

/// The shared token of coordinator and workers: the first line of `file`, else $FAX_TOKEN.
std::string read_token(const std::string& file);

/// The best trial, the settings ranked by their mean over seeds (at most `top`), failed trials.
void print_sweep_summary(const SweepIndex& index, const std::string& path, size_t top);

/// A subcommand of fax-run as registered: its parser and what runs it once parsed.
struct Subcommand {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// Each subcommand's file registers it, with its own flags, on fax-run's parser.
Subcommand add_run_subcommand(CLI::App& app);
Subcommand add_launch_subcommand(CLI::App& app);
Subcommand add_resume_subcommand(CLI::App& app);
Subcommand add_worker_subcommand(CLI::App& app);
Subcommand add_plugins_subcommand(CLI::App& app);
Subcommand add_inspect_subcommand(CLI::App& app);
Subcommand add_expect_subcommand(CLI::App& app);
Subcommand add_privacy_subcommand(CLI::App& app);
Subcommand add_table_subcommand(CLI::App& app);
Subcommand add_sweep_subcommand(CLI::App& app);
Subcommand add_plot_subcommand(CLI::App& app);
Subcommand add_bench_subcommand(CLI::App& app);

}  // namespace fax::cli
