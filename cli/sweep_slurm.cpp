// fax-run sweep --launcher slurm: trials as the tasks of Slurm job arrays, followed with squeue.

#include "sweep_slurm.h"

#include "shell_word.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/ranges.h>

#include <fax/base/error.h>
#include <fax/io/files.h>

namespace fax::cli {
namespace {
namespace fs = std::filesystem;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A task missing from squeue is only called lost after this long without its status file.
constexpr double kGraceS = 15;
// squeue failing this long in a row (slurmctld down) ends the sweep process, not the array.
constexpr double kSqueueGiveUpS = 60;
// The job of tasks recorded before sbatch returned.
const char* const kInFlight = "?";

bool on_path(const std::string& tool) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string d;
  while (std::getline(dirs, d, ':'))
    if (!d.empty() && access((fs::path(d) / tool).c_str(), X_OK) == 0) return true;
  return false;
}

struct ToolResult {
  int status = -1;  // the exit status; -1: killed by a signal
  std::string out, err;
};

// Runs a Slurm command with its stdout and stderr captured.
ToolResult run_tool(const std::vector<std::string>& args) {
  int out[2], err[2];
  FAX_CHECK(pipe(out) == 0 && pipe(err) == 0, "cannot run {}: pipe: {}", args.front(), std::strerror(errno));
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    close(out[0]), close(out[1]), close(err[0]), close(err[1]);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  const int fork_errno = errno;
  close(out[1]), close(err[1]);
  if (pid < 0) {
    close(out[0]), close(err[0]);
    throw Error(fmt::format("cannot run {}: fork: {}", args.front(), std::strerror(fork_errno)));
  }
  ToolResult r;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* texts[2] = {&r.out, &r.err};
  int open_fds = 2;
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        texts[i]->append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The first non-empty line of a command's output (sbatch puts the reason first, then usage hints),
// for one-line errors.
std::string first_line_of(const std::string& text) {
  std::stringstream lines(text);
  std::string line;
  while (std::getline(lines, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) return line;
  return "no output";
}

std::string words(const std::vector<std::string>& args) {
  std::string s;
  for (const auto& a : args) s += (s.empty() ? "" : " ") + shell_word(a);
  return s;
}

}  // namespace

bool SlurmArrays::available() { return on_path("sbatch") && on_path("squeue"); }

void SlurmArrays::check_available() {
  for (const char* tool : {"sbatch", "squeue"}) {
    FAX_CHECK(on_path(tool), "--launcher slurm: {} is not on PATH (run the sweep where Slurm's commands are, or use "
                             "--launcher local)", tool);
  }
}

SlurmArrays::SlurmArrays(std::string dir, const std::vector<std::string>& trials) : dir_(std::move(dir)) {
  check_available();
  // Unique to the directory, so a submission whose job id never reached the record (the sweep was
  // killed while sbatch ran) is found by name.
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : dir_) hash = (hash ^ c) * 1099511628211ull;
  name_ = fmt::format("fax-sweep-{:08x}", hash & 0xffffffffu);
  std::error_code ec;
  fs::create_directories(fs::path(dir_) / "slurm", ec);
  FAX_CHECK(!ec, "{}/slurm: cannot create: {}", dir_, ec.message());
  const std::string record = (fs::path(dir_) / "slurm" / "tasks").string();
  if (!fs::exists(record)) return;
  std::stringstream lines(read_regular_file(record, 64 << 20, "the sweep's record of Slurm tasks"));
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    if (line.empty()) continue;
    Task t;
    std::stringstream fields(line);
    FAX_CHECK(static_cast<bool>(fields >> t.job >> t.array_task >> t.trial >> t.name) &&
                  (t.job == kInFlight || t.job.find_first_not_of("0123456789") == std::string::npos),
              "{}:{}: not a task of a Slurm array ('{}'); remove the file if no array of this sweep is queued", record,
              number, line);
    FAX_CHECK(t.trial < trials.size() && trials[t.trial] == t.name,
              "{}:{}: names trial {} ({}), which this sweep does not have: the record belongs to another sweep; "
              "remove the file if none of its tasks is queued", record, number, t.trial, t.name);
    tasks_.push_back(std::move(t));
  }
}

