#include <cstdio>
#include <cstdlib>

#include <fax/error.h>
#include <fax/experiment.h>
#include <fax/files.h>
#include <fax/remote.h>

#include "commands.h"
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

int worker_command(const WorkerOptions& options) {
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
    w->setup = resolve_experiment(Config::from_yaml(experiment, options.connect + ":/config"), loader);
    const Config& config = w->setup.config;
    w->data = w->setup.dataset->create(config);
    w->model = w->setup.model->create(config, {w->data->input_shape(), w->data->num_classes()});
    w->algorithm = w->setup.plugin->create();
    w->experiment = std::make_unique<Experiment>(config, *w->algorithm, *w->model, *w->data);
    w->experiment->init();
    WorkerSetup ws;
    ws.threads = static_cast<int>(config.get_int("execution.threads"));
    ws.vectorize = config.get_int("execution.vectorize");
    ws.identity = experiment_identity(w->setup, *w->data, *w->model);
    Experiment* e = w->experiment.get();
    ws.run = [e](Program& p, TaskKind kind, const TensorTree& input) { return e->serve(p, kind, input); };
    ws.keep_alive = w;
    return ws;
  });
  return 0;
}

}  // namespace fax::cli
