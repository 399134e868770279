// fax-run sweep: trials of an experiment as child fax-run processes, a sweep index, a summary.
//
// Each trial is `fax-run run` (or `fax-run resume`, for a trial an interrupted sweep left behind
// with its checkpoints) in its own process, writing <dir>/<trial>.h5 with its output in
// <dir>/<trial>.log: a trial that crashes or diverges fails alone. The sweep holds <dir>/sweep.lock; the children inherit the
// lock, so a sweep resumed after a kill -9 waits until the old trials (stopped by their parent's
// death signal, checkpointed) have let go of the directory.

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include <CLI/CLI.hpp>

#include <fax/base/config.h>
#include <fax/base/error.h>
#include <fax/io/config_yaml.h>
#include <fax/io/run_log.h>
#include <fax/runtime/experiment.h>
#include <fax/tools/sweep.h>

#include "commands.h"
#include "options.h"
#include "setup.h"
#include "sweep_slurm.h"

namespace fax::cli {
namespace {
namespace fs = std::filesystem;

using Clock = std::chrono::steady_clock;

std::atomic<int> sweep_signal{0};
void on_sweep_signal(int signal) { sweep_signal = signal; }

// The last non-empty line a trial wrote: its one-line error when it failed.
std::string last_line(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last.empty() ? "no output (see " + path + ")" : last;
}

// Each metric's mean over its last `count` finite values in a run log.
std::vector<std::pair<std::string, double>> final_metrics(const std::string& run, int64_t count) {
  const RunLogReader log(run);
  std::vector<std::pair<std::string, double>> out;
  for (const auto& name : log.metric_names()) {
    const double v = mean_of_last(log.metric(name), count);
    if (!std::isnan(v)) out.emplace_back(name, v);
  }
  return out;
}

// A pending trial continues from its log where the log's checkpoint folder is there too. One that
// came without it (a harvested sweep leaves checkpoints behind) runs again from round 0, replacing
// the log: runs are deterministic, so only time is lost. A folder that is there but unreadable (a
// dangling link to storage that is away) is resumed, and the trial fails saying why, its
// checkpoints kept.
bool resumable_run_log(const std::string& path) {
  std::error_code ec;
  if (fs::symlink_status(RunLogReader::checkpoint_folder(path), ec).type() == fs::file_type::not_found) return false;
  try {
    RunLogReader log(path);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Holds <dir>/sweep.lock. A sweep that is alive refuses a second one; trials of a dead sweep are
// waited for (they hold the lock until they have checkpointed and exited).
class DirectoryLock {
 public:
  explicit DirectoryLock(const std::string& dir, bool quiet) {
    const std::string path = dir + "/sweep.lock";
    // Not close-on-exec: the trials inherit the lock.
    fd_ = open(path.c_str(), O_RDWR | O_CREAT, 0644);
    FAX_CHECK(fd_ >= 0, "{}: cannot create the sweep lock: {}", path, std::strerror(errno));
    if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      char text[32] = {};
      const ssize_t n = pread(fd_, text, sizeof text - 1, 0);
      const pid_t owner = n > 0 ? static_cast<pid_t>(std::atoi(text)) : 0;
      FAX_CHECK(owner <= 0 || kill(owner, 0) != 0, "{}: another fax-run sweep (pid {}) is running in this directory",
                dir, owner);
      if (!quiet) std::printf("waiting for the trials of an earlier sweep in %s to stop...\n", dir.c_str());
      std::fflush(stdout);
      flock(fd_, LOCK_EX);
    }
    const std::string pid = std::to_string(getpid()) + "\n";
    if (ftruncate(fd_, 0) != 0 || pwrite(fd_, pid.data(), pid.size(), 0) < 0) warn(path + ": cannot record the sweep's pid");
  }
  ~DirectoryLock() { close(fd_); }
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

// Starts `args` as a child fax-run writing stdout and stderr to `log`. The child is in its own
// process group (a Ctrl-C reaches the sweep, which stops the trials with one SIGTERM) and gets
// SIGTERM when the sweep dies, so a killed sweep leaves checkpointed trials behind.
pid_t launch(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  FAX_CHECK(out >= 0, "{}: cannot create the trial's log: {}", log, std::strerror(errno));
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(128 + SIGTERM);
    dup2(out, STDOUT_FILENO);
    dup2(out, STDERR_FILENO);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(out);
  FAX_CHECK(pid > 0, "cannot start a trial process: {}", std::strerror(errno));
  return pid;
}

struct Running {
  size_t trial;
  Clock::time_point start;
};

// Characters as a terminal shows them: printf pads by bytes, and UTF-8 letters take several.
size_t glyphs(const std::string& text) {
  return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

std::string format_value(double v) { return std::isnan(v) ? "-" : fmt::format("{:.4f}", v); }

}  // namespace

void print_sweep_summary(const SweepIndex& index, const std::string& path, size_t top) {
  std::map<std::string, int> counts;
  for (const auto& t : index.trials) ++counts[t.status];
  std::string tally;
  for (const auto& [status, n] : counts) tally += fmt::format(", {} {}", n, status);
  std::printf("sweep %s: %zu trials%s; ranked by %s (%s of %s)\n", path.c_str(), index.trials.size(), tally.c_str(),
              index.metric.c_str(), index.maximize ? "max" : "min",
              index.average_last > 1 ? fmt::format("the mean of its last {} logged values", index.average_last).c_str()
                                     : "its last logged value");
  // Trials run one to a process; their wall times add up to what the sweep cost, cut-off attempts
  // included.
  double total = 0, done = 0;
  for (const auto& t : index.trials) {
    total += t.seconds;
    if (t.status == "done") done += t.seconds;
  }
  if (counts["done"] > 0) {
    std::printf("time: %s of trial runs; a done trial %s on average\n", format_duration(total).c_str(),
                format_duration(done / counts["done"]).c_str());
  }
  const int64_t best = best_trial(index);
  const std::string dir = fs::path(path).parent_path().string();
  if (best < 0) {
    std::printf("no finished trial logged %s\n", index.metric.c_str());
  } else {
    const TrialRecord& b = index.trials[static_cast<size_t>(best)];
    std::printf("best trial: %s (%s): %s %.4f; log %s\n", b.name.c_str(), b.trial().label().c_str(),
                index.metric.c_str(), b.value(index.metric),
                (fs::path(dir) / (b.name + ".h5")).string().c_str());
  }
  const auto settings = summarize(index);
  if (!settings.empty()) {
    const std::string header = index.metric + " mean ± std";
    std::printf("%6s  %-*s %5s  %s\n", "rank", static_cast<int>(24 + header.size() - glyphs(header)), header.c_str(), "runs",
                "setting");
    for (size_t r = 0; r < settings.size() && r < top; ++r) {
      const auto& s = settings[r];
      const std::string value = s.trials.size() > 1 ? fmt::format("{:.4f} ± {:.4f}", s.mean, s.std) : fmt::format("{:.4f}", s.mean);
      std::printf("%6zu  %-*s %5zu  %s\n", r + 1, static_cast<int>(24 + value.size() - glyphs(value)), value.c_str(),
                  s.trials.size(), s.setting.empty() ? "(the experiment as written)" : s.setting.c_str());
    }
    if (settings.size() > top) std::printf("   ... %zu more settings\n", settings.size() - top);
  }
  for (const auto& t : index.trials) {
    if (t.status == "failed") std::printf("failed: %s (%s): %s\n", t.name.c_str(), t.trial().label().c_str(), t.message.c_str());
  }
  std::fflush(stdout);
}

int sweep_command(const SweepOptions& options) {
  SweepSpec spec = SweepSpec::from_file(options.experiment);
  for (const auto& g : options.grid) spec.add_grid(g);
  if (!options.metric.empty() || !options.mode.empty()) {
    spec.set_metric(options.metric.empty() ? spec.metric : options.metric, options.mode);
  }
  FAX_CHECK(!spec.empty(),
            "{}: nothing to sweep: add a sweep: section (grid, random, seeds) or --grid key=v1,v2", options.experiment);
  const std::vector<Trial> trials = expand(spec);

  // Every trial is resolved now, so a typo in a value fails before hours of other trials.
  const PluginLoader loader(options.plugin_dirs);
  // Results never depend on the executor count, so trials the experiment leaves on automatic
  // executors get one each and the budget runs that many trials at once.
  std::vector<bool> automatic_executors;
  int64_t executors_per_trial = 1;
  int64_t threads_per_trial = 1;
  for (const auto& t : trials) {
    std::vector<std::string> overrides = options.overrides;
    for (const auto& [key, value] : t.overrides) overrides.push_back(key + "=" + value);
    try {
      const ExperimentSetup setup = load_experiment(options.experiment, overrides, loader);
      // What the run refuses before it reads data: the mesh, the clock (and its traces), and
      // asynchronous training's settings against the algorithm.
      mesh_options(setup.config);
      SimulatedClock::from_config(setup.config);
      check_asynchronous(setup.config, *setup.plugin->create());
      const int64_t executors = setup.config.get_int("execution.executors");
      automatic_executors.push_back(executors == 0);
      executors_per_trial = std::max(executors_per_trial, executors);
      // Each executor runs execution.threads intra-op threads (automatic ones resolved already).
      threads_per_trial =
          std::max(threads_per_trial, std::max<int64_t>(executors, 1) * setup.config.get_int("execution.threads"));
    } catch (const Error& e) {
      throw Error(fmt::format("{} ({}): {}", t.name, t.label(), e.what()));
    }
  }
  if (options.dry_run) {
    std::printf("# %s: %zu trials, each validated\n", options.experiment.c_str(), trials.size());
    for (const auto& t : trials) std::printf("%s %s\n", t.name.c_str(), t.label().c_str());
    return 0;
  }
  const bool on_slurm = options.launcher == "slurm";
  const int budget = options.executors > 0 ? options.executors : std::max(1u, std::thread::hardware_concurrency());
  // Under Slurm the budget is the cluster's: --executors only caps the tasks at once (the array's %k).
  const size_t slots = on_slurm && options.executors == 0
                           ? 0
                           : static_cast<size_t>(std::max<int64_t>(1, budget / threads_per_trial));

  if (on_slurm) SlurmArrays::check_available();
  const std::string dir = options.output.empty()
                              ? fs::path(options.experiment).stem().string() + ".sweep"
                              : options.output;
  std::error_code ec;
  fs::create_directories(dir, ec);
  FAX_CHECK(!ec, "{}: cannot create the sweep directory: {}", dir, ec.message());
  const DirectoryLock lock(dir, options.quiet);
  const std::string index_path = (fs::path(dir) / "sweep.h5").string();
  auto trial_path = [&](const std::string& name, const char* ext) { return (fs::path(dir) / (name + ext)).string(); };

  SweepIndex index;
  const std::string experiment_text = read_experiment_file(options.experiment);
  size_t already = 0;
  if (fs::exists(index_path)) {
    index = SweepIndex::read(index_path);
    // The settings must match, not the text: comments and the sweep's ranking keys may change.
    bool same = parse_config(index.experiment, index_path + ":/sweep/experiment").settings() ==
                    parse_config(experiment_text, options.experiment).settings() &&
                index.base == options.overrides && index.trials.size() == trials.size();
    for (size_t i = 0; same && i < trials.size(); ++i)
      same = index.trials[i].name == trials[i].name && index.trials[i].overrides == trials[i].overrides;
    FAX_CHECK(same, "{}: holds a sweep of another experiment, --set or trial list; resuming needs the same experiment "
                    "file and options (or choose another directory with -o)", index_path);
    for (auto& t : index.trials) {
      const bool done = t.status == "done" && fs::exists(trial_path(t.name, ".h5"));
      const bool keep_failed = t.status == "failed" && !options.retry_failed;
      if (!done && !keep_failed) {
        t.status = "pending";
        t.message.clear();
      }
      already += done;
    }
  } else {
    index.base = options.overrides;
    for (const auto& t : trials) {
      TrialRecord record;
      record.name = t.name;
      record.overrides = t.overrides;
      index.trials.push_back(std::move(record));
    }
  }
  index.experiment = experiment_text;
  index.metric = spec.metric;
  index.maximize = spec.maximize;
  if (index.average_last != spec.average_last) {
    // Ranking by another window: the finished trials' values are recomputed from their logs.
    index.average_last = spec.average_last;
    for (auto& t : index.trials)
      if (t.status == "done") t.final = final_metrics(trial_path(t.name, ".h5"), index.average_last);
  }
  index.write(index_path);

  std::unique_ptr<SlurmArrays> slurm;
  // How a trial ended; `why` says why it stopped or failed.
  enum class Ended { done, stopped, failed };
  size_t finished = already;
  auto record = [&](size_t trial, Ended how, double seconds, std::string why) {
    TrialRecord& t = index.trials[trial];
    t.seconds += seconds;
    std::string outcome;
    if (how == Ended::done) {
      try {
        t.final = final_metrics(trial_path(t.name, ".h5"), index.average_last);
      } catch (const Error& e) {
        // Its process said done, but the run log does not say so (a tampered status file).
        how = Ended::failed;
        why = e.what();
      }
    }
    if (how == Ended::done) {
      t.status = "done";
      ++finished;
      outcome = fmt::format("done in {:.1f}s: {} {}", t.seconds, spec.metric, format_value(t.value(spec.metric)));
    } else if (how == Ended::stopped) {
      t.status = "pending";
      outcome = "stopped (" + why + ")";
    } else {
      t.status = "failed";
      t.message = why;
      outcome = "failed: " + why;
    }
    index.write(index_path);
    if (!options.quiet) {
      std::printf("[%zu/%zu done] %s %s: %s\n", finished, index.trials.size(), t.name.c_str(), t.trial().label().c_str(),
                  outcome.c_str());
      std::fflush(stdout);
    }
  };
  // A Slurm task's end, from the status its script wrote.
  auto record_task = [&](const SlurmEnded& e) {
    const TrialRecord& t = index.trials[e.trial];
    if (t.status == "done") return;  // recorded already (a finished task resumed once more)
    if (!e.exit) {
      record(e.trial, Ended::stopped, e.seconds,
             "its Slurm task ended without a status: cancelled, killed or its node lost; the same command resubmits it");
    } else if (*e.exit == 0) {
      record(e.trial, Ended::done, e.seconds, "");
    } else if (*e.exit == 128 + SIGTERM || *e.exit == 128 + SIGINT) {
      record(e.trial, Ended::stopped, e.seconds,
             "by a signal: scancel, a time limit or preemption; checkpointed, the same command resubmits it");
    } else if (*e.exit > 128) {
      record(e.trial, Ended::failed, e.seconds, fmt::format("killed by signal {}", *e.exit - 128));
    } else {
      record(e.trial, Ended::failed, e.seconds, last_line(trial_path(t.name, ".log")));
    }
  };
  // Tasks an earlier sweep submitted: those still queued are followed, not submitted again; those
  // that ended meanwhile are recorded.
  std::vector<std::string> names;
  for (const auto& t : index.trials) names.push_back(t.name);
  if (SlurmArrays::recorded(dir) && (on_slurm || SlurmArrays::available())) {
    slurm = std::make_unique<SlurmArrays>(fs::absolute(dir).string(), names);
    for (const auto& e : slurm->adopt()) record_task(e);
    FAX_CHECK(on_slurm || slurm->empty(),
              "{}: trials of this sweep are still queued in Slurm (job {}): follow them with --launcher slurm, or "
              "scancel them first", dir, slurm->jobs());
    for (size_t i : slurm->followed())
      if (index.trials[i].status != "done") index.trials[i].status = "running";
    index.write(index_path);
  } else if (SlurmArrays::recorded(dir)) {
    warn(dir + "/slurm/tasks records Slurm tasks that cannot be checked here (no squeue on PATH): make sure none is "
         "still queued");
  }
  if (on_slurm && !slurm) slurm = std::make_unique<SlurmArrays>(fs::absolute(dir).string(), names);

  size_t pending = 0;
  for (const auto& t : index.trials) pending += t.status == "pending";
  if (!options.quiet) {
    std::printf("fax-run sweep %s: %zu trials, ranked by %s (%s)%s\n  dir: %s; %s, %lld executor%s each\n",
                options.experiment.c_str(), trials.size(), spec.metric.c_str(), spec.maximize ? "max" : "min",
                finished > 0 ? fmt::format("; resuming: {} done, {} to run", finished, pending).c_str() : "",
                dir.c_str(),
                (slots == 0 ? std::string("as a Slurm array, as many at a time as the cluster runs")
                            : fmt::format("{} at a time{}", slots, on_slurm ? " as a Slurm array" : "")).c_str(),
                static_cast<long long>(executors_per_trial), executors_per_trial > 1 ? "s" : "");
    std::fflush(stdout);
  }

  struct sigaction action {};
  action.sa_handler = on_sweep_signal;
  sigemptyset(&action.sa_mask);
  struct sigaction previous_int {}, previous_term {};
  sweep_signal = 0;
  sigaction(SIGINT, &action, &previous_int);
  sigaction(SIGTERM, &action, &previous_term);

  const std::string self = fs::read_symlink("/proc/self/exe").string();
  // fax-run's arguments that start a trial, and those that continue it from its run log.
  auto run_args = [&](size_t i) {
    const TrialRecord& t = index.trials[i];
    std::vector<std::string> args = {"run", options.experiment, "-q", "-o", trial_path(t.name, ".h5")};
    for (const auto& o : options.overrides) args.insert(args.end(), {"--set", o});
    for (const auto& [key, value] : t.overrides) args.insert(args.end(), {"--set", key + "=" + value});
    if (automatic_executors[i]) args.insert(args.end(), {"--set", "execution.executors=1"});
    for (const auto& d : options.plugin_dirs) args.insert(args.end(), {"--plugin-dir", d});
    return args;
  };
  auto resume_args = [&](size_t i) {
    std::vector<std::string> args = {"resume", trial_path(index.trials[i].name, ".h5"), "-q"};
    for (const auto& d : options.plugin_dirs) args.insert(args.end(), {"--plugin-dir", d});
    return args;
  };
  // Trials stopped part-way first (they hold a checkpoint), then launch_order's.
  std::vector<size_t> order = launch_order(spec, trials.size());
  std::stable_partition(order.begin(), order.end(), [&](size_t i) {
    return index.trials[i].status == "pending" && resumable_run_log(trial_path(index.trials[i].name, ".h5"));
  });
  bool stopping = false;
  if (on_slurm) {
    std::vector<SlurmTrial> submit;
    for (size_t i : order) {
      if (index.trials[i].status == "pending") submit.push_back({i, index.trials[i].name, run_args(i), resume_args(i)});
    }
    if (!submit.empty()) {
      SlurmSettings settings = options.slurm;
      if (settings.cpus == 0) settings.cpus = static_cast<int>(threads_per_trial);
      settings.max_running = slots;
      const std::string job = slurm->submit(submit, settings, self, fs::current_path().string());
      for (const auto& t : submit) index.trials[t.trial].status = "running";
      index.write(index_path);
      if (!options.quiet) {
        std::printf("submitted %zu trial%s as Slurm array job %s (%d CPU%s a task); following it with squeue\n",
                    submit.size(), submit.size() > 1 ? "s" : "", job.c_str(), settings.cpus, settings.cpus > 1 ? "s" : "");
        std::fflush(stdout);
      }
    }
    // A Ctrl-C stops the following, not the array: its tasks run on, and the same command follows
    // them again.
    std::string states;
    while (!slurm->empty() && sweep_signal == 0) {
      for (const auto& e : slurm->poll()) record_task(e);
      if (!options.quiet && !slurm->empty() && slurm->states() != states) {
        states = slurm->states();
        std::printf("queue: %s (job %s)\n", states.c_str(), slurm->jobs().c_str());
        std::fflush(stdout);
      }
      for (int i = 0; i < 40 && sweep_signal == 0 && !slurm->empty(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    stopping = sweep_signal != 0;
    if (stopping) {
      sigaction(SIGINT, &previous_int, nullptr);
      sigaction(SIGTERM, &previous_term, nullptr);
      std::fprintf(stderr,
                   "fax-run: stopped following the sweep by signal %d with %zu of %zu trials done; its Slurm tasks run "
                   "on (scancel %s stops them); follow them again with the same command\n",
                   sweep_signal.load(), finished, index.trials.size(), slurm->jobs().c_str());
      return 128 + sweep_signal.load();
    }
  }
  std::map<pid_t, Running> running;
  size_t position = 0;
  while (!on_slurm) {
    while (!stopping && running.size() < slots && position < order.size()) {
      const size_t next = order[position++];
      TrialRecord& t = index.trials[next];
      if (t.status != "pending") continue;
      const std::string log = trial_path(t.name, ".h5");
      const bool resume = resumable_run_log(log);
      // Only where the folder is what is missing (an unreadable log fails in `run`, saying why).
      if (!resume && fs::exists(log) && !fs::exists(RunLogReader::checkpoint_folder(log)) && !options.quiet) {
        std::printf("%s: its log has no checkpoint folder beside it (%s); running it from round 0\n", t.name.c_str(),
                    RunLogReader::checkpoint_folder(log).c_str());
      }
      std::vector<std::string> args = resume ? resume_args(next) : run_args(next);
      args.insert(args.begin(), self);
      running[launch(args, trial_path(t.name, ".log"))] = {next, Clock::now()};
      t.status = "running";
      index.write(index_path);
    }
    if (running.empty()) break;
    if (sweep_signal != 0 && !stopping) {
      stopping = true;
      for (const auto& r : running) kill(r.first, SIGTERM);
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    const auto it = running.find(pid);
    if (it == running.end()) continue;
    const size_t trial = it->second.trial;
    const double seconds = std::chrono::duration<double>(Clock::now() - it->second.start).count();
    running.erase(it);
    // A trial stopped before its signal handlers exist dies of the SIGTERM itself.
    const bool interrupted = stopping && ((WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM) ||
                                          (WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      record(trial, Ended::done, seconds, "");
    } else if (interrupted) {
      record(trial, Ended::stopped, seconds, "checkpointed; resumes with the sweep");
    } else {
      record(trial, Ended::failed, seconds,
             WIFSIGNALED(status) ? fmt::format("killed by signal {}", WTERMSIG(status))
                                 : last_line(trial_path(index.trials[trial].name, ".log")));
    }
  }
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);

  if (stopping) {
    std::fprintf(stderr, "fax-run: sweep stopped by signal %d with %zu of %zu trials done; continue with 'fax-run sweep %s -o %s'\n",
                 sweep_signal.load(), finished, index.trials.size(), options.experiment.c_str(), dir.c_str());
    return 128 + sweep_signal.load();
  }
  if (!options.quiet) std::printf("\n");
  print_sweep_summary(index, index_path, 20);
  size_t failed = 0, unfinished = 0;
  for (const auto& t : index.trials) {
    failed += t.status == "failed";
    unfinished += t.status == "pending";
  }
  FAX_CHECK(unfinished == 0, "{} of {} trials stopped before they finished (their Slurm tasks were cancelled, "
                             "preempted or lost); run the same command to resubmit them", unfinished, index.trials.size());
  FAX_CHECK(failed == 0, "{} of {} trials failed (their logs: {}/trial-*.log; rerun them with --retry-failed)", failed,
            index.trials.size(), dir);
  return 0;
}

Subcommand add_sweep_subcommand(CLI::App& app) {
  auto o = std::make_shared<SweepOptions>();
  CLI::App* cmd = app.add_subcommand(
      "sweep", "run the trials of an experiment's sweep: section (or --grid) in parallel; resumable; ranks the trials");
  cmd->add_option("experiment", o->experiment, "the experiment, a YAML file (with a sweep: section or --grid)")
      ->required()->type_name("EXPERIMENT.yaml");
  cmd->add_option("--grid", o->grid, "sweep a key over values, e.g. --grid algorithm.client_lr=0.01,0.1; repeatable")
      ->type_name("KEY=V1,V2,...");
  cmd->add_option("--set", o->overrides, "override a setting of every trial; repeatable")->type_name("KEY=VALUE");
  cmd->add_option("-o,--output", o->output,
                        "the sweep directory: a run log per trial and the index DIR/sweep.h5 (default: <experiment name>.sweep)")
      ->type_name("DIR");
  cmd->add_option("--executors", o->executors,
                        "threads for all trials at once (default: one per hardware thread; under Slurm: no cap); a "
                        "trial takes its executors x execution.threads, and trials left on automatic executors get "
                        "one each")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--launcher", o->launcher,
                  "where trials run: local (child processes) or slurm (one sbatch --array job, followed with squeue; "
                  "the same command follows it again or resubmits what stopped)")
      ->check(CLI::IsMember({"local", "slurm"}))->type_name("local|slurm");
  const char* slurm_group = "Slurm (--launcher slurm)";
  cmd->add_option("--slurm-partition", o->slurm.partition, "the partition of the array (default: the cluster's)")
      ->type_name("P")->group(slurm_group);
  cmd->add_option("--slurm-time", o->slurm.time, "each task's time limit, as sbatch --time takes it")
      ->type_name("T")->group(slurm_group);
  cmd->add_option("--slurm-cpus", o->slurm.cpus, "CPUs per task (default: the trial's executors x execution.threads)")
      ->check(CLI::Range(1, 4096))->type_name("N")->group(slurm_group);
  cmd->add_option("--slurm-extra", o->slurm.extra, "more sbatch arguments, e.g. \"--account=A --qos=Q\"")
      ->type_name("ARGS")->group(slurm_group);
  cmd->add_option("--metric", o->metric, "rank trials by this metric (default: the sweep section's, else eval/accuracy)")
      ->type_name("NAME");
  cmd->add_option("--mode", o->mode, "max or min (default: min for a metric named *loss, else max)")
      ->check(CLI::IsMember({"max", "min"}));
  cmd->add_flag("--retry-failed", o->retry_failed, "when resuming, run failed trials again");
  cmd->add_flag("--dry-run", o->dry_run, "validate every trial, list them and stop");
  add_plugin_dir_option(*cmd, o->plugin_dirs);
  cmd->add_flag("-q,--quiet", o->quiet, "no progress output (the summary is still printed)");
  return {cmd, [o] { return sweep_command(*o); }};
}

}  // namespace fax::cli
