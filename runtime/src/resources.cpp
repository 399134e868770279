#include <fax/runtime/resources.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <thread>

#include <fax/base/error.h>
#include <fax/train/aggregation.h>
#include <fax/runtime/experiment.h>

namespace fax {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

int64_t add(std::initializer_list<int64_t> terms) {
  int64_t out = 0;
  for (int64_t t : terms)
    if (__builtin_add_overflow(out, std::max<int64_t>(t, 0), &out)) return kMax;
  return out;
}

int64_t mul(std::initializer_list<int64_t> factors) {
  int64_t out = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(out, std::max<int64_t>(f, 0), &out)) return kMax;
  return out;
}

int64_t setting_or(const Config& config, const std::string& key, int64_t fallback) {
  return config.has(key) ? config.get_int(key) : fallback;
}

// The first number of a file (cgroup limits and usage), or -1 ("max", missing).
int64_t read_number(const std::string& path) {
  std::ifstream in(path);
  int64_t value = -1;
  if (!(in >> value)) return -1;
  return value;
}

// MemAvailable of /proc/meminfo, in bytes; -1 when unknown.
int64_t mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    int64_t kib = -1;
    fields >> kib;
    return kib < 0 ? -1 : kib * 1024;
  }
  return -1;
}

// Batches of this many examples when a plugin trains on whole local data sets (batch_size 0) or
// has no batch size: the estimate needs some width.
constexpr int64_t kUnknownBatch = 1024;
// The evaluation's batch (experiment.cpp).
constexpr int64_t kEvalBatch = 1024;
// Copies of the parameters a round keeps: the server state and an optimizer's moments, the round's
// inputs and outputs.
constexpr int64_t kStateCopies = 6;
// Per client of a chunk: its parameters, their gradients, the new parameters; per example: the
// forward values, their gradients and temporaries.
constexpr int64_t kClientCopies = 3;

}  // namespace

int64_t ResourceEstimate::total_bytes() const { return add({data_bytes, model_bytes, chunk_bytes}); }

std::string format_bytes(int64_t bytes) {
  if (bytes == kMax) return "more than 9 EB";
  const char* units[] = {"bytes", "KB", "MB", "GB", "TB", "PB", "EB"};
  double v = static_cast<double>(bytes);
  size_t u = 0;
  while (v >= 1000 && u + 1 < std::size(units)) {
    v /= 1000;
    ++u;
  }
  return u == 0 ? fmt::format("{} bytes", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

std::string ResourceEstimate::describe() const {
  return fmt::format("data {}, model {}, local training {}, {} threads", format_bytes(data_bytes),
                     format_bytes(model_bytes), format_bytes(chunk_bytes), threads);
}

ResourceEstimate estimate_resources(const Config& config, int64_t data_bytes, const Model* model, bool remote) {
  ResourceEstimate e;
  e.data_bytes = data_bytes;
  const int64_t threads = config.get_int("execution.threads");
  const int64_t shards = config.get_int("execution.logical_shards");
  int64_t executors = config.get_int("execution.executors");
  if (executors == 0) {
    executors = std::min<int64_t>(std::max<int64_t>(1, std::max(1u, std::thread::hardware_concurrency()) / threads), shards);
  }
  e.threads = remote ? 1 : mul({executors, threads});
  if (model == nullptr) return e;
  const int64_t parameters = model->num_parameters() < 0 ? 0 : model->num_parameters();
  const int64_t parameter_bytes = mul({parameters, 4});
  const int64_t here = remote ? 0 : executors;
  e.model_bytes = mul({parameter_bytes, add({kStateCopies, mul({2, here})})});
  if (remote) return e;
  // Each executor trains its chunks one at a time: `vectorize` clients, or a whole logical shard.
  // A Poisson cohort has cohort.size clients on average: sized for a draw 6 standard deviations up.
  const int64_t mean_cohort = config.get_int("cohort.size");
  const bool poisson = config.has("cohort.sampling") && config.get_string("cohort.sampling") == "poisson";
  const int64_t cohort =
      poisson ? add({mean_cohort, static_cast<int64_t>(std::ceil(6 * std::sqrt(static_cast<double>(mean_cohort)))), 6})
              : mean_cohort;
  const int64_t vectorize = config.get_int("execution.vectorize");
  const int64_t chunk = vectorize > 0 ? std::min(vectorize, cohort) : (cohort + shards - 1) / std::max<int64_t>(shards, 1);
  const int64_t batch = setting_or(config, "algorithm.batch_size", 0) > 0 ? config.get_int("algorithm.batch_size")
                                                                           : kUnknownBatch;
  const int64_t activations = std::max<int64_t>(model->activations_per_example(), 1);
  const int64_t epochs = std::max<int64_t>(setting_or(config, "algorithm.local_epochs", 1), 1);
  // Every slot of every step of every epoch is indexed and masked up front (int64 + float).
  const int64_t per_client = add({mul({kClientCopies, parameter_bytes}), mul({batch, kClientCopies, activations, 4}),
                                  mul({epochs, batch, 12})});
  const int64_t evaluation = mul({kEvalBatch, activations, 4, 2});
  // A robust aggregator gathers every client's update to every executor ([cohort, P]), and sorts a
  // float64 copy: about 5 float32 copies of the cohort's updates each.
  const int64_t gathered = config.has("aggregation.stages") && aggregation_gathers(config.get_string("aggregation.stages"))
                               ? mul({cohort, parameter_bytes, 5})
                               : 0;
  e.chunk_bytes = mul({executors, add({mul({chunk, per_client}), evaluation, gathered})});
  return e;
}

MachineResources MachineResources::of_this_host() {
  MachineResources m;
  m.hardware_threads = std::max<int64_t>(1, std::thread::hardware_concurrency());
  int64_t memory = mem_available();
  if (memory < 0) memory = mul({sysconf(_SC_PHYS_PAGES), sysconf(_SC_PAGE_SIZE)});
  // A container's limit (cgroup v2, then v1) can be far below the host's memory.
  for (const auto& [limit, usage] : {std::pair<const char*, const char*>{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
                                     {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const int64_t l = read_number(limit), u = read_number(usage);
    if (l > 0 && u >= 0 && l - u < memory) memory = std::max<int64_t>(l - u, 0);
  }
  m.memory_bytes = memory;
  return m;
}

int64_t MachineResources::max_threads() const { return std::max<int64_t>(64, 8 * hardware_threads); }

std::string check_resources(const ResourceEstimate& estimate, const MachineResources& machine, bool force) {
  std::string problem;
  if (estimate.total_bytes() > machine.memory_bytes) {
    const int64_t total = estimate.total_bytes();
    problem = fmt::format(
        "the run needs {} of memory ({}), but this host has {} available; use smaller settings (model widths, "
        "data.clients, data.dimension, algorithm.batch_size, algorithm.local_epochs, execution.vectorize, "
        "execution.executors)",
        total == kMax ? format_bytes(total) : "about " + format_bytes(total), estimate.describe(),
        format_bytes(machine.memory_bytes));
  } else if (estimate.threads > machine.max_threads()) {
    problem = fmt::format(
        "the run would start {} threads (execution.executors x execution.threads) on a host with {} hardware "
        "threads (at most {})",
        estimate.threads, machine.hardware_threads, machine.max_threads());
  }
  if (problem.empty()) return "";
  FAX_CHECK(force, "{}; --force runs it anyway", problem);
  warn(problem + " (--force: running anyway)");
  return problem;
}

}  // namespace fax
