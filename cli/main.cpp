// fax-run: run federated experiments from YAML, sweep and plot them, list algorithm plugins, inspect run logs.
// Exit codes: 0 success, 2 a user error (bad input, reported as one line on stderr), 1 an
// internal failure.

#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>
#include <torch/version.h>

#include <fax/error.h>
#include <fax/version.h>

#include "commands.h"

namespace {

constexpr int kUserError = 2;
constexpr int kInternalError = 1;

void add_plugin_dir_option(CLI::App& app, std::vector<std::string>& dirs) {
  app.add_option("--plugin-dir", dirs,
                 "directory searched first for algorithm plugins (fax_<name>.so); repeatable. Then "
                 "FAX_PLUGIN_PATH (colon-separated), then <prefix>/lib/fax/plugins")
      ->type_name("DIR");
}

void add_token_option(CLI::App& app, std::string& file) {
  app.add_option("--token-file", file,
                 "file whose first line is the shared token of coordinator and workers (default: $FAX_TOKEN)")
      ->type_name("FILE");
}

const char* const kRemoteGroup = "Remote workers";

// What a coordinator needs besides its workers and address (run, resume and launch).
void add_coordinator_options(CLI::App& app, fax::cli::RemoteFlags& remote) {
  const std::string group = kRemoteGroup;
  add_token_option(app, remote.token_file);
  app.get_option("--token-file")->group(group);
  app.add_option("--worker-timeout", remote.timeout_s,
                 "seconds without a heartbeat after which a worker is dropped and its shards re-run (default: 30)")
      ->check(CLI::Range(0.5, 86400.0))->type_name("S")->group(group);
  app.add_option("--handshake-timeout", remote.handshake_s,
                 "seconds a new connection has to authenticate before it is closed (default: 10)")
      ->check(CLI::Range(0.1, 3600.0))->type_name("S")->group(group);
  app.add_option("--collectives", remote.collectives,
                 "where allreduces go: 'tensorpipe' (through the coordinator; default) or 'gloo' (between the "
                 "workers, LibTorch's ProcessGroupGloo: for large models). Same results either way")
      ->check(CLI::IsMember({"tensorpipe", "gloo"}))->type_name("BACKEND")->group(group);
}

void add_remote_options(CLI::App& app, fax::cli::RemoteFlags& remote) {
  app.add_option("--workers", remote.workers,
                 "run on N 'fax-run worker' processes instead of local threads; waits for N before round 1")
      ->check(CLI::Range(1, 4096))->type_name("N")->group(kRemoteGroup);
  app.add_option("--listen", remote.listen, "address the coordinator listens on (default: 127.0.0.1:29500)")
      ->type_name("HOST:PORT")->group(kRemoteGroup);
  add_coordinator_options(app, remote);
}

// The experiment and how to log it (run and launch).
CLI::App* add_run_command(CLI::App& app, const std::string& name, const std::string& description,
                          fax::cli::RunOptions& run) {
  CLI::App* cmd = app.add_subcommand(name, description);
  cmd->add_option("experiment", run.experiment, "the experiment, a YAML file")->required()->type_name("EXPERIMENT.yaml");
  cmd->add_option("--set", run.overrides, "override a setting, e.g. --set algorithm.client_lr=0.05; repeatable")
      ->type_name("KEY=VALUE");
  cmd->add_option("-o,--output", run.output, "the HDF5 run log to write (default: <experiment name>.h5)")
      ->type_name("RUN.h5");
  add_plugin_dir_option(*cmd, run.plugin_dirs);
  cmd->add_flag("-q,--quiet", run.quiet, "no progress output");
  cmd->add_flag("--force", run.force,
                "run although the resource estimate exceeds this machine (recorded in the log)");
  return cmd;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fax-run: federated learning experiments on LibTorch"};
  app.set_version_flag("--version", fmt::format("fax-run {} (LibTorch {})", FAX_VERSION, TORCH_VERSION));
  app.require_subcommand(1);

  fax::cli::RunOptions run;
  CLI::App* run_cmd = add_run_command(app, "run", "run an experiment and log it to HDF5", run);
  run_cmd->add_flag("--dry-run", run.dry_run, "print the resolved settings and stop");
  add_remote_options(*run_cmd, run.remote);

  fax::cli::LaunchOptions launch;
  CLI::App* launch_cmd = add_run_command(
      app, "launch",
      "one command for every process of a launcher (torchrun --no-python, srun): rank 0 runs the experiment as "
      "coordinator, the other ranks are its workers (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; or SLURM_PROCID, "
      "SLURM_NTASKS)",
      launch.run);
  add_coordinator_options(*launch_cmd, launch.run.remote);
  launch_cmd->add_option("--connect-timeout", launch.connect_timeout_s,
                         "workers: seconds to keep trying to reach rank 0 (default: 60)")
      ->check(CLI::Range(0.1, 86400.0))->type_name("S")->group(kRemoteGroup);

  fax::cli::ResumeOptions resume;
  CLI::App* resume_cmd =
      app.add_subcommand("resume", "continue a run from its last checkpoint (after a crash, kill or Ctrl-C)");
  resume_cmd->add_option("run", resume.run, "the run log to continue")->required()->type_name("RUN.h5");
  add_plugin_dir_option(*resume_cmd, resume.plugin_dirs);
  resume_cmd->add_flag("-q,--quiet", resume.quiet, "no progress output");
  resume_cmd->add_flag("--force", resume.force,
                       "resume although the experiment now resolves differently (another plugin build, data set or "
                       "model) or the resource estimate exceeds this machine (recorded in the log)");
  add_remote_options(*resume_cmd, resume.remote);

  fax::cli::WorkerOptions worker;
  CLI::App* worker_cmd = app.add_subcommand(
      "worker", "serve a coordinator ('fax-run run ... --workers N'): run its rounds on this machine's share of the cohort");
  worker_cmd->add_option("--connect", worker.connect, "the coordinator's address")->required()->type_name("HOST:PORT");
  add_token_option(*worker_cmd, worker.token_file);
  add_plugin_dir_option(*worker_cmd, worker.plugin_dirs);
  worker_cmd->add_option("--connect-timeout", worker.connect_timeout_s,
                         "seconds to keep trying to reach the coordinator (default: 60)")
      ->check(CLI::Range(0.1, 86400.0))->type_name("S");
  worker_cmd->add_option("--name", worker.name, "this worker's name in the coordinator's log (default: host:pid)");
  worker_cmd->add_flag("-q,--quiet", worker.quiet, "no progress output");

  fax::cli::PluginsOptions plugins;
  CLI::App* plugins_cmd = app.add_subcommand("plugins", "list the algorithm plugins found, with versions and keys");
  add_plugin_dir_option(*plugins_cmd, plugins.plugin_dirs);
  plugins_cmd->add_option("--probe", plugins.probe)->group("");

  fax::cli::InspectOptions inspect;
  CLI::App* inspect_cmd =
      app.add_subcommand("inspect", "summarise a run log (settings, environment, metric sparklines, last rounds) or a sweep index");
  inspect_cmd->add_option("run", inspect.run, "a run log, or a sweep index (<dir>/sweep.h5)")->required()->type_name("RUN.h5");
  inspect_cmd->add_option("--last", inspect.last, "rounds to show")->check(CLI::PositiveNumber);

  fax::cli::SweepOptions sweep;
  CLI::App* sweep_cmd = app.add_subcommand(
      "sweep", "run the trials of an experiment's sweep: section (or --grid) in parallel; resumable; ranks the trials");
  sweep_cmd->add_option("experiment", sweep.experiment, "the experiment, a YAML file (with a sweep: section or --grid)")
      ->required()->type_name("EXPERIMENT.yaml");
  sweep_cmd->add_option("--grid", sweep.grid, "sweep a key over values, e.g. --grid algorithm.client_lr=0.01,0.1; repeatable")
      ->type_name("KEY=V1,V2,...");
  sweep_cmd->add_option("--set", sweep.overrides, "override a setting of every trial; repeatable")->type_name("KEY=VALUE");
  sweep_cmd->add_option("-o,--output", sweep.output,
                        "the sweep directory: a run log per trial and the index sweep.h5 (default: <experiment name>.sweep)")
      ->type_name("DIR");
  sweep_cmd->add_option("--executors", sweep.executors,
                        "executors for all trials at once (default: one per hardware thread); trials left on automatic "
                        "executors get one each")
      ->check(CLI::Range(1, 1024));
  sweep_cmd->add_option("--metric", sweep.metric, "rank trials by this metric (default: the sweep section's, else eval/accuracy)")
      ->type_name("NAME");
  sweep_cmd->add_option("--mode", sweep.mode, "max or min (default: min for a metric named *loss, else max)")
      ->check(CLI::IsMember({"max", "min"}));
  sweep_cmd->add_flag("--retry-failed", sweep.retry_failed, "when resuming, run failed trials again");
  sweep_cmd->add_flag("--dry-run", sweep.dry_run, "validate every trial, list them and stop");
  add_plugin_dir_option(*sweep_cmd, sweep.plugin_dirs);
  sweep_cmd->add_flag("-q,--quiet", sweep.quiet, "no progress output (the summary is still printed)");

  fax::cli::PlotOptions plot;
  CLI::App* plot_cmd = app.add_subcommand("plot", "draw a metric of run logs (or of a sweep's trials) as an SVG line chart");
  plot_cmd->add_option("runs", plot.runs, "run logs, or sweep indexes (<dir>/sweep.h5: every finished trial)")
      ->required()->type_name("FILE.h5...");
  plot_cmd->add_option("--metric", plot.metric, "the metric to draw (default: eval/accuracy)")->type_name("NAME");
  plot_cmd->add_option("-o,--output", plot.output, "the SVG file to write (default: plot.svg)")->type_name("OUT.svg");
  plot_cmd->add_option("--title", plot.title, "the chart's title (default: the metric)");
  plot_cmd->add_flag("--log-y", plot.log_y, "logarithmic y axis");
  plot_cmd->add_option("--width", plot.width, "plot width in pixels, without the legend")->check(CLI::Range(200, 10000));
  plot_cmd->add_option("--height", plot.height, "plot height in pixels")->check(CLI::Range(150, 10000));

  fax::cli::BenchOptions bench;
  CLI::App* bench_cmd = app.add_subcommand(
      "bench", "measure speed and memory against this machine's GEMM peak; print a table and write it to HDF5");
  bench_cmd->add_flag("--quick", bench.quick, "fewer timed rounds (the whole bench in a few minutes)");
  bench_cmd->add_option("--executors", bench.executors, "executor threads (default: one per hardware thread)")
      ->check(CLI::Range(1, 1024));
  bench_cmd->add_option("-o,--output", bench.output, "the HDF5 file to write (default: bench.h5)")->type_name("BENCH.h5");
  add_plugin_dir_option(*bench_cmd, bench.plugin_dirs);
  bench_cmd->add_option("--rss-probe", bench.rss_probe)->group("")->check(CLI::Range(1, 1 << 20));

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "fax-run: %s (see fax-run %s--help)\n", e.what(),
                 app.get_subcommands().empty() ? "" : (app.get_subcommands().front()->get_name() + " ").c_str());
    return kUserError;
  }

  try {
    if (run_cmd->parsed()) return fax::cli::run_command(run);
    if (resume_cmd->parsed()) return fax::cli::resume_command(resume);
    if (plugins_cmd->parsed()) return fax::cli::plugins_command(plugins);
    if (bench_cmd->parsed()) return fax::cli::bench_command(bench);
    if (sweep_cmd->parsed()) return fax::cli::sweep_command(sweep);
    if (plot_cmd->parsed()) return fax::cli::plot_command(plot);
    if (worker_cmd->parsed()) return fax::cli::worker_command(worker);
    if (launch_cmd->parsed()) return fax::cli::launch_command(launch);
    return fax::cli::inspect_command(inspect);
  } catch (const fax::Error& e) {
    std::fprintf(stderr, "fax-run: %s\n", e.what());
    return kUserError;
  } catch (...) {
    const std::exception_ptr error = std::current_exception();
    if (fax::detail::is_out_of_memory(error)) {
      // The run's size, not a bug: a clear line and the user-error code.
      std::fprintf(stderr, "fax-run: out of memory: %s; the run needs more memory than this host gives it (smaller "
                   "model widths, data.clients, algorithm.batch_size or execution.vectorize)\n",
                   fax::detail::describe(error).c_str());
      return kUserError;
    }
    std::fprintf(stderr, "fax-run: internal error: %s\n", fax::detail::describe(error).c_str());
    return kInternalError;
  }
}
