#include <fax/spmd/mesh.h>

#include <condition_variable>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <fax/base/error.h>
#include <fax/base/rng.h>
#include <fax/spmd/local_communicator.h>

namespace fax {
namespace {
thread_local Program* current_program = nullptr;
}  // namespace

detail::ProgramScope::ProgramScope(Program& p) { current_program = &p; }
detail::ProgramScope::~ProgramScope() { current_program = nullptr; }

TensorTree detail::detached(const TensorTree& x) { return detach(x); }

Program::Program(const Cohort& cohort, const ShardLayout& layout, int executor, Communicator& communicator,
                 RoundInfo info, int64_t vectorize)
    : cohort_(cohort),
      layout_(layout),
      executor_(executor),
      communicator_(communicator),
      info_(info),
      vectorize_(vectorize),
      local_(layout.executor_clients(executor)) {}

Program& Program::current() {
  FAX_CHECK(current_program != nullptr,
            "a federated primitive was called outside a program: run it through fax::Mesh::run");
  return *current_program;
}

bool Program::active() { return current_program != nullptr; }

Range Program::shard_rows(int64_t shard) const {
  const Range positions = layout_.shard_clients(shard);
  return {positions.begin - local_.begin, positions.end - local_.begin};
}

Clients<at::Tensor> Program::local_rows(const at::Tensor& all) const {
  FAX_CHECK(all.dim() > 0 && all.size(0) == cohort_size(),
            "local_rows: expected one row per client of the cohort ({}), got shape [{}]", cohort_size(),
            fmt::join(all.sizes(), ", "));
  return Clients<at::Tensor>(all.narrow(0, local_.begin, local_.size()));
}

Clients<TensorTree> Program::local_rows(const TensorTree& all) const {
  return Clients<TensorTree>(all.map([this](const at::Tensor& x) { return local_rows(x).value(); }));
}

Clients<at::Tensor> Program::weights(c10::ScalarType dtype) const {
  std::vector<double> w(cohort_.weights().begin() + local_.begin, cohort_.weights().begin() + local_.end);
  return Clients<at::Tensor>(at::tensor(w, at::TensorOptions().dtype(at::kDouble)).to(dtype));
}

Clients<at::Tensor> Program::clients_from(const std::function<at::Tensor(int64_t, int64_t)>& make) const {
  std::vector<at::Tensor> rows;
  FAX_CHECK(local_.size() > 0, "clients_from: executor {} holds no clients this round (a cohort of {} in {} logical "
            "shards), so there is no row to take the shape from", executor_, cohort_size(), layout_.logical_shards());
  rows.reserve(local_.size());
  for (int64_t pos = local_.begin; pos < local_.end; ++pos) rows.push_back(make(cohort_.id(pos), pos));
  return Clients<at::Tensor>(at::stack(rows));
}

at::Generator Program::client_generator(int64_t position) const {
  return fax::client_generator(info_.seed, info_.round, cohort_.id(position));
}

/// A fixed pool of executor threads. A job is one call of a function on every executor; the
/// caller blocks until all have returned.
struct Mesh::Impl {
  explicit Impl(MeshOptions o) : options(o), group(o.executors) {
    try {
      for (int r = 0; r < options.executors; ++r) threads.emplace_back([this, r] { loop(r); });
    } catch (const std::system_error& e) {
      // The threads already started must be joined, or their destructors terminate the process.
      stop();
      throw Error(fmt::format("cannot start executor thread {} of {}: {}", threads.size() + 1, options.executors,
                              e.what()));
    }
  }

  ~Impl() { stop(); }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    for (auto& t : threads) t.join();
    threads.clear();
  }

  void loop(int rank) {
    // Per thread, set before any intra-op thread is made: those inherit it.
    at::globalContext().setFlushDenormal(options.flush_denormals);
    // Each executor owns a fixed intra-op budget; with OpenMP the setting is per thread.
    at::set_num_threads(options.threads_per_executor);
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lock(mutex);
      wake.wait(lock, [&] { return stopping || generation != seen; });
      if (stopping) return;
      seen = generation;
      lock.unlock();
      (*job)(rank);
      lock.lock();
      if (--pending == 0) done.notify_all();
    }
  }

  void run_on_all(const std::function<void(int)>& fn) {
    std::unique_lock<std::mutex> lock(mutex);
    job = &fn;
    pending = options.executors;
    ++generation;
    wake.notify_all();
    done.wait(lock, [&] { return pending == 0; });
    job = nullptr;
  }

  MeshOptions options;
  LocalGroup group;
  std::vector<std::thread> threads;
  std::mutex mutex;
  std::condition_variable wake;
  std::condition_variable done;
  const std::function<void(int)>* job = nullptr;
  uint64_t generation = 0;
  int pending = 0;
  bool stopping = false;
};

namespace {
MeshOptions validated(MeshOptions o) {
  FAX_CHECK(o.executors > 0, "execution.executors must be positive (got {})", o.executors);
  FAX_CHECK(o.threads_per_executor > 0, "execution.threads must be positive (got {})", o.threads_per_executor);
  FAX_CHECK(o.vectorize >= 0, "execution.vectorize must be 0 (whole shard) or positive (got {})", o.vectorize);
  FAX_CHECK(o.logical_shards >= 0, "execution.logical_shards must be positive (got {})", o.logical_shards);
  if (o.logical_shards == 0) o.logical_shards = o.executors;
  FAX_CHECK(o.executors <= o.logical_shards,
            "execution.executors ({}) exceeds execution.logical_shards ({}): every executor needs at "
            "least one logical shard",
            o.executors, o.logical_shards);
  return o;
}
}  // namespace

Mesh::Mesh(MeshOptions options) : impl_(std::make_unique<Impl>(validated(options))) {}

Mesh::~Mesh() = default;

const MeshOptions& Mesh::options() const { return impl_->options; }

int Mesh::executors() const { return impl_->options.executors; }

void Mesh::run_erased(const Cohort& cohort, RoundInfo info, const std::function<void(Program&)>& program) {
  FAX_CHECK(!Program::active(), "Mesh::run called from inside a running program");
  const MeshOptions& o = impl_->options;
  const ShardLayout layout(cohort.size(), o.logical_shards, o.executors);
  impl_->group.reset();

  std::mutex failure_mutex;
  int first_failure = -1;
  std::vector<std::exception_ptr> errors(o.executors);
  impl_->run_on_all([&](int rank) {
    Communicator& comm = impl_->group.communicator(rank);
    try {
      Program p(cohort, layout, rank, comm, info, o.vectorize);
      detail::ProgramScope scope(p);
      program(p);
    } catch (...) {
      errors[rank] = std::current_exception();
      {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (first_failure < 0) first_failure = rank;
      }
      comm.abort(fmt::format("executor {} failed in round {}: {}", rank, info.round, detail::describe(errors[rank])));
    }
    comm.finish();
  });
  if (first_failure >= 0) std::rethrow_exception(errors[first_failure]);
}

}  // namespace fax
