// fax-run bench: speed and memory measured against the machine in one run. The GEMM peak is the
// yardstick; each model case reports its round time and its model FLOP/s as a share of that peak.

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include <CLI/CLI.hpp>

#include <fax/base/error.h>
#include <fax/base/version.h>
#include <fax/io/config_yaml.h>
#include <fax/io/files.h>
#include <fax/nn/layers.h>
#include <fax/runtime/coordinator.h>
#include <fax/runtime/experiment.h>
#include <fax/runtime/worker.h>
#include <fax/train/local_training.h>

#include "bench_loop.h"
#include "commands.h"
#include "options.h"
#include "setup.h"
#include "shell_word.h"

namespace fax::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double median(std::vector<double> v) {
  FAX_CHECK(!v.empty(), "bench: nothing was timed");
  std::sort(v.begin(), v.end());
  const size_t half = v.size() / 2;
  return v.size() % 2 == 1 ? v[half] : (v[half - 1] + v[half]) / 2;
}

// Median wall time of `repeats` calls of `fn`, after one untimed warm-up call.
template <class F>
double median_seconds(int repeats, F&& fn) {
  fn();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = Clock::now();
    fn();
    times.push_back(seconds_since(start));
  }
  return median(times);
}

// The fastest float32 matrix product LibTorch offers here: OpenBLAS through at::mm, and oneDNN,
// the faster of mkldnn_linear on blocked tensors and its sgemm (what fax::batched_matmul calls).
// FLOP/s of an n x n x n product.
struct GemmPeak {
  double openblas = 0;
  double onednn = 0;
  double best() const { return std::max(openblas, onednn); }
};

GemmPeak measure_gemm_peak(int threads) {
  constexpr int64_t n = 2048;
  const double flops = 2.0 * n * n * n;
  at::set_num_threads(threads);
  const at::Tensor a = at::randn({n, n});
  const at::Tensor b = at::randn({n, n});
  GemmPeak peak;
  peak.openblas = flops / median_seconds(5, [&] { at::mm(a, b); });
  if (at::hasMKLDNN()) {
    const at::Tensor am = a.to_mkldnn();
    const at::Tensor bm = b.t().contiguous().to_mkldnn();
    peak.onednn = flops / median_seconds(5, [&] { at::mkldnn_linear(am, bm, {}); });
  }
  peak.onednn = std::max(peak.onednn, flops / median_seconds(5, [&] { fax::batched_matmul(a, b); }));
  return peak;
}

// Peak resident set of this process (VmHWM), in MiB.
double peak_rss_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

// One bench experiment, described as YAML keys; everything else is fax's defaults.
struct Case {
  std::string data;   ///< the data: block
  std::string model;  ///< the model: block
  int64_t cohort = 64;
  int executors = 1;
  int64_t shards = 1;
  int64_t vectorize = 0;
  int rounds = 5;  ///< timed rounds; one more before (warm-up) and after (evaluation)
  bool factor_input_layer = true;
  int64_t batch = 10;
  /// > 0: FedBuff, this many clients in flight on a simulated clock (lognormal speeds), a server
  /// step every `cohort` arrivals.
  int64_t concurrency = 0;
  int threads = 1;  ///< execution.threads (0: automatic)
  double lr = 0.05;
  double momentum = 0;
  int64_t local_epochs = 1;

  std::string yaml() const {
    const std::string asynchronous =
        concurrency > 0 ? fmt::format("  concurrency: {}\nclients:\n  speed: {{distribution: lognormal, sigma: 1}}\n", concurrency)
                        : "";
    return fmt::format(
        "seed: 0\nrounds: {}\ncohort:\n  size: {}\n{}data:\n{}model:\n{}algorithm:\n  name: {}\n  client_lr: {}\n"
        "  client_momentum: {}\n  local_epochs: {}\n  batch_size: {}\nexecution:\n  executors: {}\n"
        "  logical_shards: {}\n  threads: {}\n  vectorize: {}\n  factor_input_layer: {}\nlogging:\n  eval_every: 0\n"
        "  checkpoint_every: 0\n",
        rounds + 2, cohort, asynchronous, data, model, concurrency > 0 ? "fedbuff" : "fedavg", lr, momentum,
        local_epochs, batch, executors, shards, threads, vectorize, factor_input_layer);
  }
};

struct Timing {
  double round_s = 0;
  double examples = 0;  ///< trained per round
  double flops = 0;     ///< model FLOPs per round (forward + backward = 3 forward)
  int64_t tokens_per_example = 1;
  double masked_share = 0;  ///< of the batch rows local training computed, those on no example (masked)
};

double round_seconds(double s) { return s; }
double round_seconds(const Timing& t) { return t.round_s; }

// Three (fax, baseline) measurements, alternated so that a noisy neighbour slows both sides alike:
// the pair whose ratio fax / baseline is the median.
template <class Fax, class Baseline>
auto median_pair(Fax&& fax, Baseline&& baseline) {
  std::vector<std::pair<decltype(fax()), double>> pairs;
  for (int i = 0; i < 3; ++i) {
    auto first = fax();
    pairs.emplace_back(std::move(first), baseline());
  }
  const auto ratio = [](const auto& p) { return round_seconds(p.first) / p.second; };
  std::sort(pairs.begin(), pairs.end(), [&](const auto& a, const auto& b) { return ratio(a) < ratio(b); });
  return pairs[1];
}

