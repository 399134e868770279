// fax-run launch: the same command line on every process of a launcher; rank 0 coordinates.

#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>

#include <fax/base/error.h>
#include <fax/runtime/remote.h>

#include "commands.h"
#include "options.h"

namespace fax::cli {
namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

int env_int(const char* name, const std::string& value, int min) {
  const bool digits = !value.empty() && value.size() <= 9 && value.find_first_not_of("0123456789") == std::string::npos;
  FAX_CHECK(digits && std::stoi(value) >= min, "{}='{}' is not an integer >= {}", name, value, min);
  return std::stoi(value);
}

// This process's place in the launch: torchrun's variables, else Slurm's.
struct Launch {
  int rank = 0;
  int size = 1;
  std::string address;  // HOST:PORT of rank 0
  // torchrun's agent listens on MASTER_PORT with its store (TORCHELASTIC_USE_AGENT_STORE): rank 0
  // then listens on a free port of MASTER_ADDR and publishes it under `store_key`.
  bool agent_store = false;
  std::string host;
  int port = 0;
  std::string store_key;
};

Launch launch_from_environment() {
  Launch l;
  const char* rank_var = "RANK";
  const char* size_var = "WORLD_SIZE";
  if (!env(rank_var) && env("SLURM_PROCID")) {
    rank_var = "SLURM_PROCID";
    size_var = "SLURM_NTASKS";
  }
  const auto rank = env(rank_var), size = env(size_var);
  FAX_CHECK(rank && size,
            "fax-run launch needs a launcher's environment: RANK and WORLD_SIZE (torchrun) or SLURM_PROCID and "
            "SLURM_NTASKS (srun); use 'fax-run run' and 'fax-run worker' otherwise");
  l.rank = env_int(rank_var, *rank, 0);
  l.size = env_int(size_var, *size, 1);
  FAX_CHECK(l.rank < l.size, "{}={} is not below {}={}", rank_var, l.rank, size_var, l.size);
  // Under Slurm without MASTER_ADDR, rank 0 is assumed on the node srun was started from.
  const auto host = env("MASTER_ADDR") ? env("MASTER_ADDR") : env("SLURM_LAUNCH_NODE_IPADDR");
  FAX_CHECK(host || l.size == 1,
            "MASTER_ADDR is not set: export the address of rank 0's host (under Slurm: export MASTER_ADDR=$(scontrol "
            "show hostnames \"$SLURM_JOB_NODELIST\" | head -n1))");
  const std::string port = env("MASTER_PORT").value_or("29500");
  l.port = env_int("MASTER_PORT", port, 1);
  FAX_CHECK(l.port <= 65535, "MASTER_PORT={} is not a TCP port", l.port);
  if (!host) return l;
  l.host = *host;
  l.address = l.host + ":" + port;
  l.agent_store = env("TORCHELASTIC_USE_AGENT_STORE") == std::optional<std::string>("True") && l.size > 1;
  if (l.agent_store) {
    // A restarted group (torchrun --max-restarts) must not read the last attempt's address.
    l.store_key = fmt::format("fax/launch/{}/coordinator", env("TORCHELASTIC_RESTART_COUNT").value_or("0"));
    l.address = l.host + ":0";
  }
  return l;
}

std::string host_name() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) return "unknown";
  return host;
}

}  // namespace

int launch_command(const LaunchOptions& options) {
  const Launch l = launch_from_environment();
  if (l.rank == 0) {
    RunOptions run = options.run;
    run.remote.workers = l.size - 1;
    if (l.size > 1) run.remote.listen = l.address;
    run.remote.join_timeout_s = options.connect_timeout_s;
    if (l.agent_store) {
      run.remote.on_listening = [l, timeout = options.connect_timeout_s](const std::string& address) {
        launcher_store_set(l.host, l.port, l.store_key, address, timeout);
      };
    }
    return run_command(run);
  }
  WorkerCommandOptions worker;
  worker.connect =
      l.agent_store ? launcher_store_get(l.host, l.port, l.store_key, options.connect_timeout_s) : l.address;
  worker.token_file = options.run.remote.token_file;
  worker.plugin_dirs = options.run.plugin_dirs;
  worker.connect_timeout_s = options.connect_timeout_s;
  worker.name = fmt::format("rank {} on {}", l.rank, host_name());
  worker.quiet = options.run.quiet;
  return worker_command(worker);
}

Subcommand add_launch_subcommand(CLI::App& app) {
  auto o = std::make_shared<LaunchOptions>();
  CLI::App* cmd = add_run_command(
      app, "launch",
      "one command for every process of a launcher (torchrun --no-python, srun): rank 0 runs the experiment as "
      "coordinator, the other ranks are its workers (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; or SLURM_PROCID, "
      "SLURM_NTASKS)",
      o->run);
  add_coordinator_options(*cmd, o->run.remote);
  cmd->add_option("--connect-timeout", o->connect_timeout_s,
                  "seconds the workers keep trying to reach rank 0, and rank 0 waits for every rank to join "
                  "(default: 60)")
      ->check(CLI::Range(0.1, 86400.0))->type_name("S")->group(kRemoteGroup);
  return {cmd, [o] { return launch_command(*o); }};
}

}  // namespace fax::cli
