#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>

#include <CLI/CLI.hpp>

#include <fax/base/error.h>
#include <fax/runtime/plugin_loader.h>
#include <fax/train/aggregation.h>

#include "commands.h"
#include "options.h"

namespace fax::cli {
namespace {

constexpr double kProbeSeconds = 60;

void print_keys(const std::vector<ConfigKey>& keys, const std::string& section) {
  for (const auto& key : keys) {
    const std::string constraints = describe_constraints(key);
    const std::string name = section + "." + key.name;
    std::printf("  %-28s %-8s = %-8s %s%s\n", name.c_str(), to_string(key.type),
                key.default_value.c_str(), key.doc.c_str(),
                constraints.empty() ? "" : (" (" + constraints + ")").c_str());
  }
}

// The listing of one loaded plugin: kind, versions, description, keys.
template <class Entry>
void print_plugin(const Entry& p, const std::string& section, const std::string& kind) {
  std::printf("\n%s  (%s; fax %s, LibTorch %s)  %s\n  %s\n", p.name.c_str(), kind.c_str(), p.fax_version.c_str(),
              p.torch_version.c_str(), p.path.c_str(), p.description.c_str());
  print_keys(p.keys, section);
}

struct Probe {
  int status = 0;  // as waitpid reports it
  bool timed_out = false;
  std::string output;  // stdout and stderr together
};

// Loads the plugin at `path` in a child fax-run (`plugins --probe PATH`), which prints its listing:
// loading runs the library's code, and a library that crashes or hangs must take down only the
// child, not the listing of the others.
Probe probe(const std::string& path) {
  int out[2];
  FAX_CHECK(pipe2(out, O_CLOEXEC) == 0, "cannot list plugins: pipe: {}", std::strerror(errno));
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    const char* argv[] = {"fax-run", "plugins", "--probe", path.c_str(), nullptr};
    execv("/proc/self/exe", const_cast<char* const*>(argv));
    _exit(127);
  }
  close(out[1]);
  if (pid < 0) {
    close(out[0]);
    throw Error(fmt::format("cannot list plugins: fork: {}", std::strerror(errno)));
  }
  Probe result;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kProbeSeconds);
  char buffer[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = read(out[0], buffer, sizeof buffer);
    if (n <= 0) break;
    result.output.append(buffer, static_cast<size_t>(n));
  }
  close(out[0]);
  waitpid(pid, &result.status, 0);
  return result;
}

// Why a probe failed, in one line.
std::string refusal(const Probe& p) {
  if (p.timed_out) return fmt::format("did not finish loading within {:.0f} s (killed)", kProbeSeconds);
  if (WIFSIGNALED(p.status)) {
    return fmt::format("crashed while loading (signal {}: {})", WTERMSIG(p.status), strsignal(WTERMSIG(p.status)));
  }
  std::string text = p.output;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const std::string prefix = "fax-run: ";
  if (text.rfind(prefix, 0) == 0) text = text.substr(prefix.size());
  return text.empty() ? fmt::format("failed to load (exit status {})", WEXITSTATUS(p.status)) : text;
}

}  // namespace

int plugins_command(const PluginsOptions& options) {
  if (!options.probe.empty()) {
    const std::string kind = plugin_kind(options.probe);
    if (kind == kModelPlugin) print_plugin(*load_model_plugin_file(options.probe), "model", kind);
    else if (kind == kDatasetPlugin) print_plugin(*load_dataset_plugin_file(options.probe), "data", kind);
    else print_plugin(*load_plugin_file(options.probe), "algorithm", kind);
    return 0;
  }
  const PluginLoader loader(options.plugin_dirs);
  std::printf("plugin search path:\n");
  for (const auto& dir : loader.search_path()) std::printf("  %s\n", dir.c_str());
  const auto paths = loader.candidates();
  if (paths.empty()) std::printf("no plugins (fax_<name>.so) found\n");
  std::fflush(stdout);
  for (const auto& path : paths) {
    const Probe p = probe(path);
    if (!p.timed_out && WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0) {
      std::fputs(p.output.c_str(), stdout);
    } else {
      std::printf("\nrefused: %s\n  %s\n", path.c_str(), refusal(p).c_str());
    }
    std::fflush(stdout);
  }
  std::printf("\naggregation stages (built in; aggregation: [{clip: {norm: 1.0}}, {gaussian: {}}], in this order of "
              "roles: client, aggregator, server):\n");
  for (const auto& stage : aggregation_stages()) {
    std::printf("\n%s  (%s stage)\n  %s\n", stage.name.c_str(), stage.role.c_str(), stage.description.c_str());
    print_keys(stage.keys, "aggregation." + stage.name);
  }
  return 0;
}

Subcommand add_plugins_subcommand(CLI::App& app) {
  auto o = std::make_shared<PluginsOptions>();
  CLI::App* cmd = app.add_subcommand("plugins", "list the plugins found (algorithms, models, data sets), with versions and keys");
  add_plugin_dir_option(*cmd, o->plugin_dirs);
  cmd->add_option("--probe", o->probe)->group("");
  return {cmd, [o] { return plugins_command(*o); }};
}

}  // namespace fax::cli