std::string SlurmArrays::exit_path(const std::string& name) const {
  return (fs::path(dir_) / "slurm" / (name + ".exit")).string();
}

std::string SlurmArrays::states() const {
  return fmt::format("{} running, {} pending{}", running_, pending_,
                     reasons_.empty() ? "" : fmt::format(" (reason: {})", fmt::join(reasons_, ", ")));
}

std::string SlurmArrays::jobs() const {
  std::set<std::string> ids;
  for (const auto& t : tasks_) ids.insert(t.job);
  std::string s;
  for (const auto& id : ids) s += (s.empty() ? "" : ",") + id;
  return s;
}

void SlurmArrays::write_record() const {
  std::string text;
  for (const auto& t : tasks_) text += fmt::format("{} {} {} {}\n", t.job, t.array_task, t.trial, t.name);
  const std::string path = (fs::path(dir_) / "slurm" / "tasks").string();
  std::error_code ec;
  if (tasks_.empty()) {
    // Nothing left to follow.
    fs::remove(path, ec);
    FAX_CHECK(!ec, "{}: cannot remove: {}", path, ec.message());
    return;
  }
  write_file_atomically(path, text);
}

std::optional<SlurmArrays::Queue> SlurmArrays::queue_of_jobs() {
  // A failed squeue: none this time, and an error once it has failed for a minute.
  auto failed = [&](const std::string& what, const ToolResult& r) -> std::optional<Queue> {
    if (squeue_failing_since_ < 0) squeue_failing_since_ = now_s();
    FAX_CHECK(now_s() - squeue_failing_since_ < kSqueueGiveUpS,
              "squeue has failed for {:.0f} s ({}: {}); the array is still queued: follow it again with the same "
              "command", now_s() - squeue_failing_since_, what, first_line_of(r.err));
    return std::nullopt;
  };
  // Tasks recorded while sbatch ran: their job is the one queued under this directory's name.
  if (std::any_of(tasks_.begin(), tasks_.end(), [](const Task& t) { return t.job == kInFlight; })) {
    const ToolResult r = run_tool({"squeue", "-h", "--me", "--name=" + name_, "-o", "%F"});
    if (r.status != 0) return failed("jobs named " + name_, r);
    std::set<std::string> jobs;
    std::stringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && std::none_of(tasks_.begin(), tasks_.end(), [&](const Task& t) { return t.job == line; }))
        jobs.insert(line);
    }
    FAX_CHECK(jobs.size() <= 1, "{}: several Slurm jobs named {} are queued ({}): the sweep cannot tell which is "
                                "its own; scancel the others", dir_, name_, fmt::join(jobs, ", "));
    if (!jobs.empty()) {
      for (auto& t : tasks_)
        if (t.job == kInFlight) t.job = *jobs.begin();
      write_record();
    }
  }
  Queue queue;
  for (const auto& t : tasks_) {
    if (queue.count(t.job) || t.job == kInFlight) continue;
    std::map<size_t, std::string>& states = queue[t.job];
    const ToolResult r = run_tool({"squeue", "-h", "-r", "-j", t.job, "-o", "%K %T %r"});
    if (r.status != 0) {
      // A job that has left the queue for good is unknown to squeue.
      if (r.err.find("Invalid job id") != std::string::npos) continue;
      return failed("job " + t.job, r);
    }
    std::stringstream lines(r.out);
    std::string line;
    while (std::getline(lines, line)) {
      std::stringstream fields(line);
      size_t id = 0;
      std::string state, reason;
      if (fields >> id >> state) {
        fields >> reason;
        states[id] = state == "PENDING" ? state + " " + reason : state;
      }
    }
  }
  squeue_failing_since_ = -1;
  return queue;
}