const char* const kFmnist = "  name: fmnist\n  partition: iid\n  clients: 600\n";
// The workload of experiments/fmnist_fedavg.yaml: label skew, every client 100 examples (Hsu et
// al.); and Li et al.'s label Dirichlet, whose client sizes are ragged.
const char* const kFmnistDirichlet = "  name: fmnist\n  partition: dirichlet\n  alpha: 0.5\n  clients: 600\n";
const char* const kFmnistLabelDirichlet = "  name: fmnist\n  partition: label_dirichlet\n  alpha: 0.5\n  clients: 600\n";
// The non-IID benchmark's cell (experiments/niid_bench/fmnist.yaml).
const char* const kFmnistCell = "  name: fmnist\n  partition: label_dirichlet\n  alpha: 0.5\n  clients: 10\n";
const char* const kFmnistLarge = "  name: fmnist\n  partition: iid\n  clients: 2048\n";
// The most clients Fashion-MNIST's 60,000 training examples give at 10 each.
const char* const kFmnistMany = "  name: fmnist\n  partition: iid\n  clients: 6000\n";
const char* const kTokens = "  name: synthetic_tokens\n  clients: 64\n  sequences: 32\n  sequence_length: 64\n  vocab: 256\n";
const char* const kMlp = "  name: mlp\n";
const char* const kCnn = "  name: cnn\n";
const char* const kTransformer = "  name: transformer\n  depth: 2\n  width: 256\n  heads: 4\n";

// `fax-run worker` processes of this binary on loopback; they exit when their coordinator ends.
class WorkerProcesses {
 public:
  WorkerProcesses(int n, const std::string& address, const std::string& token, const std::vector<std::string>& plugin_dirs) {
    const std::string exe = fmt::format("/proc/{}/exe", ::getpid());
    std::vector<std::string> args{exe, "worker", "-q", "--connect", address};
    for (const auto& dir : plugin_dirs) {
      args.push_back("--plugin-dir");
      args.push_back(dir);
    }
    for (int i = 0; i < n; ++i) {
      const pid_t pid = ::fork();
      FAX_CHECK(pid >= 0, "bench: cannot start a worker process");
      if (pid == 0) {
        ::setenv("FAX_TOKEN", token.c_str(), 1);
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        ::execv(exe.c_str(), argv.data());
        ::_exit(127);
      }
      pids_.push_back(pid);
    }
  }
  ~WorkerProcesses() {
    for (pid_t pid : pids_) ::waitpid(pid, nullptr, 0);
  }
  WorkerProcesses(const WorkerProcesses&) = delete;
  WorkerProcesses& operator=(const WorkerProcesses&) = delete;

 private:
  std::vector<pid_t> pids_;
};

// A coordinator on loopback and its worker processes, ready. Members are destroyed in reverse:
// the coordinator says goodbye before the worker processes are reaped.
struct RemoteWorkers {
  std::unique_ptr<WorkerProcesses> processes;
  std::unique_ptr<Coordinator> coordinator;

  RemoteWorkers() = default;
  RemoteWorkers(int workers, std::string experiment, const std::vector<std::string>& plugin_dirs,
                Collectives collectives) {
    CoordinatorOptions o;
    o.workers = workers;
    o.collectives = collectives;
    o.token = fmt::format("bench-{}-{}", ::getpid(), Clock::now().time_since_epoch().count());
    o.experiment = std::move(experiment);
    coordinator = std::make_unique<Coordinator>(o);
    processes = std::make_unique<WorkerProcesses>(workers, coordinator->address(), o.token, plugin_dirs);
    coordinator->wait_for_workers();
  }
};

class Bench {
 public:
  Bench(const PluginLoader& loader, std::vector<std::string> plugin_dirs)
      : loader_(loader), loader_dirs_(std::move(plugin_dirs)) {}

  // Median round time of `c` (the warm-up and the evaluating last round excluded), on local
  // executor threads or, with `workers` > 0, on that many `fax-run worker` processes.
  Timing time(const Case& c, int workers = 0, Collectives collectives = Collectives::tensorpipe) {
    const Prepared p = prepare(c);
    const FederatedDataset& data = *p.data;
    auto algorithm = p.setup.plugin->create();
    RemoteWorkers remote;
    if (workers > 0) remote = RemoteWorkers(workers, config_to_yaml(p.setup.config), loader_dirs_, collectives);
    Experiment experiment(p.setup.config, *algorithm, *p.model, data, remote.coordinator.get());
    std::vector<double> ends;
    const RowSteps before = local_training_row_steps();
    experiment.run(nullptr, [&](const RoundReport& r) { ends.push_back(r.elapsed_s); });
    const RowSteps after = local_training_row_steps();
    std::vector<double> rounds;
    for (size_t i = 1; i + 1 < ends.size(); ++i) rounds.push_back(ends[i] - ends[i - 1]);
    Timing t;
    t.round_s = median(rounds);
    t.examples = static_cast<double>(c.cohort * c.local_epochs) * mean_examples(data);
    t.tokens_per_example = data.input_shape().front();
    t.flops = 3.0 * static_cast<double>(p.model->forward_flops()) * t.examples;
    // Counted by local training on this process's executors (remote workers count in theirs).
    if (workers == 0 && after.computed > before.computed)
      t.masked_share = 1 - static_cast<double>(after.real - before.real) / static_cast<double>(after.computed - before.computed);
    return t;
  }

