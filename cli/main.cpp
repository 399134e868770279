// fax-run: run federated experiments from YAML, sweep and plot them, list algorithm plugins, inspect run logs.
// Exit codes: 0 success, 2 a user error (bad input, reported as one line on stderr), 1 an
// internal failure.

#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>
#include <torch/version.h>

#include <fax/base/error.h>
#include <fax/base/version.h>

#include "commands.h"

namespace {

constexpr int kUserError = 2;
constexpr int kInternalError = 1;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fax-run: federated learning experiments on LibTorch"};
  app.set_version_flag("--version", fmt::format("fax-run {} (LibTorch {})", FAX_VERSION, TORCH_VERSION));
  app.require_subcommand(1);
  using namespace fax::cli;
  // In the order --help lists them.
  const std::vector<Subcommand> commands = {
      add_run_subcommand(app),     add_launch_subcommand(app),  add_resume_subcommand(app),
      add_worker_subcommand(app),  add_plugins_subcommand(app), add_inspect_subcommand(app), add_expect_subcommand(app), add_table_subcommand(app),
      add_privacy_subcommand(app),
      add_sweep_subcommand(app),   add_plot_subcommand(app),    add_bench_subcommand(app)};

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
    for (const auto& command : commands)
      if (command.app->parsed()) return command.run();
    return kInternalError;  // require_subcommand(1): one of them parsed
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
