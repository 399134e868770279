#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <fax/base/tensor_tree.h>

#include "tcp_transport.h"

namespace tensorpipe {
class Context;
class Listener;
class Pipe;
}  // namespace tensorpipe

// The message layer under the TensorPipe backend: frames of integers, strings and tensors over a
// pipe. Tensors travel as TensorPipe tensors: read from and written into tensor memory directly,
// never through an intermediate string.
namespace fax::remote {

/// Bumped whenever a frame's layout changes; coordinator and worker must agree.
constexpr int64_t kProtocolVersion = 3;

using Clock = std::chrono::steady_clock;
/// How often waits wake up to look at timeouts and interrupts.
constexpr auto kPoll = std::chrono::milliseconds(50);

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// Collectives, as the frames that carry them name them. gloo_allreduce carries no data: every
/// executor announces it before the allreduce that follows over Gloo (see the worker's
/// RemoteCommunicator).
enum class Op : int64_t { allreduce_sum = 1, broadcast, allgather, barrier, gloo_allreduce };

inline void log_line(const std::function<void(const std::string&)>& log, const std::string& line) {
  if (log) log(line);
}

enum class Kind : int32_t {
  hello = 1,     // worker -> coordinator: protocol, versions, token, name
  welcome,       // coordinator -> worker: heartbeat period, worker timeout, the resolved experiment
  refuse,        // coordinator -> worker: why it is not admitted (then the pipe closes)
  ready,         // worker -> coordinator: the experiment is loaded (what it resolved to)
  setup_failed,  // worker -> coordinator: loading the experiment failed (message)
  heartbeat,     // worker -> coordinator: alive
  task,          // coordinator -> worker: run a program for a cohort
  collective,    // worker -> coordinator: this executor's part of collective #seq of a task
  result,        // coordinator -> worker: the outcome of collective #seq
  done,          // worker -> coordinator: the executor's reply to a task
  failed,        // worker -> coordinator: the program threw (data-plane failure flag, message)
  abort,         // coordinator -> worker: stop the task (a peer failed or was dropped)
  bye,           // coordinator -> worker: the run is over, exit
};

const char* kind_name(Kind kind);

/// One message. Fields are read back in the order they were written (FrameReader).
struct Frame {
  Kind kind = Kind::heartbeat;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<at::Tensor> tensors;

  explicit Frame(Kind k = Kind::heartbeat) : kind(k) {}
  Frame& i(int64_t v);
  Frame& s(std::string v);
  Frame& t(at::Tensor v);
  Frame& tree(const TensorTree& tree);
};

/// A tensor's dtype and shape as a frame's metadata describes it.
struct TensorMeta {
  at::ScalarType dtype;
  std::vector<int64_t> sizes;
};

/// Parses a frame's metadata (as it arrives from the network): the frame without its tensors'
/// contents, and each tensor's dtype and shape. Throws fax::Error on anything malformed.
Frame decode_frame(const std::string& metadata, std::vector<TensorMeta>& metas);

/// Reads a frame's fields in order; a missing field is a protocol error naming `peer`.
class FrameReader {
 public:
  FrameReader(const Frame& frame, std::string peer) : frame_(frame), peer_(std::move(peer)) {}
  int64_t i();
  std::string s();
  at::Tensor t();
  TensorTree tree();

 private:
  const Frame& frame_;
  std::string peer_;
  size_t ints_ = 0, strings_ = 0, tensors_ = 0;
};

/// A context with fax's TCP transport (tcp_transport.h: lengths checked before allocating, new
/// connections gated by `limits`), TensorPipe's shared-memory transport and its CPU channel.
std::shared_ptr<tensorpipe::Context> make_context(const std::string& name, const TcpLimits& limits = {});

/// "HOST:PORT" -> "tcp://IP:PORT" (host names are resolved to an IPv4 address).
std::string tcp_url(const std::string& host_port);
/// "HOST:PORT" -> HOST's IPv4 address.
std::string resolve_ip(const std::string& host_port);
/// This host's IPv4 address on the route to HOST (of "HOST:PORT").
std::string local_ip_towards(const std::string& host_port);
/// What a coordinator listens on: HOST:PORT over TCP (workers connect there), and a unique
/// shared-memory address that TensorPipe switches a pipe to when both ends share a host.
std::vector<std::string> listen_urls(const std::string& host_port);

/// A pipe that delivers each incoming frame, and then its first error, to callbacks that run on
/// TensorPipe's event loop (they must not block). send() may be called from any thread; frames
/// arrive in the order they were sent.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using FrameFn = std::function<void(Frame)>;
  using ErrorFn = std::function<void(const std::string&)>;

  Connection(std::shared_ptr<tensorpipe::Pipe> pipe, FrameFn on_frame, ErrorFn on_error);
  ~Connection();

  /// Starts reading. Until allow_tensors(), a frame with tensors is an error (nothing is allocated
  /// for a peer that has not authenticated).
  void start();
  void allow_tensors() { tensors_allowed_ = true; }
  /// Sends asynchronously; `on_written` runs (on the event loop) once the frame has left.
  void send(Frame frame, std::function<void()> on_written = {});
  void close();
  bool closed() const;

 private:
  void read_next();
  void fail(const std::string& what);

  std::shared_ptr<tensorpipe::Pipe> pipe_;
  FrameFn on_frame_;
  ErrorFn on_error_;
  bool tensors_allowed_ = false;
  mutable std::mutex mutex_;
  bool failed_ = false;
};

/// A queue between TensorPipe's callbacks and the thread that acts on them.
template <class T>
class Inbox {
 public:
  void push(T item) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      items_.push_back(std::move(item));
    }
    cv_.notify_one();
  }

  /// The next item, or nothing when `timeout` passes first.
  std::optional<T> pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return !items_.empty(); })) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    return item;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<T> items_;
};

}  // namespace fax::remote