  // An asynchronous case (Case::concurrency): the wall time per server step, and the share of the
  // run's wall time outside its tasks (the simulated clock, the version store, packing the steps'
  // inputs). Like the other cases, not logged: a run log's writes are the log's cost (an
  // asynchronous checkpoint holds every version clients in flight started from).
  struct AsyncTiming {
    double step_s = 0;
    double outside_share = 0;
    double staleness = 0;  ///< the mean over the run's steps
  };
  AsyncTiming time_async(const Case& c) {
    const Prepared p = prepare(c);
    auto algorithm = p.setup.plugin->create();
    Experiment experiment(p.setup.config, *algorithm, *p.model, *p.data);
    double staleness = 0;
    const RunResult result = experiment.run(nullptr, [&](const RoundReport& r) {
      for (const auto& [name, v] : r.metrics)
        if (name == "async/staleness_mean") staleness += v;
    });
    const auto steps = static_cast<double>(result.rounds_done);
    return {result.seconds / steps, 1 - result.task_seconds / result.seconds, staleness / steps};
  }

  // The same clients' local training as a plain LibTorch loop, one client after another, with no
  // federated machinery: the baseline of the federated overhead.
  double plain_loop_round_s(const Case& c, int repeats) {
    const Prepared p = prepare(c);
    const FederatedDataset& data = *p.data;
    const Model* model = p.model.get();
    at::set_num_threads(1);
    const TensorTree start = model->init(at::make_generator<at::CPUGeneratorImpl>(0));
    const Cohort cohort = sample_cohort(data, c.cohort, 0, 0);
    const double lr = 0.05;
    const int64_t batch = 10;
    return median_seconds(repeats, [&] {
      TensorTree total = start.map([](const at::Tensor& t) { return at::zeros_like(t); });
      for (int64_t i = 0; i < cohort.size(); ++i) {
        const Examples ex = data.client(cohort.id(i));
        const at::Tensor order = at::randperm(ex.size(), at::kLong);
        std::vector<at::Tensor> params;
        for (const auto& [name, t] : start) params.push_back(t.clone().requires_grad_(true));
        for (int64_t b = 0; b < ex.size(); b += batch) {
          const at::Tensor idx = order.narrow(0, b, std::min(batch, ex.size() - b));
          const at::Tensor loss =
              cross_entropy(model->forward(start.with_tensors(params), ex.x.index_select(0, idx)), ex.y.index_select(0, idx))
                  .mean();
          const auto grads = torch::autograd::grad({loss}, params);
          at::NoGradGuard no_grad;
          for (size_t j = 0; j < params.size(); ++j) params[j] = (params[j] - lr * grads[j]).requires_grad_(true);
        }
        at::NoGradGuard no_grad;
        const TensorTree trained = start.with_tensors(params);
        total = axpy(static_cast<double>(ex.size()), sub(start, trained), total);
      }
    });
  }

  // The idiomatic LibTorch loop (bench_loop.h) over the clients of the rounds time(c) times, on
  // `threads` intra-op threads: the median round, after round 0 as a warm-up.
  double loop_round_s(const Case& c, LoopModel model, int threads) {
    const Prepared p = prepare(c);
    at::set_num_threads(threads);
    const auto round = loop_rounds(*p.data, c.cohort, std::move(model), c.batch, c.lr, c.local_epochs, c.momentum);
    int64_t r = 0;
    return median_seconds(c.rounds, [&] { round(r++); });
  }

  // The number of parameters of the case's model.
  int64_t parameters(const Case& c) {
    const Prepared p = prepare(c);
    int64_t n = 0;
    for (const auto& [name, t] : p.model->init(at::make_generator<at::CPUGeneratorImpl>(0))) n += t.numel();
    return n;
  }

  // Seconds per allreduce of `elements` float32 values per logical shard over 2 worker processes
  // (one shard each), through the coordinator or over Gloo.
  std::vector<double> allreduce_seconds(const std::vector<int64_t>& elements, Collectives collectives) {
    Case tiny{"  name: synthetic\n", "  name: softmax_regression\n", 10, 2, 2, 0, 1};
    const ExperimentSetup setup = resolve_experiment(parse_config(tiny.yaml(), "fax-run bench"), loader_);
    RemoteWorkers remote(2, config_to_yaml(setup.config), loader_dirs_, collectives);
    std::vector<double> out;
    for (int64_t n : elements) {
      const int64_t repeats = std::max<int64_t>(1, 30'000'000 / n);
      auto probe = [&](int64_t times) {
        const TensorTree input{{"elements", at::tensor(n)}, {"repeats", at::tensor(times)}};
        remote.coordinator->run(kAllreduceProbe, {}, Cohort::range(2), 2,
                                [&](int, const ShardLayout&) { return input; });
      };
      probe(1);
      const auto start = Clock::now();
      probe(repeats);
      out.push_back(seconds_since(start) / static_cast<double>(repeats));
    }
    return out;
  }

 private:
  struct Prepared {
    ExperimentSetup setup;
    const FederatedDataset* data;
    std::unique_ptr<Model> model;
  };

  // The case's resolved settings, its data set (loaded once per data block: Fashion-MNIST takes
  // seconds) and its model.
  Prepared prepare(const Case& c) {
    ExperimentSetup setup = resolve_experiment(parse_config(c.yaml(), "fax-run bench"), loader_);
    auto& slot = data_[c.data];
    if (!slot) slot = setup.dataset->create(setup.config);
    auto model = setup.model->create(setup.config, model_shape(*slot));
    return {std::move(setup), slot.get(), std::move(model)};
  }

  static double mean_examples(const FederatedDataset& data) {
    double total = 0;
    for (int64_t i = 0; i < data.num_clients(); ++i) total += static_cast<double>(data.num_examples(i));
    return total / static_cast<double>(data.num_clients());
  }

  const PluginLoader& loader_;
  std::vector<std::string> loader_dirs_;

  std::map<std::string, std::unique_ptr<FederatedDataset>> data_;
};

