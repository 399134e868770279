#include <cstdio>
#include <cstdlib>
#include <memory>

#include <ATen/Context.h>
#include <CLI/CLI.hpp>

#include <fax/base/error.h>
#include <fax/io/config_yaml.h>
#include <fax/io/files.h>
#include <fax/runtime/experiment.h>
#include <fax/runtime/worker.h>

#include "commands.h"
#include "options.h"
#include "setup.h"

namespace fax::cli {
namespace {

// Everything a worker's experiment refers to, kept alive while it serves tasks.
struct WorkerExperiment {
  ExperimentSetup setup;
  std::unique_ptr<FederatedDataset> data;
  std::unique_ptr<Model> model;
  Plugin::Instance algorithm;
  std::unique_ptr<Experiment> experiment;
};

}  // namespace

std::string read_token(const std::string& file) {
  std::string token;
  if (!file.empty()) {
    const std::string text = read_regular_file(file, size_t{1} << 20, "the token file (--token-file)");
    token = text.substr(0, text.find('\n'));
    while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
    FAX_CHECK(!token.empty(), "--token-file {}: the first line (the token) is empty", file);
  } else if (const char* env = std::getenv("FAX_TOKEN")) {
    token = env;
  }
  return token;
}

int worker_command(const WorkerCommandOptions& options) {
  const PluginLoader loader(options.plugin_dirs);
  fax::WorkerOptions o;
  o.connect = options.connect;
  o.token = read_token(options.token_file);
  o.connect_timeout_s = options.connect_timeout_s;
  o.name = options.name;
  if (!options.quiet) {
    o.log = [](const std::string& line) {
      std::printf("fax-run worker: %s\n", line.c_str());
      std::fflush(stdout);
    };
  }
  run_worker(o, [&](const std::string& experiment) {
    auto w = std::make_shared<WorkerExperiment>();
    w->setup = resolve_experiment(parse_config(experiment, options.connect + ":/config"), loader);
    const Config& config = w->setup.config;
    // This thread runs the tasks. Its mode is set before the data set and model are built: their
    // kernels start its OpenMP team, whose threads keep the mode they start with.
    at::globalContext().setFlushDenormal(config.get_bool("execution.flush_denormals"));
    w->data = w->setup.dataset->create(config);
    w->model = w->setup.model->create(config, model_shape(*w->data));
    w->algorithm = w->setup.plugin->create();
    w->experiment = std::make_unique<Experiment>(config, *w->algorithm, *w->model, *w->data);
    w->experiment->init();
    WorkerSetup ws;
    ws.threads = static_cast<int>(config.get_int("execution.threads"));
    ws.vectorize = w->experiment->mesh_options().vectorize;  // the model may choose it
    ws.identity = experiment_identity(w->setup, *w->data, *w->model);
    Experiment* e = w->experiment.get();
    ws.run = [e](Program& p, TaskKind kind, const TensorTree& input) {
      return kind == kAllreduceProbe ? allreduce_probe(p, input) : e->serve(p, kind, input);
    };
    ws.keep_alive = w;
    return ws;
  });
  return 0;
}

Subcommand add_worker_subcommand(CLI::App& app) {
  auto o = std::make_shared<WorkerCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "worker", "serve a coordinator ('fax-run run ... --workers N'): run its rounds on this machine's share of the cohort");
  cmd->add_option("--connect", o->connect, "the coordinator's address")->required()->type_name("HOST:PORT");
  add_token_option(*cmd, o->token_file);
  add_plugin_dir_option(*cmd, o->plugin_dirs);
  cmd->add_option("--connect-timeout", o->connect_timeout_s,
                         "seconds to keep trying to reach the coordinator (default: 60)")
      ->check(CLI::Range(0.1, 86400.0))->type_name("S");
  cmd->add_option("--name", o->name, "this worker's name in the coordinator's log (default: host:pid)");
  cmd->add_flag("-q,--quiet", o->quiet, "no progress output");
  return {cmd, [o] { return worker_command(*o); }};
}

}  // namespace fax::cli
