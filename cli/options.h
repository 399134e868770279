#pragma once

// Flags that several subcommands share (each subcommand registers its own in its file).

#include <string>
#include <vector>

#include "commands.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fax::cli {

/// The help group of the remote-execution flags.
extern const char* const kRemoteGroup;

/// --plugin-dir DIR (repeatable).
void add_plugin_dir_option(CLI::App& app, std::vector<std::string>& dirs);
/// --token-file FILE.
void add_token_option(CLI::App& app, std::string& file);
/// What a coordinator needs besides its workers and address (run, resume and launch).
void add_coordinator_options(CLI::App& app, RemoteFlags& remote);
/// --workers and --listen, then the coordinator's flags.
void add_remote_options(CLI::App& app, RemoteFlags& remote);
/// A subcommand taking an experiment and how to log it (run and launch).
CLI::App* add_run_command(CLI::App& app, const std::string& name, const std::string& description, RunOptions& run);

}  // namespace fax::cli