// Seconds per server step of FedBuff's timeline alone (AsyncSchedule on a lognormal clock, clients
// of 10 examples, the MLP's bits): `population` clients, `concurrency` in flight, a step every
// `buffer` arrivals, after a warm-up of 1,000 steps.
double async_schedule_step_s(int64_t population, int64_t concurrency, int64_t buffer, int steps) {
  SimulatedClock::Options o;
  o.speed = "lognormal";
  o.speed_sigma = 1;
  o.concurrency = concurrency;
  const SimulatedClock clock(o, 0);
  const int64_t bits = 32 * 199'210;
  AsyncSchedule schedule(clock, {concurrency, buffer, -1}, population, 0, [&](int64_t client, int64_t dispatch) {
    return clock.duration(client, dispatch, 10, bits, bits);
  });
  for (int i = 0; i < 1000; ++i) schedule.next();
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) schedule.next();
  return seconds_since(start) / steps;
}

// The number a child `fax-run bench ARGS --plugin-dir ...` prints: a case measured in a fresh process.
double probe(const std::string& args, const std::vector<std::string>& plugin_dirs) {
  std::string command = fmt::format("/proc/{}/exe bench {}", ::getpid(), args);
  for (const std::string& dir : plugin_dirs) command += " --plugin-dir " + shell_word(dir);  // popen runs a shell
  FILE* pipe = ::popen(command.c_str(), "r");
  FAX_CHECK(pipe != nullptr, "bench: cannot start '{}'", command);
  double value = 0;
  const int read = std::fscanf(pipe, "%lf", &value);
  const int status = ::pclose(pipe);
  FAX_CHECK(read == 1 && status == 0, "bench: '{}' failed (status {})", command, status);
  return value;
}

struct Row {
  std::string name;
  std::string value;
  std::string target;
};

// One MLP experiment over 2048 clients whose memory is probed at each cohort size.
Case rss_case(int64_t cohort) { return {kFmnistLarge, kMlp, cohort, 1, 1, 64, 1}; }

// A cohort smaller than the cores (FedAsync's one client a step): one logical shard and executor.
Case small_cohort_case(bool cnn, int threads, bool quick) {
  Case c{kFmnistDirichlet, cnn ? kCnn : kMlp, 1, 1, 1, 0, cnn ? (quick ? 12 : 20) : (quick ? 80 : 160)};
  c.batch = 20;
  c.threads = threads;
  return c;
}

}  // namespace

TensorTree allreduce_probe(Program& program, const TensorTree& input) {
  const at::Tensor x = at::ones({input.at("elements").item<int64_t>()});
  std::vector<ShardPartial> partials;
  const Range shards = program.local_shards();
  for (int64_t s = shards.begin; s < shards.end; ++s) partials.push_back({s, {x}});
  for (int64_t r = input.at("repeats").item<int64_t>(); r > 0; --r) program.communicator().allreduce_sum(partials);
  return {};
}