std::string SlurmArrays::submit(const std::vector<SlurmTrial>& trials, const SlurmSettings& settings,
                                const std::string& fax_run, const std::string& workdir) {
  FAX_CHECK(!trials.empty(), "no trials to submit");
  // The script maps an array task to its trial. Slurm keeps its own copy at submission, so the
  // file is free to be rewritten by the next one.
  std::string script = fmt::format(
      "#!/bin/bash\n"
      "# Written by fax-run sweep for {}: array task K runs one trial, its output in <trial>.log as\n"
      "# with local trials; its exit status goes to slurm/<trial>.exit when fax-run ends.\n"
      "dir={}\n"
      "case \"${{SLURM_ARRAY_TASK_ID:-}}\" in\n",
      dir_, shell_word(dir_));
  for (size_t k = 0; k < trials.size(); ++k) {
    const SlurmTrial& t = trials[k];
    script += fmt::format("  {}) name={}; run=({}); resume=({}) ;;\n", k, shell_word(t.name), words(t.run), words(t.resume));
  }
  script += fmt::format(
      "  *) echo \"fax-run sweep: no trial for array task '${{SLURM_ARRAY_TASK_ID:-}}'\" >&2; exit 2 ;;\n"
      "esac\n"
      "# scancel, a time limit or preemption signal every process of the task: fax-run checkpoints\n"
      "# and exits 143; the trap keeps this shell alive to record that.\n"
      "trap ':' TERM INT\n"
      "start=$(date +%s.%N)\n"
      "# A log goes on from its checkpoints where their folder is there (as fax-run sweep decides locally).\n"
      "if [ -e \"$dir/$name.h5\" ] && {{ [ -e \"$dir/$name.h5.checkpoints\" ] || [ -L \"$dir/$name.h5.checkpoints\" ]; }}; then\n"
      "  args=(\"${{resume[@]}}\")\n"
      "else\n"
      "  args=(\"${{run[@]}}\")\n"
      "fi\n"
      "echo \"fax-run sweep: Slurm job ${{SLURM_ARRAY_JOB_ID:-?}} task ${{SLURM_ARRAY_TASK_ID}} on $(hostname): fax-run ${{args[0]}}\" \\\n"
      "  >> \"$dir/$name.log\"\n"
      "{} \"${{args[@]}}\" >> \"$dir/$name.log\" 2>&1\n"
      "rc=$?\n"
      "printf '%s %s %s\\n' \"$rc\" \"$start\" \"$(date +%s.%N)\" > \"$dir/slurm/$name.exit.tmp\" &&\n"
      "  mv -f \"$dir/slurm/$name.exit.tmp\" \"$dir/slurm/$name.exit\"\n"
      "exit \"$rc\"\n",
      shell_word(fax_run));
  const std::string script_path = (fs::path(dir_) / "slurm" / "array.sh").string();
  write_file_atomically(script_path, script);

  // A status file left by an earlier task of the same trial would end this one at once.
  for (const auto& t : trials) {
    std::error_code ec;
    fs::remove(exit_path(t.name), ec);
  }
  // In Slurm's file name patterns % starts a field and a backslash turns them off.
  FAX_CHECK(dir_.find('\\') == std::string::npos,
            "{}: Slurm cannot name output files in a directory whose path holds a backslash", dir_);
  std::string output;
  for (char c : (fs::path(dir_) / "slurm").string()) output += c == '%' ? std::string("%%") : std::string(1, c);
  std::vector<std::string> args = {
      "sbatch",
      "--parsable",
      "--job-name=" + name_,
      fmt::format("--array=0-{}{}", trials.size() - 1,
                  settings.max_running > 0 ? fmt::format("%{}", settings.max_running) : std::string()),
      "--output=" + output + "/%A_%a.out",
      "--chdir=" + workdir,
      fmt::format("--cpus-per-task={}", std::max(settings.cpus, 1))};
  if (!settings.partition.empty()) args.push_back("--partition=" + settings.partition);
  if (!settings.time.empty()) args.push_back("--time=" + settings.time);
  std::stringstream extra(settings.extra);
  for (std::string word; extra >> word;) args.push_back(word);
  args.push_back(script_path);
  // Recorded before sbatch runs: a sweep killed meanwhile finds the job by its name next time.
  const size_t first = tasks_.size();
  for (size_t k = 0; k < trials.size(); ++k) tasks_.push_back({kInFlight, k, trials[k].trial, trials[k].name, -1});
  write_record();
  const ToolResult r = run_tool(args);
  const std::string line = first_line_of(r.out);
  const std::string job = line.substr(0, line.find(';'));  // "ID" or "ID;cluster"
  const bool submitted = r.status == 0 && !job.empty() && job.find_first_not_of("0123456789") == std::string::npos;
  if (!submitted) tasks_.resize(first);
  for (size_t k = first; k < tasks_.size(); ++k) tasks_[k].job = job;
  write_record();
  FAX_CHECK(submitted, "sbatch refused the array of {} trial{}: {}", trials.size(), trials.size() > 1 ? "s" : "",
            first_line_of(r.err.empty() ? r.out : r.err));
  return job;
}

