#include <fax/runtime/coordinator.h>

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

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
}

// Compares secrets in time that does not depend on where they differ.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

const char* op_name(int64_t op) {
  switch (static_cast<Op>(op)) {
    case Op::allreduce_sum: return "allreduce_sum";
    case Op::broadcast: return "broadcast";
    case Op::allgather: return "allgather";
    case Op::barrier: return "barrier";
    case Op::gloo_allreduce: return "allreduce_sum";
  }
  return "?";
}

std::string task_name(TaskKind kind, int64_t round) {
  switch (kind) {
    case TaskKind::round: return fmt::format("round {}", round + 1);
    case TaskKind::evaluate: return "an evaluation";
  }
  return "a task";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Coordinator

struct Coordinator::Impl {
  enum class State { loading, ready, gone };
  struct Worker {
    std::string name;
    std::shared_ptr<Connection> connection;
    std::shared_ptr<std::atomic<int64_t>> last_seen;
    State state = State::loading;
  };
  // What TensorPipe's callbacks hand to the coordinator's thread.
  struct Event {
    enum What { connected, frame, lost } what = frame;
    int worker = -1;
    std::shared_ptr<Connection> connection;
    std::shared_ptr<std::atomic<int64_t>> last_seen;
    Frame message;
    std::string error;
  };

  explicit Impl(CoordinatorOptions o) : options(std::move(o)) {
    FAX_CHECK(!options.token.empty(),
              "remote workers need a shared token: pass --token-file FILE or set FAX_TOKEN (on the coordinator and "
              "every worker)");
    FAX_CHECK(options.workers >= 1, "--workers must be at least 1 (got {})", options.workers);
    FAX_CHECK(options.timeout_s > 0 && options.heartbeat_s > 0 && options.heartbeat_s < options.timeout_s,
              "the worker timeout ({} s) must be positive and longer than the heartbeat period ({} s)",
              options.timeout_s, options.heartbeat_s);
    FAX_CHECK(options.handshake_s > 0 && options.max_unauthenticated > 0,
              "the handshake timeout ({} s) and the cap on unauthenticated connections ({}) must be positive",
              options.handshake_s, options.max_unauthenticated);
    const std::vector<std::string> urls = listen_urls(options.listen);
    TcpLimits limits;
    limits.first_message_s = options.handshake_s;
    context = make_context("coordinator", limits);
    try {
      listener = context->listen(urls);
      address = listener->address("tcp");
    } catch (const std::exception& e) {
      throw Error(fmt::format("cannot listen on {}: {}", options.listen, e.what()));
    }
    if (options.collectives == Collectives::gloo) gloo_store = std::make_unique<GlooStore>(options.timeout_s);
    accept_next();
  }

  ~Impl() {
    // Tell every live worker the run is over, and wait (briefly) for each to hang up: closing
    // first could discard the goodbye still in flight, and the worker would report a lost
    // coordinator.
    std::set<int> live;
    for (auto& [id, w] : workers) {
      if (w.state == State::gone) continue;
      live.insert(id);
      w.connection->send(Frame(Kind::bye));
    }
    const auto start = Clock::now();
    while (!live.empty() && seconds_since(start) < 5) {
      const std::optional<Event> e = inbox.pop(kPoll);
      if (e && e->what == Event::lost) live.erase(e->worker);
    }
    for (auto& [id, w] : workers) w.connection->close();
    listener->close();
    context->close();
    context->join();
  }

  // A connection until it has said hello. The hello is answered on TensorPipe's event loop, so
  // a worker is admitted (or refused) at once, whatever the coordinator's thread is doing.
  struct Peer {
    std::weak_ptr<Connection> connection;
    std::shared_ptr<std::atomic<int64_t>> last_seen = std::make_shared<std::atomic<int64_t>>(now_ms());
    bool greeted = false;  // touched on the event loop only
  };

  // Connections that have not said hello yet, with when they were accepted: closed after the
  // handshake timeout, and capped, so that silent or garbage connections cannot pile up.
  struct Unauthenticated {
    std::weak_ptr<Connection> connection;
    int64_t since_ms = 0;
  };
  std::mutex unauthenticated_mutex;
  std::map<int, Unauthenticated> unauthenticated;

  void authenticated(int id) {
    std::lock_guard<std::mutex> lock(unauthenticated_mutex);
    unauthenticated.erase(id);
  }

  // Closes the connections past the handshake timeout (on the coordinator's thread).
  void close_silent() {
    const int64_t now = now_ms();
    std::vector<std::pair<int, std::shared_ptr<Connection>>> late;
    {
      std::lock_guard<std::mutex> lock(unauthenticated_mutex);
      for (auto it = unauthenticated.begin(); it != unauthenticated.end();) {
        if (static_cast<double>(now - it->second.since_ms) / 1000.0 <= options.handshake_s) {
          ++it;
          continue;
        }
        late.emplace_back(it->first, it->second.connection.lock());
        it = unauthenticated.erase(it);
      }
    }
    std::vector<int> closed;
    for (auto& [id, connection] : late) {
      if (!connection) continue;
      connection->close();
      closed.push_back(id);
    }
    if (closed.empty()) return;
    // One line for all of them: a flood of silent connections must not flood the log.
    const size_t shown = std::min<size_t>(closed.size(), 8);
    log_line(options.log, fmt::format("closed {} connection{} (#{}{}) that did not say hello within {} s",
                                      closed.size(), closed.size() == 1 ? "" : "s",
                                      fmt::join(closed.begin(), closed.begin() + static_cast<long>(shown), ", #"),
                                      closed.size() > shown ? ", ..." : "", options.handshake_s));
  }

  void accept_next() {
    listener->accept([this](const tensorpipe::Error& error, std::shared_ptr<tensorpipe::Pipe> pipe) {
      if (error) {
        if (!error.isOfType<tensorpipe::ListenerClosedError>()) {
          Event e;
          e.what = Event::lost;
          e.error = error.what();
          inbox.push(std::move(e));  // worker -1: the listener itself
        }
        return;
      }
      const int id = next_worker++;
      {
        std::lock_guard<std::mutex> lock(unauthenticated_mutex);
        if (static_cast<int>(unauthenticated.size()) >= options.max_unauthenticated) {
          pipe->close();
          accept_next();
          return;
        }
      }
      auto peer = std::make_shared<Peer>();
      auto connection = std::make_shared<Connection>(
          std::move(pipe),
          [this, id, peer](Frame f) {
            *peer->last_seen = now_ms();
            if (!peer->greeted) {
              peer->greeted = true;
              if (auto c = peer->connection.lock()) greet(id, c, peer->last_seen, f);
              return;
            }
            Event e;
            e.what = Event::frame;
            e.worker = id;
            e.message = std::move(f);
            inbox.push(std::move(e));
          },
          [this, id](const std::string& why) {
            authenticated(id);  // gone either way
            Event e;
            e.what = Event::lost;
            e.worker = id;
            e.error = why;
            inbox.push(std::move(e));
          });
      peer->connection = connection;
      {
        std::lock_guard<std::mutex> lock(unauthenticated_mutex);
        unauthenticated[id] = {connection, now_ms()};
      }
      connection->start();
      accept_next();
    });
  }

  // Answers a hello: refused (and closed), or welcomed with the experiment and handed to the
  // coordinator's thread as a new worker.
  void greet(int id, const std::shared_ptr<Connection>& connection, std::shared_ptr<std::atomic<int64_t>> last_seen,
             const Frame& hello) {
    authenticated(id);  // answered now, admitted or refused
    std::string name = fmt::format("#{}", id);
    std::string refusal;
    try {
      FAX_CHECK(hello.kind == Kind::hello, "expected hello, got {}", kind_name(hello.kind));
      FrameReader in(hello, "a connecting worker");
      const int64_t protocol = in.i();
      const std::string fax_version = in.s(), torch_version = in.s(), token = in.s();
      name = in.s();
      if (!same_secret(token, options.token)) {
        refusal = "wrong token";
      } else if (protocol != kProtocolVersion || fax_version != FAX_VERSION || torch_version != TORCH_VERSION) {
        refusal = fmt::format("version mismatch: coordinator fax {} / LibTorch {} / protocol {}, worker fax {} / "
                              "LibTorch {} / protocol {}",
                              FAX_VERSION, TORCH_VERSION, kProtocolVersion, fax_version, torch_version, protocol);
      }
    } catch (const Error& e) {
      refusal = fmt::format("protocol error: {}", e.what());
    }
    if (!refusal.empty()) {
      log_line(options.log, fmt::format("refused a worker ({}): {}", name, refusal));
      connection->send(Frame(Kind::refuse).s(refusal), [connection] { connection->close(); });
      return;
    }
    connection->allow_tensors();
    connection->send(Frame(Kind::welcome)
                         .i(static_cast<int64_t>(options.heartbeat_s * 1000))
                         .i(static_cast<int64_t>(options.timeout_s * 1000))
                         .s(options.experiment));
    log_line(options.log, fmt::format("worker {} connected; loading the experiment", name));
    Event e;
    e.what = Event::connected;
    e.worker = id;
    e.connection = connection;
    e.last_seen = std::move(last_seen);
    e.error = name;
    inbox.push(std::move(e));
  }

  int count(State state) const {
    return static_cast<int>(std::count_if(workers.begin(), workers.end(),
                                          [&](const auto& w) { return w.second.state == state; }));
  }

  void drop(int id, const std::string& why) {
    Worker& w = workers.at(id);
    if (w.state == State::gone) return;
    w.state = State::gone;
    w.connection->close();
    ++dropped;
    log_line(options.log, fmt::format("dropped worker {}: {}", w.name, why));
  }

  // Handles connection management; returns the events a running task must see (frames of ready
  // workers, and the loss of ready workers).
  std::optional<Event> next_event() {
    check_timeouts();
    if (!lost_ready.empty()) {
      Event e;
      e.what = Event::lost;
      e.worker = lost_ready.front();
      lost_ready.erase(lost_ready.begin());
      return e;
    }
    std::optional<Event> got = inbox.pop(kPoll);
    if (!got) return std::nullopt;
    Event& e = *got;
    if (e.worker < 0) throw Error(fmt::format("the listener on {} failed: {}", address, e.error));
    if (e.what == Event::connected) {  // welcomed: its name in `error`
      workers[e.worker] = Worker{e.error, e.connection, e.last_seen, State::loading};
      return std::nullopt;
    }
    auto it = workers.find(e.worker);
    if (it == workers.end() || it->second.state == State::gone) return std::nullopt;
    Worker& w = it->second;
    if (e.what == Event::lost) {
      const bool was_ready = w.state == State::ready;
      drop(e.worker, fmt::format("connection lost ({})", e.error));
      return was_ready ? got : std::nullopt;
    }
    try {
      switch (w.state) {
        case State::loading:
          if (e.message.kind == Kind::ready) {
            const std::string identity = FrameReader(e.message, w.name).s();
            if (!options.identity.empty() && identity != options.identity) {
              setup_error = fmt::format("worker {} resolved the experiment differently: it has {}, the coordinator has {}",
                                        w.name, identity, options.identity);
              drop(e.worker, setup_error);
              return std::nullopt;
            }
            w.state = State::ready;
            log_line(options.log, fmt::format("worker {} ready ({} ready)", w.name, count(State::ready)));
          } else if (e.message.kind == Kind::setup_failed) {
            setup_error = fmt::format("worker {} could not load the experiment: {}", w.name,
                                      FrameReader(e.message, w.name).s());
            drop(e.worker, setup_error);
          }
          return std::nullopt;
        case State::ready:
          if (e.message.kind == Kind::heartbeat) return std::nullopt;
          return got;
        case State::gone:
          return std::nullopt;
      }
    } catch (const Error& error) {
      const bool was_ready = w.state == State::ready;
      drop(e.worker, fmt::format("protocol error: {}", error.what()));
      if (was_ready) lost_ready.push_back(e.worker);
    }
    return std::nullopt;
  }

  void check_timeouts() {
    close_silent();
    const int64_t now = now_ms();
    for (auto& [id, w] : workers) {
      if (w.state != State::loading && w.state != State::ready) continue;
      const double silent_s = static_cast<double>(now - w.last_seen->load()) / 1000.0;
      if (silent_s <= options.timeout_s) continue;
      const bool was_ready = w.state == State::ready;
      drop(id, fmt::format("silent for {:.1f} s (timeout {} s)", silent_s, options.timeout_s));
      if (was_ready) lost_ready.push_back(id);
    }
  }

  std::vector<int> ready_ids() const {
    std::vector<int> ids;
    for (const auto& [id, w] : workers)
      if (w.state == State::ready) ids.push_back(id);
    return ids;
  }

  // The outcome of one collective, once every executor has sent its part.
  std::vector<at::Tensor> complete(int64_t seq, const std::vector<Frame>& parts, const std::vector<int>& executors) {
    // Each part is read once: task, seq, op, arg, then what the op carries.
    std::vector<FrameReader> readers;
    std::vector<std::pair<int64_t, int64_t>> signatures;
    for (size_t e = 0; e < parts.size(); ++e) {
      FrameReader& in = readers.emplace_back(parts[e], workers.at(executors[e]).name);
      in.i();  // task
      in.i();  // seq
      const int64_t op = in.i();
      signatures.emplace_back(op, in.i());
      if (signatures[e] != signatures[0]) {
        throw Error(fmt::format(
            "executors disagree on collective #{}: executor 0 called {}({}) but executor {} called {}({}); every "
            "executor must run the same collectives in the same order",
            seq, op_name(signatures[0].first), signatures[0].second, e, op_name(signatures[e].first),
            signatures[e].second));
      }
    }
    const auto [op, arg] = signatures.front();
    std::vector<at::Tensor> out;
    switch (static_cast<Op>(op)) {
      case Op::allreduce_sum: {
        // After the signature: shards, then per shard its id; tensors shard by shard.
        std::vector<ShardPartial> partials;
        for (FrameReader& in : readers) {
          const int64_t shards = in.i();
          for (int64_t s = 0; s < shards; ++s) {
            ShardPartial p;
            p.shard = in.i();
            for (int64_t j = 0; j < arg; ++j) p.values.push_back(in.t());
            partials.push_back(std::move(p));
          }
        }
        std::vector<const ShardPartial*> all;
        for (const auto& p : partials) all.push_back(&p);
        const auto ordered = detail::by_shard(std::move(all));
        for (int64_t j = 0; j < arg; ++j) out.push_back(detail::ordered_sum(ordered, static_cast<size_t>(j)));
        break;
      }
      case Op::broadcast:
        FAX_CHECK(arg >= 0 && arg < static_cast<int64_t>(parts.size()), "broadcast root {} is not an executor", arg);
        out = parts[static_cast<size_t>(arg)].tensors;
        break;
      case Op::allgather:
        for (FrameReader& in : readers) out.push_back(in.t());
        break;
      case Op::gloo_allreduce: {
        // After the signature: each value's dtype and element count, which Gloo cannot check (a
        // transfer of another size ends the process).
        auto describe = [](const std::pair<int64_t, int64_t>& v) {
          return fmt::format("{} {} elements", c10::toString(static_cast<at::ScalarType>(v.first)), v.second);
        };
        std::vector<std::pair<int64_t, int64_t>> first;  // executor 0's (dtype, elements) per value
        for (size_t e = 0; e < readers.size(); ++e) {
          for (int64_t j = 0; j < arg; ++j) {
            const std::pair<int64_t, int64_t> value{readers[e].i(), readers[e].i()};
            if (e == 0) {
              first.push_back(value);
            } else if (value != first[static_cast<size_t>(j)]) {
              throw Error(fmt::format("executors disagree on collective #{} (allreduce_sum), value {}: executor 0 has "
                                      "{}, executor {} has {}",
                                      seq, j, describe(first[static_cast<size_t>(j)]), e, describe(value)));
            }
          }
        }
        break;
      }
      case Op::barrier:
        break;
      default:
        throw Error(fmt::format("collective #{}: unknown operation {}", seq, op));
    }
    return out;
  }

  void send_all(const std::vector<int>& executors, const Frame& frame) {
    for (int id : executors) {
      Worker& w = workers.at(id);
      if (w.state == State::ready) w.connection->send(frame);
    }
  }

  std::vector<TensorTree> run(TaskKind kind, RoundInfo info, const Cohort& cohort, int64_t logical_shards,
                              const std::function<TensorTree(int, const ShardLayout&)>& input) {
    for (;;) {
      std::vector<int> executors = wait_for_any(kind, info.round);
      if (static_cast<int64_t>(executors.size()) > logical_shards) executors.resize(static_cast<size_t>(logical_shards));
      const int E = static_cast<int>(executors.size());
      const ShardLayout layout(cohort.size(), logical_shards, E);
      const int64_t task = ++next_task;
      // A worker leaves its Gloo group after any failure, so a task after one that did not
      // complete needs a new group even with the same workers.
      if (gloo_store && (executors != gloo_group || !gloo_clean)) {
        gloo_group = executors;
        ++gloo_generation;
      }
      gloo_clean = false;
      const at::Tensor ids = at::tensor(cohort.ids(), at::kLong);
      const at::Tensor weights = at::tensor(cohort.weights(), at::kDouble);
      for (int e = 0; e < E; ++e) {
        workers.at(executors[e]).connection->send(Frame(Kind::task)
                                                      .i(task)
                                                      .i(static_cast<int64_t>(kind))
                                                      .i(static_cast<int64_t>(info.seed))
                                                      .i(info.round)
                                                      .i(logical_shards)
                                                      .i(E)
                                                      .i(e)
                                                      .i(gloo_store ? gloo_generation : 0)
                                                      .i(gloo_store ? gloo_store->port() : 0)
                                                      .t(ids)
                                                      .t(weights)
                                                      .tree(input(e, layout)));
      }
      std::map<int, int> rank_of;
      for (int e = 0; e < E; ++e) rank_of[executors[e]] = e;
      std::map<int64_t, std::vector<std::optional<Frame>>> collectives;
      std::vector<std::optional<TensorTree>> replies(E);
      int replied = 0;
      // A Gloo collective that failed on a worker: usually a peer died, which the coordinator
      // learns a moment later (then the task runs again); if no worker is dropped within the
      // timeout, the run fails with it.
      std::optional<std::pair<std::string, Clock::time_point>> communication_failure;
      auto abort_others = [&](const std::string& why) { send_all(executors, Frame(Kind::abort).i(task).s(why)); };
      // An executor that returned while another waits in a collective: that one would wait forever.
      auto check_spmd = [&] {
        const auto returned = std::find_if(replies.begin(), replies.end(), [](const auto& r) { return r.has_value(); });
        if (returned == replies.end() || collectives.empty()) return;
        const auto& [seq, slots] = *collectives.begin();
        const auto waiting = std::find_if(slots.begin(), slots.end(), [](const auto& f) { return f.has_value(); });
        FrameReader part(**waiting, "");
        part.i();
        part.i();
        const std::string why = fmt::format(
            "executor {} returned while executor {} waits in collective #{} ({}); every executor must run the same "
            "collectives in the same order",
            returned - replies.begin(), waiting - slots.begin(), seq, op_name(part.i()));
        abort_others(why);
        throw Error(fmt::format("{}: {}", task_name(kind, info.round), why));
      };
      for (;;) {
        if (interrupt_requested()) {
          abort_others("the coordinator was interrupted");
          check_interrupt();
        }
        if (communication_failure && seconds_since(communication_failure->second) > options.timeout_s) {
          abort_others("a collective failed");
          throw Error(fmt::format("{}: {}; no worker was dropped within {} s (if executors reach a collective more "
                                  "than --worker-timeout apart, raise it)",
                                  task_name(kind, info.round), communication_failure->first, options.timeout_s));
        }
        std::optional<Event> event = next_event();
        if (!event) continue;
        const auto rank = rank_of.find(event->worker);
        if (rank == rank_of.end()) continue;
        const int e = rank->second;
        if (event->what == Event::lost) {
          log_line(options.log, fmt::format("{}: running it again without worker {}", task_name(kind, info.round),
                                            workers.at(event->worker).name));
          abort_others(fmt::format("worker {} was dropped", workers.at(event->worker).name));
          break;
        }
        const std::string& name = workers.at(event->worker).name;
        FrameReader in(event->message, name);
        if (in.i() != task) continue;  // a message of an aborted attempt
        if (event->message.kind == Kind::collective) {
          const int64_t seq = in.i();
          auto& slots = collectives[seq];
          slots.resize(E);
          slots[e] = std::move(event->message);
          if (std::any_of(slots.begin(), slots.end(), [](const auto& s) { return !s; })) {
            check_spmd();
            continue;
          }
          std::vector<Frame> parts;
          for (auto& s : slots) parts.push_back(std::move(*s));
          collectives.erase(seq);
          std::vector<at::Tensor> result;
          try {
            result = complete(seq, parts, executors);
          } catch (const std::exception& error) {
            abort_others(error.what());
            throw Error(fmt::format("{}: {}", task_name(kind, info.round), error.what()));
          }
          Frame reply(Kind::result);
          reply.i(task).i(seq);
          for (auto& t : result) reply.t(std::move(t));
          send_all(executors, reply);
        } else if (event->message.kind == Kind::done) {
          FAX_CHECK(!replies[e], "worker {} replied twice to task {}", name, task);
          replies[e] = in.tree();
          check_spmd();
          if (++replied == E) {
            std::vector<TensorTree> out;
            for (auto& r : replies) out.push_back(std::move(*r));
            gloo_clean = true;
            return out;
          }
        } else if (event->message.kind == Kind::failed) {
          const bool communication = in.i() != 0;
          const std::string message = in.s();
          if (communication) {
            log_line(options.log, fmt::format("{}: worker {} (executor {}): {}", task_name(kind, info.round), name, e,
                                              message));
            if (!communication_failure)
              communication_failure.emplace(fmt::format("worker {} (executor {}): {}", name, e, message), Clock::now());
            continue;
          }
          abort_others(fmt::format("executor {} failed", e));
          throw Error(fmt::format("worker {} (executor {} of {}) failed in {}: {}", name, e, E,
                                  task_name(kind, info.round), message));
        }
      }
    }
  }

  // The ready workers; with none, waits up to the timeout for one.
  std::vector<int> wait_for_any(TaskKind kind, int64_t round) {
    const auto start = Clock::now();
    bool said = false;
    for (;;) {
      std::vector<int> ids = ready_ids();
      if (!ids.empty()) return ids;
      if (!said) {
        log_line(options.log, fmt::format("{}: no worker left; waiting up to {} s for one to connect to {}",
                                          task_name(kind, round), options.timeout_s, address));
        said = true;
      }
      FAX_CHECK(seconds_since(start) < options.timeout_s,
                "{}: every worker is gone and none connected within {} s (dropped: {})", task_name(kind, round),
                options.timeout_s, dropped);
      check_interrupt();
      next_event();
    }
  }

  CoordinatorOptions options;
  std::shared_ptr<tensorpipe::Context> context;
  std::shared_ptr<tensorpipe::Listener> listener;
  std::string address;
  Inbox<Event> inbox;
  std::atomic<int> next_worker{0};
  std::map<int, Worker> workers;
  std::vector<int> lost_ready;
  std::string setup_error;
  int dropped = 0;
  int64_t next_task = 0;
  std::unique_ptr<GlooStore> gloo_store;
  std::vector<int> gloo_group;  // the workers of the current Gloo generation, in rank order
  int64_t gloo_generation = 0;
  bool gloo_clean = false;  // the last task completed: its group is intact on every member
};

Coordinator::Coordinator(CoordinatorOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Coordinator::~Coordinator() = default;

std::string Coordinator::address() const { return impl_->address; }

int Coordinator::ready_workers() const { return impl_->count(Impl::State::ready); }

int64_t Coordinator::gloo_generations() const { return impl_->gloo_generation; }

void Coordinator::wait_for_workers(const std::function<bool()>& stop) {
  int reported = -1;
  while (ready_workers() < impl_->options.workers) {
    FAX_CHECK(impl_->setup_error.empty(), "{}", impl_->setup_error);
    FAX_CHECK(!(stop && stop()), "stopped while waiting for workers ({} of {} ready)", ready_workers(),
              impl_->options.workers);
    if (ready_workers() != reported) {
      reported = ready_workers();
      log_line(impl_->options.log, fmt::format("waiting for workers on {}: {} of {} ready", impl_->address, reported,
                                               impl_->options.workers));
    }
    impl_->next_event();
  }
}

std::vector<TensorTree> Coordinator::run(TaskKind kind, RoundInfo info, const Cohort& cohort, int64_t logical_shards,
                                         const std::function<TensorTree(int, const ShardLayout&)>& input) {
  // The coordinator's sums are small elementwise kernels. With more than one intra-op thread,
  // OpenMP's threads spin after each one and take the cores from workers on the same host
  // (docs/thread-model.md).
  struct OneThread {
    int before = at::get_num_threads();
    OneThread() { at::set_num_threads(1); }
    ~OneThread() { at::set_num_threads(before); }
  } one_thread;
  // Summed in the executors' floating-point mode, as local executors sum; the caller's thread gets
  // IEEE gradual underflow back.
  struct Mode {
    explicit Mode(bool flush) { at::globalContext().setFlushDenormal(flush); }
    ~Mode() { at::globalContext().setFlushDenormal(false); }
  } mode(impl_->options.flush_denormals);
  return impl_->run(kind, info, cohort, logical_shards, input);
}

}  // namespace fax