int bench_command(const BenchOptions& options) {
  const PluginLoader loader(options.plugin_dirs);
  Bench bench(loader, options.plugin_dirs);
  if (options.rss_probe > 0) {
    bench.time(rss_case(options.rss_probe));
    std::printf("%.1f\n", peak_rss_mib());
    return 0;
  }
  if (!options.small_cohort_probe.empty()) {
    const bool cnn = options.small_cohort_probe.rfind("cnn", 0) == 0;
    const int threads = options.small_cohort_probe.back() == '0' ? 0 : 1;
    std::printf("%.9f\n", bench.time(small_cohort_case(cnn, threads, options.quick)).round_s);
    return 0;
  }
  const std::string output = resolve_output(options.output);
  check_output_path(output, {}, "the bench results");
  const FileLock lock(output, "fax-run bench");
  check_replaceable_run_log(output);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int executors = options.executors > 0 ? options.executors : cores;
  // Rounds of a fraction of a second: time enough of them for a stable median. MLP rounds take a
  // few hundredths of a second: more of them.
  const int rounds = options.quick ? 7 : 15;
  const int mlp_rounds = options.quick ? 20 : 40;
  auto say = [&](const std::string& what) {
    std::printf("bench: %s\n", what.c_str());
    std::fflush(stdout);
  };

  say("GEMM peak (2048^3 float32, median of 5)");
  const GemmPeak first_peak = measure_gemm_peak(executors);

  say("MLP on Fashion-MNIST, cohort 64: vectorized, then one client at a time");
  const Timing mlp = bench.time({kFmnist, kMlp, 64, executors, executors, 0, mlp_rounds});
  const Timing mlp_loop = bench.time({kFmnist, kMlp, 64, executors, executors, 1, mlp_rounds});

  say("CNN on Fashion-MNIST, cohort 64");
  // Three timed rounds at least: the median of three sets one slow round aside.
  const int long_rounds = options.quick ? 3 : 5;
  const Timing cnn = bench.time({kFmnist, kCnn, 64, executors, executors, 0, long_rounds});

  say("transformer LM (2 x 256, context 64) on synthetic tokens, cohort 16");
  const Timing lm = bench.time({kTokens, kTransformer, 16, executors, executors, 0, long_rounds});

  // The peak once more after the model cases, the larger of each kept: a neighbour busy during one
  // measurement would otherwise lower the yardstick and lift every MFU (this shared VM: 108 to 184
  // GFLOP/s for OpenBLAS between runs).
  say("GEMM peak again, after the model cases");
  const GemmPeak second_peak = measure_gemm_peak(executors);
  const GemmPeak peak{std::max(first_peak.openblas, second_peak.openblas), std::max(first_peak.onednn, second_peak.onednn)};
  Metrics m{{"gemm/openblas_gflops", peak.openblas / 1e9}, {"gemm/onednn_gflops", peak.onednn / 1e9}};
  auto record = [&](const std::string& name, const Timing& t) {
    m.emplace_back(name + "/round_s", t.round_s);
    m.emplace_back(name + "/gflops_per_round", t.flops / 1e9);
    m.emplace_back(name + "/mfu_openblas", t.flops / t.round_s / peak.openblas);
    m.emplace_back(name + "/mfu_best", t.flops / t.round_s / peak.best());
  };
  record("mlp", mlp);
  record("mlp_loop", mlp_loop);
  m.emplace_back("mlp/clients_per_s", 64 / mlp.round_s);
  m.emplace_back("mlp/vectorize_speedup", mlp_loop.round_s / mlp.round_s);
  record("cnn", cnn);
  m.emplace_back("cnn/clients_per_s", 64 / cnn.round_s);
  record("lm", lm);
  m.emplace_back("lm/tokens_per_s", lm.examples * static_cast<double>(lm.tokens_per_example) / lm.round_s);

  // Weak scaling: the same work per executor, 1 executor vs 2. The MLP is bound by memory
  // bandwidth, which the executors share; the CNN by arithmetic, which they do not.
  say("weak scaling: 1 executor with cohort c, 2 executors with cohort 2c (MLP c=32, CNN c=8)");
  // Twice the rounds: a ratio of two medians of short rounds on a shared machine is noisy.
  const double mlp_scaling = bench.time({kFmnist, kMlp, 32, 1, 1, 0, 2 * mlp_rounds}).round_s /
                             bench.time({kFmnist, kMlp, 64, 2, 2, 0, 2 * mlp_rounds}).round_s;
  const double cnn_scaling = bench.time({kFmnist, kCnn, 8, 1, 1, 0, 2 * rounds}).round_s /
                             bench.time({kFmnist, kCnn, 16, 2, 2, 0, 2 * rounds}).round_s;
  m.emplace_back("scaling/mlp_weak_efficiency", mlp_scaling);
  m.emplace_back("scaling/cnn_weak_efficiency", cnn_scaling);

  say("remote: MLP cohort 64 on 2 worker processes (TensorPipe, Gloo) vs 2 executor threads, loopback");
  const Case remote_case{kFmnist, kMlp, 64, 2, 2, 0, mlp_rounds};
  const Timing mlp_remote = bench.time(remote_case, 2);
  const Timing mlp_gloo = bench.time(remote_case, 2, Collectives::gloo);
  // Threads timed right after the processes, not reused from the MLP case: the machine drifts.
  const Timing mlp_threads = bench.time(remote_case);
  m.emplace_back("remote/mlp_round_s", mlp_remote.round_s);
  m.emplace_back("remote/mlp_gloo_round_s", mlp_gloo.round_s);
  m.emplace_back("remote/mlp_threads_round_s", mlp_threads.round_s);
  m.emplace_back("remote/ratio", mlp_remote.round_s / mlp_threads.round_s);
  m.emplace_back("remote/gloo_ratio", mlp_gloo.round_s / mlp_threads.round_s);

  // Both data planes at model sizes 1e5 .. 1e8: the allreduce alone, and a FedAvg round of a
  // transformer LM of that size on 2 clients (one per worker) with one 8-token sequence each, so
  // that the round is mostly the model's way to the workers and back, not compute.
  const std::vector<int64_t> sizes{100'000, 1'000'000, 10'000'000, 100'000'000};
  std::vector<Case> lm_cases;
  for (const auto& [depth, width] : {std::pair{1, 80}, {1, 288}, {2, 644}, {2, 2040}}) {
    lm_cases.push_back({"  name: synthetic_tokens\n  clients: 2\n  sequences: 2\n  sequence_length: 8\n  vocab: 256\n",
                        fmt::format("  name: transformer\n  depth: {}\n  width: {}\n  heads: 4\n", depth, width), 2,
                        2, 2, 0, 2});
  }
  std::string lm_sizes;
  for (size_t i = 0; i < lm_cases.size(); ++i) {
    const int64_t n = bench.parameters(lm_cases[i]);
    m.emplace_back(fmt::format("remote/lm_{:.0e}_parameters", static_cast<double>(sizes[i])), static_cast<double>(n));
    lm_sizes += fmt::format("{}{:.2g}", i > 0 ? ", " : "", static_cast<double>(n));
  }
  std::vector<Row> plane_rows;
  for (const auto& [collectives, name] : {std::pair{Collectives::tensorpipe, "tensorpipe"}, {Collectives::gloo, "gloo"}}) {
    say(fmt::format("remote ({}): allreduce of 1e5 .. 1e8 float32 and an LM round of {} parameters, 2 worker "
                    "processes",
                    name, lm_sizes));
    const std::vector<double> allreduce = bench.allreduce_seconds(sizes, collectives);
    std::string allreduce_row, round_row;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const double gbps = 4.0 * static_cast<double>(sizes[i]) / allreduce[i] / 1e9;
      const std::string size = fmt::format("{:.0e}", static_cast<double>(sizes[i]));
      m.emplace_back(fmt::format("remote/{}/allreduce_{}_s", name, size), allreduce[i]);
      m.emplace_back(fmt::format("remote/{}/allreduce_{}_gbps", name, size), gbps);
      allreduce_row += fmt::format("{}{:.3g} ms ({:.2f} GB/s)", i > 0 ? ", " : "", 1e3 * allreduce[i], gbps);
      const double round_s = bench.time(lm_cases[i], 2, collectives).round_s;
      m.emplace_back(fmt::format("remote/{}/round_{}_s", name, size), round_s);
      round_row += fmt::format("{}{:.3g}", i > 0 ? ", " : "", round_s);
    }
    plane_rows.push_back({fmt::format("{} allreduce 1e5, 1e6, 1e7, 1e8 floats", name), allreduce_row, ""});
    plane_rows.push_back({fmt::format("{} LM round (s), {} params", name, lm_sizes), round_row, ""});
  }

  say("peak RSS at cohort 64 and 2048 (MLP, vectorize 64, separate processes)");
  const double rss64 = probe("--rss-probe 64", options.plugin_dirs);
  const double rss2048 = probe("--rss-probe 2048", options.plugin_dirs);
  m.emplace_back("memory/rss_cohort64_mib", rss64);
  m.emplace_back("memory/rss_cohort2048_mib", rss2048);

  say("federated overhead: a FedAvg round vs a plain LibTorch loop over the same clients (MLP, 1 thread)");
  // The same arithmetic on both sides: fax steps every layer through autograd here, as the plain
  // loop does; the factored input layer (fax's default) is timed beside it.
  Case overhead_case{kFmnist, kMlp, 64, 1, 1, 1, rounds};
  overhead_case.factor_input_layer = false;
  const auto [fed_s, plain] = median_pair([&] { return bench.time(overhead_case).round_s; },
                                          [&] { return bench.plain_loop_round_s(overhead_case, rounds); });
  overhead_case.factor_input_layer = true;
  const double factored_s = bench.time(overhead_case).round_s;
  m.emplace_back("overhead/fedavg_round_s", fed_s);
  m.emplace_back("overhead/plain_loop_s", plain);
  m.emplace_back("overhead/ratio", fed_s / plain);
  m.emplace_back("overhead/factored_round_s", factored_s);

  say("FedBuff on the simulated clock (MLP, Fashion-MNIST in 6,000 clients of 10 examples, 1,000 in flight, a step "
      "every 10 arrivals): the share of the run outside its steps' model computation");
  Case fedbuff_case{kFmnistMany, kMlp, 10, 1, 1, 0, options.quick ? 300 : 1000};
  fedbuff_case.concurrency = 1000;
  const Bench::AsyncTiming fedbuff = bench.time_async(fedbuff_case);
  m.emplace_back("fedbuff/step_s", fedbuff.step_s);
  m.emplace_back("fedbuff/outside_share", fedbuff.outside_share);
  m.emplace_back("fedbuff/staleness_mean", fedbuff.staleness);
  // The timeline alone for a population of 100,000 (more clients than Fashion-MNIST can give 10
  // examples each): what grows with the population is the clock's, not the model's.
  const double schedule_step_s = async_schedule_step_s(100'000, 1000, 10, options.quick ? 2000 : 10000);
  m.emplace_back("fedbuff/schedule_step_100k_s", schedule_step_s);

  say("TorchScript MLP (a module compiled from TorchScript source): a FedAvg round vs the idiomatic LibTorch loop "
      "over the same clients (cohort 16, 1 thread)");
  const std::string module_file =
      (std::filesystem::temp_directory_path() / fmt::format("fax-bench-{}-mlp.pt", ::getpid())).string();
  save_torchscript_mlp(module_file);
  const Case torchscript_case{kFmnist, fmt::format("  name: torchscript\n  path: {}\n", module_file), 16, 1, 1, 0, rounds};
  const auto [torchscript_s, torchscript_loop_s] =
      median_pair([&] { return bench.time(torchscript_case).round_s; },
                  [&] { return bench.loop_round_s(torchscript_case, torchscript_model(module_file), 1); });
  std::filesystem::remove(module_file);
  m.emplace_back("torchscript/round_s", torchscript_s);
  m.emplace_back("torchscript/loop_round_s", torchscript_loop_s);
  m.emplace_back("torchscript/ratio", torchscript_s / torchscript_loop_s);

  // Every logical shard needs a client: at most 10 executors (the smaller cohort), at least 2 shards.
  const int peer_executors = std::min(executors, 10);
  const int64_t peer_shards = std::max(2, peer_executors);
  say(fmt::format("non-IID cohorts (Fashion-MNIST, 600 clients, Dirichlet(0.5) and label Dirichlet(0.5), B = 20, {} "
                  "logical shards): a FedAvg round on {} executor(s) vs the idiomatic LibTorch loop (torch::nn, "
                  "torch::optim::SGD) on {} threads",
                  peer_shards, peer_executors, peer_executors));
  std::vector<Row> peer_rows;
  for (const auto& [ragged, cnn, cohort, target] :
       {std::tuple{false, false, 10, 5.0}, {false, false, 64, 5.0}, {false, true, 10, 2.5}, {false, true, 64, 4.0},
        {true, false, 10, 5.0}, {true, false, 64, 5.0}, {true, true, 10, 2.5}}) {
    Case peer{ragged ? kFmnistLabelDirichlet : kFmnistDirichlet, cnn ? kCnn : kMlp, cohort, peer_executors, peer_shards, 0,
              cnn ? long_rounds : mlp_rounds};
    peer.batch = 20;
    const LoopNet net = cnn ? LoopNet::cnn : LoopNet::mlp;
    const auto [fax_run, loop_s] = median_pair([&] { return bench.time(peer); },
                                               [&] { return bench.loop_round_s(peer, torch_nn_model(net), peer_executors); });
    const std::string name = fmt::format("peer/{}_c{}{}", cnn ? "cnn" : "mlp", cohort, ragged ? "_label_dirichlet" : "");
    m.emplace_back(name + "/round_s", fax_run.round_s);
    m.emplace_back(name + "/loop_round_s", loop_s);
    m.emplace_back(name + "/speedup", loop_s / fax_run.round_s);
    m.emplace_back(name + "/masked_share", fax_run.masked_share);
    peer_rows.push_back({fmt::format("{} c={} {}Dir(0.5), loop / fax", cnn ? "CNN" : "MLP", cohort, ragged ? "label " : ""),
                         fmt::format("{:.3f} / {:.3f} s ({:.2f}x)", loop_s, fax_run.round_s, loop_s / fax_run.round_s),
                         fmt::format(">= {:.1f}x", target)});
    peer_rows.push_back({"  masked share of row-steps", fmt::format("{:.1f}%", 100 * fax_run.masked_share), "<= 15%"});
  }

  // The non-IID benchmark's cell as its sweep runs it (experiments/niid_bench/fmnist.yaml: LeNet,
  // the 10 clients all in every round, B = 64, SGD with momentum 0.9 and lr 0.01) on one executor
  // and one thread, against the 1-thread GEMM peak. One local epoch a round, not the cell's 10: the
  // same steps in a tenth of the time. The cell's core-minutes are projected: 10 epochs x 50 rounds.
  constexpr int64_t kCellEpochs = 10;
  constexpr int64_t kCellRounds = 50;
  say("the non-IID benchmark's cell (LeNet, 10 label-Dirichlet(0.5) clients, B = 64, momentum 0.9), one local "
      "epoch a round: a FedAvg round vs the idiomatic LibTorch loop, 1 thread each; the 1-thread GEMM peak");
  const GemmPeak one_thread_peak = measure_gemm_peak(1);
  Case cell{kFmnistCell, "  name: lenet\n", 10, 1, 1, 0, long_rounds};
  cell.batch = 64;
  cell.lr = 0.01;
  cell.momentum = 0.9;
  int64_t loop_parameters = 0;
  for (const at::Tensor& p : torch_nn_model(LoopNet::lenet).params) loop_parameters += p.numel();
  const int64_t fax_parameters = bench.parameters(cell);
  FAX_CHECK(loop_parameters == fax_parameters, "bench: the LibTorch LeNet has {} parameters, fax's lenet {}",
            loop_parameters, fax_parameters);
  const auto [cell_run, cell_loop_s] = median_pair(
      [&] { return bench.time(cell); }, [&] { return bench.loop_round_s(cell, torch_nn_model(LoopNet::lenet), 1); });
  const double cell_core_min = cell_run.round_s * kCellEpochs * kCellRounds / 60;
  const double cell_mfu = cell_run.flops / cell_run.round_s / one_thread_peak.best();
  m.emplace_back("niid_cell/round_s", cell_run.round_s);
  m.emplace_back("niid_cell/loop_round_s", cell_loop_s);
  m.emplace_back("niid_cell/speedup", cell_loop_s / cell_run.round_s);
  m.emplace_back("niid_cell/examples_per_s", cell_run.examples / cell_run.round_s);
  m.emplace_back("niid_cell/gemm_one_thread_best_gflops", one_thread_peak.best() / 1e9);
  m.emplace_back("niid_cell/mfu_one_thread_best", cell_mfu);
  m.emplace_back("niid_cell/core_min", cell_core_min);
  peer_rows.push_back({"LeNet non-IID cell, E=1 round: loop / fax",
                       fmt::format("{:.3f} / {:.3f} s ({:.2f}x)", cell_loop_s, cell_run.round_s, cell_loop_s / cell_run.round_s),
                       ""});
  peer_rows.push_back({"  examples/s, MFU (1-thread best peak)",
                       fmt::format("{:.0f}, {:.1f}% of {:.1f} GFLOP/s", cell_run.examples / cell_run.round_s, 100 * cell_mfu,
                                   one_thread_peak.best() / 1e9),
                       ""});
  peer_rows.push_back({"  the cell (E=10, 50 rounds), core-minutes", fmt::format("{:.1f}", cell_core_min), "<= 10"});

  // On 1 intra-op thread and on automatic threads (execution.threads 0: all the cores), each in a
  // fresh process, as `fax-run run` is: in this one, the thread pools earlier cases left behind
  // slow a multi-threaded executor down (experiments/bench/RESULTS.md).
  const int automatic = automatic_threads(1);
  say(fmt::format("small cohorts: 1 client a round (Dirichlet(0.5), B = 20), 1 logical shard on 1 executor, 1 "
                  "intra-op thread vs automatic ({}), fresh processes", automatic));
  for (const bool cnn : {false, true}) {
    const std::string model = cnn ? "cnn" : "mlp";
    const std::string quick = options.quick ? " --quick" : "";
    const auto [single_s, automatic_s] = median_pair(
        [&] { return probe(fmt::format("--small-cohort-probe {}:1{}", model, quick), options.plugin_dirs); },
        [&] { return probe(fmt::format("--small-cohort-probe {}:0{}", model, quick), options.plugin_dirs); });
    const std::string name = fmt::format("small_cohort/{}", cnn ? "cnn" : "mlp");
    m.emplace_back(name + "/one_thread_round_s", single_s);
    m.emplace_back(name + "/automatic_round_s", automatic_s);
    m.emplace_back(name + "/automatic_threads", automatic);
    m.emplace_back(name + "/speedup", single_s / automatic_s);
    peer_rows.push_back({fmt::format("{} c=1, 1 thread / automatic ({})", cnn ? "CNN" : "MLP", automatic),
                         fmt::format("{:.4f} / {:.4f} s ({:.2f}x)", single_s, automatic_s, single_s / automatic_s), ""});
  }

  auto get = [&](const std::string& name) {
    for (const auto& [k, v] : m)
      if (k == name) return v;
    throw Error("bench: no metric " + name);
  };
  auto pct = [](double x) { return fmt::format("{:.1f}%", 100 * x); };
  std::vector<Row> rows{
      {"GEMM peak OpenBLAS / oneDNN (GFLOP/s)",
       fmt::format("{:.1f} / {:.1f}", peak.openblas / 1e9, peak.onednn / 1e9), ""},
      {"MLP c=64 round (s), clients/s", fmt::format("{:.3f}, {:.0f}", mlp.round_s, get("mlp/clients_per_s")), ""},
      {"MLP c=64 MFU (OpenBLAS / best peak)", pct(get("mlp/mfu_openblas")) + " / " + pct(get("mlp/mfu_best")), ">= 40%"},
      {"MLP per-client loop MFU (OpenBLAS / best peak)",
       pct(get("mlp_loop/mfu_openblas")) + " / " + pct(get("mlp_loop/mfu_best")), ""},
      {"MLP vectorized vs loop", fmt::format("{:.2f}x", get("mlp/vectorize_speedup")), ">= 4x"},
      {"CNN c=64 round (s), clients/s", fmt::format("{:.3f}, {:.1f}", cnn.round_s, get("cnn/clients_per_s")), ""},
      {"CNN c=64 MFU (OpenBLAS / best peak)", pct(get("cnn/mfu_openblas")) + " / " + pct(get("cnn/mfu_best")), ">= 60%"},
      {"LM round (s), tokens/s", fmt::format("{:.3f}, {:.0f}", lm.round_s, get("lm/tokens_per_s")), ""},
      {"LM MFU (OpenBLAS / best peak)", pct(get("lm/mfu_openblas")) + " / " + pct(get("lm/mfu_best")), ">= 60%"},
      {"weak scaling, MLP (1 x 32 vs 2 x 64)", fmt::format("{:.2f}", mlp_scaling), ">= 0.90"},
      {"weak scaling, CNN (1 x 8 vs 2 x 16)", fmt::format("{:.2f}", cnn_scaling), ">= 0.90"},
      {"peak RSS cohort 64 / 2048 (MiB)", fmt::format("{:.0f} / {:.0f} ({:.2f}x)", rss64, rss2048, rss2048 / rss64),
       "<= 1.5x"},
      {"remote MLP c=64, 2 processes / 2 threads",
       fmt::format("{:.3f} / {:.3f} ({:.2f}x)", mlp_remote.round_s, mlp_threads.round_s, get("remote/ratio")), "<= 1.2x"},
      {"  same, allreduces over Gloo",
       fmt::format("{:.3f} / {:.3f} ({:.2f}x)", mlp_gloo.round_s, mlp_threads.round_s, get("remote/gloo_ratio")),
       "<= 1.2x"},
      {"federated overhead (FedAvg / plain loop)",
       fmt::format("{:.3f} / {:.3f} s ({:.2f}x)", fed_s, plain, fed_s / plain), "<= 1.10x"},
      {"  same, factored input layer / plain loop",
       fmt::format("{:.3f} / {:.3f} s ({:.2f}x)", factored_s, plain, factored_s / plain), ""},
      {"FedBuff 6k clients C=1000 K=10: step, outside",
       fmt::format("{:.2f} ms, {} (staleness {:.0f})", 1e3 * fedbuff.step_s, pct(fedbuff.outside_share), fedbuff.staleness),
       "<= 5%"},
      {"  its timeline alone, 100k clients (share)",
       fmt::format("{:.1f} us/step ({})", 1e6 * schedule_step_s, pct(schedule_step_s / fedbuff.step_s)), ""},
      {"TorchScript MLP c=16, fax / LibTorch loop",
       fmt::format("{:.3f} / {:.3f} s ({:.2f}x)", torchscript_s, torchscript_loop_s, torchscript_s / torchscript_loop_s),
       "<= 1.15x"},
  };
  rows.insert(rows.end() - 3, plane_rows.begin(), plane_rows.end());
  rows.insert(rows.end(), peer_rows.begin(), peer_rows.end());
  std::printf("\nfax-run bench %s, %d executor(s), %d hardware threads%s\n", FAX_VERSION, executors, cores,
              options.quick ? ", --quick" : "");
  for (const auto& r : rows) std::printf("  %-46s %-28s %s\n", r.name.c_str(), r.value.c_str(), r.target.c_str());

  RunLog log(output, fmt::format("bench: {{quick: {}, executors: {}}}\n", options.quick, executors),
             {{"fax_version", FAX_VERSION}, {"hardware_threads", std::to_string(cores)}});
  log.append(1, m);
  log.commit();
  std::printf("  written to %s (fax-run inspect %s)\n", output.c_str(), output.c_str());
  return 0;
}

Subcommand add_bench_subcommand(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "measure speed and memory against this machine's GEMM peak; print a table and write it to HDF5");
  cmd->add_flag("--quick", o->quick, "fewer timed rounds (the whole bench in a few minutes)");
  cmd->add_option("--executors", o->executors, "executor threads (default: one per hardware thread)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("-o,--output", o->output, "the HDF5 file to write (default: bench.h5)")->type_name("BENCH.h5");
  add_plugin_dir_option(*cmd, o->plugin_dirs);
  cmd->add_option("--rss-probe", o->rss_probe)->group("")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--small-cohort-probe", o->small_cohort_probe)
      ->group("")
      ->check(CLI::IsMember({"mlp:0", "mlp:1", "cnn:0", "cnn:1"}));
  return {cmd, [o] { return bench_command(*o); }};
}

}  // namespace fax::cli
