#include <fax/runtime/worker.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <tensorpipe/tensorpipe.h>
#include <torch/version.h>

#include <fax/base/error.h>
#include <fax/base/interrupt.h>
#include <fax/base/version.h>
#include <fax/spmd/ordered_sum.h>

#include "gloo_plane.h"
#include "remote_wire.h"

namespace fax {
namespace {

using namespace remote;

std::string default_worker_name() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown");
  return fmt::format("{}:{}", host, getpid());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Worker

namespace {

// What the worker's connection delivers: a frame, or the connection's end.
struct Incoming {
  std::optional<Frame> frame;
  std::string error;
};

// The worker's side of a task's collectives: each one is a message to the coordinator and the
// wait for its result; with a Gloo group, allreduces go over it instead.
class RemoteCommunicator final : public Communicator {
 public:
  RemoteCommunicator(Connection& connection, Inbox<Incoming>& inbox, int64_t task, const ShardLayout& layout,
                     int rank, GlooGroup* gloo)
      : connection_(connection), inbox_(inbox), task_(task), rank_(rank), size_(layout.executors()), gloo_(gloo) {
    for (int r = 0; r < size_; ++r) shards_per_rank_.push_back(layout.executor_shards(r).size());
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::vector<at::Tensor> allreduce_sum(const std::vector<ShardPartial>& partials) override {
    if (gloo_) {
      // All executors meet at the coordinator first: the Gloo collective then waits for the
      // transfer only, never for a slower executor's computation, so Gloo's timeout does not
      // bound how unequal executors may be; an executor that hangs or dies before it arrives is
      // handled by the control plane (abort, rerun); and the coordinator checks that all call the
      // same collective.
      const int64_t count = partials.empty() ? 0 : static_cast<int64_t>(partials.front().values.size());
      Frame announce = start(Op::gloo_allreduce, count);
      if (!partials.empty()) {
        for (const auto& v : partials.front().values)
          announce.i(static_cast<int64_t>(v.scalar_type())).i(v.numel());
      }
      exchange(std::move(announce));
      try {
        return gloo_->allreduce_sum(partials, shards_per_rank_);
      } catch (const CommunicationError&) {
        communication_failed_ = true;
        throw;
      }
    }
    const int64_t count = partials.empty() ? 0 : static_cast<int64_t>(partials.front().values.size());
    Frame f = start(Op::allreduce_sum, count);
    f.i(static_cast<int64_t>(partials.size()));
    for (const auto& p : partials) {
      FAX_ASSERT(static_cast<int64_t>(p.values.size()) == count, "shard partials of unequal length");
      f.i(p.shard);
      for (const auto& v : p.values) f.t(v);
    }
    return exchange(std::move(f));
  }

  std::vector<at::Tensor> broadcast(const std::vector<at::Tensor>& values, int root) override {
    FAX_CHECK(root >= 0 && root < size_, "broadcast root {} is not an executor (0..{})", root, size_ - 1);
    Frame f = start(Op::broadcast, root);
    if (rank_ == root)
      for (const auto& v : values) f.t(v);
    return exchange(std::move(f));
  }

  std::vector<at::Tensor> allgather(const at::Tensor& local) override {
    return exchange(start(Op::allgather, 1).t(local));
  }

  void barrier() override { exchange(start(Op::barrier, 0)); }
  // The coordinator learns of a failure from the worker's reply; a finished rank needs no word.
  void abort(const std::string&) override {}
  void finish() override {}

  bool aborted() const { return aborted_; }
  bool communication_failed() const { return communication_failed_; }
  bool bye() const { return bye_; }
  const std::string& lost() const { return lost_; }

 private:
  Frame start(Op op, int64_t arg) {
    Frame f(Kind::collective);
    f.i(task_).i(sequence_).i(static_cast<int64_t>(op)).i(arg);
    return f;
  }

  std::vector<at::Tensor> exchange(Frame f) {
    const int64_t seq = sequence_++;
    connection_.send(std::move(f));
    for (;;) {
      std::optional<Incoming> in = inbox_.pop(std::chrono::milliseconds(1000));
      if (!in) continue;
      if (!in->frame) {
        lost_ = in->error;
        throw Error(fmt::format("lost the coordinator: {}", in->error));
      }
      Frame& frame = *in->frame;
      if (frame.kind == Kind::bye) {
        bye_ = true;
        throw Error("the coordinator ended the run");
      }
      if (frame.kind != Kind::abort && frame.kind != Kind::result) continue;
      FrameReader fields(frame, "the coordinator");
      if (fields.i() != task_) continue;  // a message of an earlier task
      if (frame.kind == Kind::abort) {
        aborted_ = true;
        throw Error(fmt::format("task aborted by the coordinator: {}", fields.s()));
      }
      if (fields.i() == seq) return std::move(frame.tensors);
    }
  }

  Connection& connection_;
  Inbox<Incoming>& inbox_;
  int64_t task_;
  int rank_;
  int size_;
  GlooGroup* gloo_;
  std::vector<int64_t> shards_per_rank_;
  bool communication_failed_ = false;
  int64_t sequence_ = 0;
  bool aborted_ = false;
  bool bye_ = false;
  std::string lost_;
};

// Sends a heartbeat every period until destroyed.
class Heartbeat {
 public:
  Heartbeat(std::shared_ptr<Connection> connection, std::chrono::milliseconds period)
      : thread_([this, connection, period] {
          std::unique_lock<std::mutex> lock(mutex_);
          while (!cv_.wait_for(lock, period, [&] { return stopping_; })) connection->send(Frame(Kind::heartbeat));
        }) {}
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

// Connects and says hello; returns the coordinator's first answer (welcome or refuse), retrying
// while the coordinator is not there yet.
std::shared_ptr<Connection> connect(tensorpipe::Context& context, const WorkerOptions& o, const std::string& name,
                                    Inbox<Incoming>& inbox, Frame& answer) {
  const std::string url = tcp_url(o.connect);
  const auto start = Clock::now();
  std::string last_error;
  for (;;) {
    auto connection = std::make_shared<Connection>(
        context.connect(url), [&inbox](Frame f) { inbox.push({std::move(f), {}}); },
        [&inbox](const std::string& why) { inbox.push({std::nullopt, why}); });
    connection->start();
    connection->send(Frame(Kind::hello).i(kProtocolVersion).s(FAX_VERSION).s(TORCH_VERSION).s(o.token).s(name));
    std::optional<Incoming> in;
    while (!(in = inbox.pop(kPoll)) && seconds_since(start) < o.connect_timeout_s) {
    }
    if (in && in->frame) {
      answer = std::move(*in->frame);
      return connection;
    }
    connection->close();
    if (in) last_error = in->error;
    FAX_CHECK(seconds_since(start) < o.connect_timeout_s, "cannot reach the coordinator at {} within {} s: {}",
              o.connect, o.connect_timeout_s, last_error.empty() ? "no answer" : last_error);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace

void run_worker(const WorkerOptions& o, const std::function<WorkerSetup(const std::string&)>& setup) {
  const std::string name = o.name.empty() ? default_worker_name() : o.name;
  FAX_CHECK(!o.token.empty(), "a worker needs the coordinator's token: pass --token-file FILE or set FAX_TOKEN");
  auto context = make_context(name);
  Inbox<Incoming> inbox;
  Frame answer;
  std::shared_ptr<Connection> connection = connect(*context, o, name, inbox, answer);
  // Whatever happens below, the pipe and context close before the inbox they write to goes away.
  struct Closer {
    std::shared_ptr<Connection>& c;
    tensorpipe::Context& context;
    ~Closer() {
      c->close();
      context.close();
      context.join();
    }
  } closer{connection, *context};

  if (answer.kind == Kind::refuse) {
    throw Error(fmt::format("the coordinator at {} refused this worker: {}", o.connect,
                            FrameReader(answer, "the coordinator").s()));
  }
  FAX_CHECK(answer.kind == Kind::welcome, "the coordinator at {} answered {} to hello", o.connect,
            kind_name(answer.kind));
  FrameReader welcome(answer, "the coordinator");
  const auto heartbeat_period = std::chrono::milliseconds(welcome.i());
  const double timeout_s = static_cast<double>(welcome.i()) / 1000.0;
  const std::string experiment = welcome.s();
  connection->allow_tensors();
  log_line(o.log, fmt::format("connected to {} as {}; loading the experiment", o.connect, name));
  const Heartbeat heartbeat(connection, heartbeat_period);

  WorkerSetup ws;
  try {
    ws = setup(experiment);
  } catch (const std::exception& e) {
    connection->send(Frame(Kind::setup_failed).s(e.what()));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    throw;
  }
  at::set_num_threads(ws.threads);
  connection->send(Frame(Kind::ready).s(ws.identity));
  log_line(o.log, fmt::format("ready ({} intra-op threads)", ws.threads));

  std::unique_ptr<GlooGroup> gloo;  // the group of the latest Gloo generation this worker was in
  std::string store_ip, gloo_ip;    // the coordinator's address and this end's, resolved at the first group
  for (;;) {
    std::optional<Incoming> in = inbox.pop(std::chrono::milliseconds(1000));
    if (!in) continue;
    FAX_CHECK(in->frame.has_value(), "lost the coordinator at {}: {}", o.connect, in->error);
    const Frame& frame = *in->frame;
    if (frame.kind == Kind::bye) break;
    if (frame.kind != Kind::task) continue;  // results and aborts of a task that already ended here

    FrameReader task_in(frame, "the coordinator");
    const int64_t task = task_in.i();
    const auto kind = static_cast<TaskKind>(task_in.i());
    RoundInfo info;
    info.seed = static_cast<uint64_t>(task_in.i());
    info.round = task_in.i();
    const int64_t logical_shards = task_in.i();
    const int executors = static_cast<int>(task_in.i());
    const int rank = static_cast<int>(task_in.i());
    const int64_t generation = task_in.i();
    const int store_port = static_cast<int>(task_in.i());
    const at::Tensor ids = task_in.t().contiguous();
    const at::Tensor weights = task_in.t().contiguous();
    const TensorTree input = task_in.tree();
    const Cohort cohort(std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel()),
                        std::vector<double>(weights.data_ptr<double>(), weights.data_ptr<double>() + weights.numel()));
    const ShardLayout layout(cohort.size(), logical_shards, executors);
    bool communication_failed = false;
    std::optional<RemoteCommunicator> communicator;
    try {
      if (generation > 0 && (!gloo || gloo->generation() != generation)) {
        gloo.reset();
        if (store_ip.empty()) {
          store_ip = resolve_ip(o.connect);
          gloo_ip = local_ip_towards(o.connect);
        }
        try {
          gloo = std::make_unique<GlooGroup>(store_ip, store_port, generation, rank, executors, timeout_s, gloo_ip);
        } catch (const CommunicationError&) {
          communication_failed = true;
          throw;
        }
      }
      communicator.emplace(*connection, inbox, task, layout, rank, generation > 0 ? gloo.get() : nullptr);
      Program program(cohort, layout, rank, *communicator, info, ws.vectorize);
      detail::ProgramScope scope(program);
      const TensorTree reply = ws.run(program, kind, input);
      connection->send(Frame(Kind::done).i(task).tree(reply));
    } catch (...) {
      if (communicator && communicator->bye()) break;
      FAX_CHECK(!communicator || communicator->lost().empty(), "lost the coordinator at {}: {}", o.connect,
                communicator->lost());
      communication_failed = communication_failed || (communicator && communicator->communication_failed());
      // Leaving the group closes its connections, so peers waiting for this executor in a Gloo
      // collective fail at once instead of at the timeout; the coordinator starts a new group.
      gloo.reset();
      if (!communicator || !communicator->aborted()) {
        connection->send(Frame(Kind::failed)
                             .i(task)
                             .i(communication_failed ? 1 : 0)
                             .s(detail::describe(std::current_exception())));
      }
    }
  }
  log_line(o.log, "the coordinator ended the run");
}

}  // namespace fax
