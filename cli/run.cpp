#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <fax/base/error.h>
#include <fax/base/interrupt.h>
#include <fax/io/config_yaml.h>
#include <fax/io/files.h>
#include <fax/io/run_log.h>
#include <fax/runtime/coordinator.h>
#include <fax/runtime/experiment.h>
#include <fax/runtime/resources.h>
#include <fax/tools/expect.h>
#include <fax/tools/sweep.h>

#include "commands.h"
#include "options.h"
#include "setup.h"

namespace fax::cli {
namespace {

std::string format_metrics(const Metrics& metrics) {
  std::string out;
  for (const auto& [name, value] : metrics) {
    // Wall times vary; the simulated time is part of the result.
    if ((name.rfind("time/", 0) == 0 && name != "time/simulated_s") || std::isnan(value)) continue;
    out += fmt::format("  {} {:.4f}", name, value);
  }
  return out;
}

std::string format_seconds(double s) {
  if (s < 60) return fmt::format("{:.1f}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  return fmt::format("{}h{:02d}m", static_cast<int>(s / 3600), static_cast<int>(s / 60) % 60);
}

// A progress line per round: rewritten in place on a terminal, a plain line every K rounds (and
// the last) otherwise. Evaluation metrics stay on the line until the next evaluation.
class ProgressPrinter {
 public:
  ProgressPrinter(int64_t every, bool quiet) : every_(every), quiet_(quiet), tty_(isatty(STDOUT_FILENO) != 0) {}

  void operator()(const RoundReport& r) {
    Metrics shown;
    for (const auto& m : r.metrics) {
      if (m.first.rfind("eval/", 0) == 0) continue;
      shown.push_back(m);
    }
    bool evaluated = false;
    for (const auto& m : r.metrics) {
      if (m.first.rfind("eval/", 0) != 0) continue;
      if (!evaluated) last_eval_.clear();
      evaluated = true;
      last_eval_.push_back(m);
    }
    for (const auto& m : last_eval_) shown.push_back(m);
    if (quiet_) return;
    const std::string line = fmt::format("round {}/{}  {}  ETA {}  {:.0f} clients/s{}", r.round, r.rounds,
                                         format_seconds(r.elapsed_s), format_seconds(r.eta_s), r.clients_per_s,
                                         format_metrics(shown));
    if (tty_) {
      std::printf("\r\033[K%s%s", line.c_str(), r.round == r.rounds ? "\n" : "");
    } else if (r.round % every_ == 0 || r.round == r.rounds || r.round == 1) {
      std::printf("%s\n", line.c_str());
    }
    std::fflush(stdout);
  }

 private:
  int64_t every_;
  bool quiet_;
  bool tty_;
  Metrics last_eval_;
};

// SIGINT / SIGTERM ask the run to stop after the current round; a second one kills it outright.
std::atomic<int> stop_signal{0};

void on_stop_signal(int signal) {
  if (stop_signal.exchange(signal) != 0) {
    std::signal(signal, SIG_DFL);
    std::raise(signal);
  }
  // The round in flight stops at its next local step, chunk or evaluation batch.
  request_interrupt();
}

class StopSignals {
 public:
  StopSignals() {
    stop_signal = 0;
    clear_interrupt();
    previous_int_ = std::signal(SIGINT, on_stop_signal);
    previous_term_ = std::signal(SIGTERM, on_stop_signal);
  }
  ~StopSignals() {
    std::signal(SIGINT, previous_int_);
    std::signal(SIGTERM, previous_term_);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  void (*previous_int_)(int);
  void (*previous_term_)(int);
};

constexpr const char* kDefaultListen = "127.0.0.1:29500";

// The coordinator of remote workers, once they are all ready; none for a local run.
std::unique_ptr<Coordinator> start_coordinator(const RemoteFlags& remote, const Config& config, std::string identity,
                                               bool quiet) {
  if (remote.workers == 0) {
    FAX_CHECK(remote.listen.empty(), "--listen needs --workers N (the workers to wait for)");
    FAX_CHECK(remote.collectives == "tensorpipe", "--collectives needs --workers N (local executors share memory)");
    return nullptr;
  }
  CoordinatorOptions o;
  o.listen = remote.listen.empty() ? kDefaultListen : remote.listen;
  o.workers = remote.workers;
  o.token = read_token(remote.token_file);
  o.timeout_s = remote.timeout_s;
  o.heartbeat_s = std::min(1.0, remote.timeout_s / 4);
  o.handshake_s = remote.handshake_s;
  o.collectives = remote.collectives == "gloo" ? Collectives::gloo : Collectives::tensorpipe;
  o.experiment = config_to_yaml(config);
  o.flush_denormals = config.get_bool("execution.flush_denormals");
  o.identity = std::move(identity);
  if (!quiet) {
    o.log = [](const std::string& line) {
      std::printf("remote: %s\n", line.c_str());
      std::fflush(stdout);
    };
  }
  auto coordinator = std::make_unique<Coordinator>(std::move(o));
  if (!quiet) {
    std::printf("remote: listening on %s; start workers with: fax-run worker --connect %s (same token); "
                "allreduces: %s\n",
                coordinator->address().c_str(), coordinator->address().c_str(), remote.collectives.c_str());
    std::fflush(stdout);
  }
  if (remote.on_listening) remote.on_listening(coordinator->address());
  const auto start = std::chrono::steady_clock::now();
  auto late = [&] {
    return remote.join_timeout_s > 0 &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > remote.join_timeout_s;
  };
  try {
    coordinator->wait_for_workers([&] { return stop_signal.load() != 0 || late(); });
  } catch (const Error& e) {
    if (stop_signal.load() != 0 || !late()) throw;
    throw Error(fmt::format("not every rank joined within {} s ({}): a rank failed before it connected, or was "
                            "refused (see its output and the lines above)",
                            remote.join_timeout_s, e.what()));
  }
  return coordinator;
}

// A resumed run must resolve to what its log recorded when it started (the same plugin build, data
// set and model), or it would not continue the same run: refused unless forced. Returns whether
// the identity differs (and was forced).
bool changed_identity(const std::string& log, const std::string& recorded, const std::string& now, bool force,
                      bool quiet) {
  if (recorded.empty()) {
    if (!quiet) std::printf("note: %s records no experiment identity (an older fax wrote it); not compared\n", log.c_str());
    return false;
  }
  if (recorded == now) return false;
  FAX_CHECK(force,
            "{}: the experiment resolves differently than when the run started: the log has {}; this host has {} "
            "(another plugin build, data set or model would not continue the same run; --force resumes anyway and "
            "records it in the log)",
            log, recorded, now);
  warn(fmt::format("{}: resuming with another experiment identity (--force): {}", log, now));
  return true;
}

// Runs (or continues) an experiment into the run log at `output`, which the caller has locked.
int execute(const ExperimentSetup& setup, const std::string& source, const std::string& output, bool quiet,
            bool resume, bool force, const RemoteFlags& remote) {
  const Config& config = setup.config;
  // Sizes are checked before anything large is allocated: the data set's before it is loaded, the
  // model's and local training's before the first parameters exist.
  const MachineResources machine = MachineResources::of_this_host();
  const bool on_workers = remote.workers > 0;
  const int64_t data_bytes = setup.dataset->estimate_bytes ? setup.dataset->estimate_bytes(config) : 0;
  if (!force) check_resources(estimate_resources(config, data_bytes, nullptr, on_workers), machine, false);
  const auto data = setup.dataset->create(config);
  const auto model = setup.model->create(config, model_shape(*data));
  const std::string forced_resources =
      check_resources(estimate_resources(config, data_bytes, model.get(), on_workers), machine, force);
  // Every run ends with an evaluation: an empty test split would fail it after all the rounds.
  FAX_CHECK(data->test().size() > 0, "{}: {} has no test examples to evaluate on", config.origin("data.name").str(),
            data->describe());
  auto algorithm = setup.plugin->create();
  const std::string identity = run_identity(setup, *data, *model);
  // A resume checks the log and its last checkpoint before anything starts or is written.
  std::optional<ResumePoint> point;
  int64_t after = 0;
  bool forced = false;
  if (resume) {
    const RunLogReader reader(output);
    const auto checkpoints = reader.checkpoint_rounds();
    after = checkpoints.empty() ? 0 : checkpoints.back();
    if (after > 0) point = resume_point(after, reader.checkpoint(after));
    forced = changed_identity(output, reader.env("identity"), identity, force, quiet);
  }
  // Checked here, before any worker is waited for (the experiment that runs needs them).
  if (point)
    Experiment(config, *algorithm, *model, *data).check_resume(*point,
                                                               fmt::format("{}: the checkpoint of round {}", output, after));
  const StopSignals signals;
  const std::unique_ptr<Coordinator> coordinator =
      start_coordinator(remote, config, experiment_identity(setup, *data, *model), quiet);
  Experiment experiment(config, *algorithm, *model, *data, coordinator.get());

  std::optional<RunLog> log;
  if (resume) {
    log.emplace(RunLog::resume(output, after));
    if (forced) log->set_env(fmt::format("forced_resume_after_round_{}", after), identity);
  } else {
    StringPairs env = experiment.environment();
    env.emplace_back("experiment", source);
    env.emplace_back("algorithm", setup.plugin->name);
    env.emplace_back("algorithm_plugin", setup.plugin->path);
    if (setup.model_plugin) env.emplace_back("model_plugin", setup.model_plugin->path);
    if (setup.dataset_plugin) env.emplace_back("data_plugin", setup.dataset_plugin->path);
    env.emplace_back("identity", identity);
    log.emplace(output, config_to_yaml(config), env);
  }
  if (!forced_resources.empty()) log->set_env("forced_resources", forced_resources);
  const int64_t rounds = config.get_int("rounds");
  const int64_t first = point ? point->round : 0;
  if (first >= rounds) {
    if (!quiet) std::printf("%s: all %lld rounds are done; nothing to resume\n", output.c_str(), static_cast<long long>(rounds));
    return 0;
  }

  const MeshOptions& mesh = experiment.mesh_options();
  if (!quiet) {
    std::printf("fax-run %s: %s%s\n  data: %s\n  model: %s\n  algorithm: %s (%s)\n  mesh: %d %sexecutors x %d threads, "
                "%lld logical shards; cohort %lld of %lld clients%s; %lld rounds\n  log: %s\n",
                FAX_VERSION, source.c_str(),
                resume ? fmt::format(" (resuming after round {})", first).c_str() : "",
                (data->describe() + (setup.dataset_plugin ? " (" + setup.dataset_plugin->path + ")" : "")).c_str(),
                (model->describe() + (setup.model_plugin ? " (" + setup.model_plugin->path + ")" : "")).c_str(),
                setup.plugin->name.c_str(), setup.plugin->path.c_str(), mesh.executors,
                coordinator ? "remote " : "", mesh.threads_per_executor, static_cast<long long>(mesh.logical_shards),
                static_cast<long long>(config.get_int("cohort.size")), static_cast<long long>(data->num_clients()),
                sampling(config) == Sampling::poisson ? " on average (Poisson sampling)" : "",
                static_cast<long long>(rounds), output.c_str());
    if (experiment.clock() != nullptr) std::printf("  clock: %s\n", experiment.clock()->describe().c_str());
    std::fflush(stdout);
  }
  ProgressPrinter progress(config.get_int("logging.progress_every"), quiet);
  const RunResult result = experiment.run(&*log, std::ref(progress), point ? &*point : nullptr,
                                          [] { return stop_signal.load() != 0; });
  if (result.stopped) {
    if (result.rounds_done == 0) {
      // Nothing to checkpoint: no round was completed, here or before.
      std::fprintf(stderr, "fax-run: stopped by signal %d in round 1 of %lld; no round was completed%s\n",
                   stop_signal.load(), static_cast<long long>(rounds),
                   log->deferred() ? fmt::format(" ({} is unchanged)", output).c_str()
                                   : "; nothing to resume: run it again");
    } else {
      std::fprintf(stderr, "fax-run: stopped by signal %d after round %lld of %lld; the state is checkpointed: "
                           "continue with 'fax-run resume %s'\n",
                   stop_signal.load(), static_cast<long long>(result.rounds_done), static_cast<long long>(rounds),
                   output.c_str());
    }
    return 128 + stop_signal.load();
  }
  if (!quiet) {
    std::printf("done: %lld rounds in %s;%s\n  log: %s\n", static_cast<long long>(rounds),
                format_seconds(result.seconds).c_str(), format_metrics(result.last).c_str(), output.c_str());
  }
  return 0;
}

// What a run reads, which its log must not overwrite: the experiment, the data files, the plugins,
// a TorchScript model's file.
std::vector<std::string> experiment_inputs(const ExperimentSetup& setup, const std::string& experiment) {
  std::vector<std::string> inputs{experiment, setup.plugin->path};
  if (setup.model_plugin) inputs.push_back(setup.model_plugin->path);
  if (setup.dataset_plugin) inputs.push_back(setup.dataset_plugin->path);
  for (const char* key : {"data.path", "data.test_path", "model.path", "clients.trace.device", "clients.trace.availability"})
    if (setup.config.has(key) && !setup.config.get_string(key).empty()) inputs.push_back(setup.config.get_string(key));
  return inputs;
}

// The partition a dry run describes: clients, their sizes and their labels (min / median / max).
void print_partition_summary(const FederatedDataset& data) {
  std::vector<int64_t> sizes, labels;
  for (int64_t i = 0; i < data.num_clients(); ++i) {
    const Examples ex = data.client(i);
    sizes.push_back(ex.size());
    labels.push_back(std::get<0>(at::_unique(ex.y.flatten())).numel());
  }
  const auto spread = [](std::vector<int64_t> v) {
    std::sort(v.begin(), v.end());
    return fmt::format("{} / {} / {}", v.front(), v[v.size() / 2], v.back());
  };
  std::printf("# data: %s\n# clients: %lld; examples per client (min / median / max): %s; labels per client: %s; "
              "test examples: %lld\n",
              data.describe().c_str(), static_cast<long long>(data.num_clients()), spread(sizes).c_str(),
              spread(labels).c_str(), static_cast<long long>(data.test().size()));
}

}  // namespace

// The run log at `output` against the experiment's expected results: a line per result, then exit
// status 1 with one line naming every miss.
int check_run(const ExpectSpec& expect, const std::string& output, bool quiet) {
  std::vector<std::string> missed;
  for (const CheckResult& r : check_expectations(expect, RunLogReader(output))) {
    if (!quiet) std::printf("check: %s: %s\n", r.text.c_str(), r.ok ? "ok" : "MISSED");
    if (!r.ok) missed.push_back(r.text);
  }
  std::fflush(stdout);
  if (missed.empty()) return 0;
  std::fprintf(stderr, "fax-run: %s: check failed: %s (expected results recorded on %s)\n", output.c_str(),
               fmt::format("{}", fmt::join(missed, "; ")).c_str(), expect.recorded_on.c_str());
  return 1;
}

int run_command(const RunOptions& options) {
  const PluginLoader loader(options.plugin_dirs);
  const ExperimentSetup setup = load_experiment(options.experiment, options.overrides, loader);
  // Read (and so checked) on every run: a malformed expect: section fails before anything runs.
  const ExpectSpec expect = ExpectSpec::from_file(options.experiment);
  FAX_CHECK(!options.check || !expect.empty(),
            "{}: --check compares the run with the experiment's expect: section, and it has none", options.experiment);
  if (options.dry_run) {
    std::printf("# fax-run %s: resolved settings of %s (algorithm plugin: %s)\n%s", FAX_VERSION,
                options.experiment.c_str(), setup.plugin->path.c_str(), config_to_yaml(setup.config).c_str());
    std::fflush(stdout);
    print_partition_summary(*setup.dataset->create(setup.config));
    return 0;
  }
  if (!options.quiet && !SweepSpec::from_file(options.experiment).empty()) {
    std::printf("note: %s has a sweep: section; 'fax-run run' runs the experiment as written, 'fax-run sweep' its trials\n",
                options.experiment.c_str());
  }
  const std::string output = resolve_output(options.output.empty()
                                                ? std::filesystem::path(options.experiment).stem().string() + ".h5"
                                                : options.output);
  std::vector<std::string> inputs = experiment_inputs(setup, options.experiment);
  inputs.push_back(options.remote.token_file);
  check_output_path(output, inputs, "the run log");
  const FileLock lock(output, "fax-run run " + options.experiment);
  check_replaceable_run_log(output);
  const int status = execute(setup, options.experiment, output, options.quiet, false, options.force, options.remote);
  return status == 0 && options.check ? check_run(expect, output, options.quiet) : status;
}

int resume_command(const ResumeOptions& options) {
  const std::string run = resolve_output(options.run);
  check_output_path(run, {options.remote.token_file}, "the run log");
  const FileLock lock(run, "fax-run resume " + run);
  const PluginLoader loader(options.plugin_dirs);
  // The run log holds the resolved experiment: resolving it again rebuilds the same run.
  const std::string config_text = RunLogReader(run).config();
  Config config = parse_config(config_text, run + ":/config");
  // A log from before execution.flush_denormals ran with IEEE gradual underflow: it goes on so.
  if (!config.has("execution.flush_denormals"))
    config.set("execution.flush_denormals", "false", ConfigOrigin{run + ":/config (written before the key)", 0, 0});
  const ExperimentSetup setup = resolve_experiment(std::move(config), loader);
  return execute(setup, run + ":/config", run, options.quiet, true, options.force, options.remote);
}

Subcommand add_run_subcommand(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = add_run_command(app, "run", "run an experiment and log it to HDF5", *o);
  cmd->add_flag("--dry-run", o->dry_run, "print the resolved settings and stop");
  cmd->add_flag("--check", o->check,
                "compare the finished run with the experiment's expect: section (exit 1 naming each miss)");
  add_remote_options(*cmd, o->remote);
  return {cmd, [o] { return run_command(*o); }};
}

Subcommand add_resume_subcommand(CLI::App& app) {
  auto o = std::make_shared<ResumeOptions>();
  CLI::App* cmd =
      app.add_subcommand("resume", "continue a run from its last checkpoint (after a crash, kill or Ctrl-C)");
  cmd->add_option("run", o->run, "the run log to continue")->required()->type_name("RUN.h5");
  add_plugin_dir_option(*cmd, o->plugin_dirs);
  cmd->add_flag("-q,--quiet", o->quiet, "no progress output");
  cmd->add_flag("--force", o->force,
                       "resume although the experiment now resolves differently (another plugin build, data set or "
                       "model) or the resource estimate exceeds this machine (recorded in the log)");
  add_remote_options(*cmd, o->remote);
  return {cmd, [o] { return resume_command(*o); }};
}

}  // namespace fax::cli