std::vector<SlurmEnded> SlurmArrays::adopt() {
  std::optional<Queue> queue;
  while (!(queue = queue_of_jobs())) sleep(2);
  return settle(*queue, 0);
}

std::vector<SlurmEnded> SlurmArrays::poll() {
  const std::optional<Queue> queue = queue_of_jobs();
  return queue ? settle(*queue, kGraceS) : std::vector<SlurmEnded>();
}

std::vector<SlurmEnded> SlurmArrays::settle(const Queue& queue, double grace_s) {
  std::vector<SlurmEnded> ended;
  std::vector<Task> still;
  running_ = pending_ = 0;
  reasons_.clear();
  for (auto& t : tasks_) {
    const auto job = queue.find(t.job);
    const auto task = job == queue.end() ? nullptr : &job->second;
    if (task && task->count(t.array_task)) {
      const std::string& state = task->at(t.array_task);
      if (state.rfind("PENDING", 0) == 0) {
        ++pending_;
        // Reasons that say the task cannot start as asked, not merely that it waits its turn.
        const std::string reason = state.size() > 8 ? state.substr(8) : "";
        if (!reason.empty() && reason != "Priority" && reason != "Resources" && reason != "JobArrayTaskLimit" &&
            reason != "None" && reason != "BeginTime")
          reasons_.insert(reason);
      } else {
        running_ += state == "RUNNING" || state == "COMPLETING";
      }
      t.gone_since = -1;
      still.push_back(t);
      continue;
    }
    std::ifstream in(exit_path(t.name));
    int status = 0;
    double start = 0, end = 0;
    if (in >> status >> start >> end) {
      ended.push_back({t.trial, status, std::max(0.0, end - start)});
    } else if (t.gone_since < 0 && grace_s > 0) {
      t.gone_since = now_s();
      still.push_back(t);
    } else if (grace_s > 0 && now_s() - t.gone_since < grace_s) {
      still.push_back(t);
    } else {
      ended.push_back({t.trial, std::nullopt, 0});
    }
  }
  tasks_ = std::move(still);
  if (!ended.empty()) write_record();
  return ended;
}

std::vector<size_t> SlurmArrays::followed() const {
  std::vector<size_t> trials;
  for (const auto& t : tasks_) trials.push_back(t.trial);
  return trials;
}

bool SlurmArrays::recorded(const std::string& dir) { return fs::exists(fs::path(dir) / "slurm" / "tasks"); }

}  // namespace fax::cli
