// Flags that several subcommands share.

#include "options.h"

#include <CLI/CLI.hpp>

namespace fax::cli {

const char* const kRemoteGroup = "Remote workers";

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

// What a coordinator needs besides its workers and address (run, resume and launch).
void add_coordinator_options(CLI::App& app, RemoteFlags& remote) {
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

void add_remote_options(CLI::App& app, RemoteFlags& remote) {
  app.add_option("--workers", remote.workers,
                 "run on N 'fax-run worker' processes instead of local threads; waits for N before round 1")
      ->check(CLI::Range(1, 4096))->type_name("N")->group(kRemoteGroup);
  app.add_option("--listen", remote.listen, "address the coordinator listens on (default: 127.0.0.1:29500)")
      ->type_name("HOST:PORT")->group(kRemoteGroup);
  add_coordinator_options(app, remote);
}

// The experiment and how to log it (run and launch).
CLI::App* add_run_command(CLI::App& app, const std::string& name, const std::string& description,
                          RunOptions& run) {
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

}  // namespace fax::cli
