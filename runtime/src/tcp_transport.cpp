#include "tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nop/utility/pedantic_buffer_reader.h>
#include <tensorpipe/channel/basic/factory.h>
#include <tensorpipe/channel/context.h>
#include <tensorpipe/common/error.h>
#include <tensorpipe/common/nop.h>
#include <tensorpipe/core/nop_types.h>
#include <tensorpipe/transport/connection.h>
#include <tensorpipe/transport/context.h>
#include <tensorpipe/transport/error.h>
#include <tensorpipe/transport/listener.h>

namespace fax::remote {
namespace {

namespace tp = tensorpipe;
namespace tpt = tensorpipe::transport;
using Clock = std::chrono::steady_clock;

class TcpError final : public tp::BaseError {
 public:
  explicit TcpError(std::string what) : what_(std::move(what)) {}
  std::string what() const override { return what_; }

 private:
  std::string what_;
};

template <class E, class... A>
tp::Error make_error(A&&... args) {
  return tp::Error(std::make_shared<E>(std::forward<A>(args)...), __FILE__, __LINE__);
}

tp::Error tcp_error(std::string what) { return make_error<TcpError>(std::move(what)); }

// Messages larger than this are read into memory that grows as their bytes arrive, so a peer that
// announces a large message holds only what it has really sent.
constexpr size_t kGrowth = size_t{1} << 20;

// "a.b.c.d:port" -> sockaddr_in (numeric: fax resolves host names before it gets here).
sockaddr_in parse_address(const std::string& addr) {
  const size_t colon = addr.rfind(':');
  sockaddr_in out{};
  out.sin_family = AF_INET;
  const std::string host = colon == std::string::npos ? "" : addr.substr(0, colon);
  char* end = nullptr;
  const long port = colon == std::string::npos ? -1 : std::strtol(addr.c_str() + colon + 1, &end, 10);
  if (colon == std::string::npos || *end != '\0' || port < 0 || port > 65535 ||
      inet_pton(AF_INET, host.c_str(), &out.sin_addr) != 1) {
    throw std::invalid_argument("not an IPv4 address and port: '" + addr + "'");
  }
  out.sin_port = htons(static_cast<uint16_t>(port));
  return out;
}

std::string format_address(const sockaddr_in& a) {
  char host[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a.sin_addr, host, sizeof host);
  return std::string(host) + ":" + std::to_string(ntohs(a.sin_port));
}

// TensorPipe deserializes messages with a reader that does not check its bounds on fixed-size
// reads (tensorpipe::NopReader): a truncated or forged message makes it read past the buffer. And
// its core asserts (throws, on its event loop: the process ends) on messages that parse but make
// no sense to it: a brochure offering no transport or channel it has, a descriptor naming a
// device it has no channel for, an answer naming connections it never offered. So a message is
// first read here into the type its holder expects, with libnop's bounds-checked reader, and
// checked against what fax's contexts offer (remote_wire.cpp: this transport as "tcp", and
// TensorPipe's "basic" channel for CPU tensors); only then does TensorPipe's reader see it, and
// its reads stay within the same bytes.
const std::string kDomain = "fax-tcp-1";

const std::unordered_map<tp::Device, std::string>& basic_channel_descriptors() {
  static const std::unordered_map<tp::Device, std::string> descriptors =
      tp::channel::basic::create()->deviceDescriptors();
  return descriptors;
}

bool offers_basic_channel(
    const std::unordered_map<std::string, std::unordered_map<tp::Device, std::string>>& channels) {
  const auto basic = channels.find("basic");
  if (basic == channels.end()) return false;
  for (const auto& [device, descriptor] : basic_channel_descriptors()) {
    const auto theirs = basic->second.find(device);
    if (theirs == basic->second.end() || theirs->second != descriptor) return false;
  }
  return true;
}

bool on_cpu(const tp::Device& device) { return device.type == tp::kCpuDeviceType && device.index == 0; }

bool sensible(const tp::Packet&) { return true; }

bool sensible(const tp::Brochure& brochure) {
  const auto tcp = brochure.transportDomainDescriptors.find("tcp");
  return tcp != brochure.transportDomainDescriptors.end() && tcp->second == kDomain &&
         offers_basic_channel(brochure.channelDeviceDescriptors);
}

bool sensible(const tp::BrochureAnswer& answer) {
  const tp::Device cpu{tp::kCpuDeviceType, 0};
  const auto pair = answer.channelForDevicePair.find({cpu, cpu});
  const auto ids = answer.channelRegistrationIds.find("basic");
  // Connection ids: 1 (descriptor replies) always; 0 (descriptors) when the pipe moves off the
  // transport it started on, which for fax is always "tcp".
  return (answer.transport == "tcp" || answer.transport == "shm") &&
         (answer.transport == "tcp" || answer.transportRegistrationIds.count(0) == 1) &&
         answer.transportRegistrationIds.count(1) == 1 && offers_basic_channel(answer.channelDeviceDescriptors) &&
         answer.channelForDevicePair.size() == 1 && pair != answer.channelForDevicePair.end() &&
         pair->second == "basic" && ids != answer.channelRegistrationIds.end() && ids->second.size() == 1;
}

bool sensible(const tp::Descriptor& descriptor) {
  return std::all_of(descriptor.tensors.begin(), descriptor.tensors.end(), [](const tp::Descriptor::Tensor& t) {
    return on_cpu(t.sourceDevice) && (!t.targetDevice.has_value() || on_cpu(t.targetDevice.value()));
  });
}

bool sensible(const tp::DescriptorReply& reply) {
  return std::all_of(reply.targetDevices.begin(), reply.targetDevices.end(), on_cpu);
}

template <class T>
bool well_formed(const std::vector<uint8_t>& bytes) {
  T value;
  nop::PedanticBufferReader reader(bytes.data(), bytes.size());
  try {
    return static_cast<bool>(nop::Encoding<T>::Read(&value, &reader)) && sensible(value);
  } catch (...) {  // a container that cannot grow to the size a message claims
    return false;
  }
}

bool well_formed_for(const tp::AbstractNopHolder* holder, const std::vector<uint8_t>& bytes) {
  if (dynamic_cast<const tp::NopHolder<tp::Packet>*>(holder)) return well_formed<tp::Packet>(bytes);
  if (dynamic_cast<const tp::NopHolder<tp::Brochure>*>(holder)) return well_formed<tp::Brochure>(bytes);
  if (dynamic_cast<const tp::NopHolder<tp::BrochureAnswer>*>(holder)) return well_formed<tp::BrochureAnswer>(bytes);
  if (dynamic_cast<const tp::NopHolder<tp::Descriptor>*>(holder)) return well_formed<tp::Descriptor>(bytes);
  if (dynamic_cast<const tp::NopHolder<tp::DescriptorReply>*>(holder)) return well_formed<tp::DescriptorReply>(bytes);
  return false;  // a type this transport cannot check is not read
}

struct ListenerState;

struct ReadOp {
  enum Kind { given, allocated, nop } kind = given;
  void* ptr = nullptr;  // given
  size_t length = 0;    // given
  tp::AbstractNopHolder* holder = nullptr;
  tpt::Connection::read_callback_fn fn;
  tpt::Connection::read_nop_callback_fn nop_fn;
};

struct WriteOp {
  uint64_t header = 0;  // the payload's length, sent first
  const uint8_t* data = nullptr;
  std::unique_ptr<uint8_t[]> owned;  // a serialized nop object
  size_t sent = 0;                   // of header and payload
  tpt::Connection::write_callback_fn fn;
};

// One socket. Everything here is guarded by the loop's mutex.
struct ConnState {
  int fd = -1;
  uint64_t key = 0;  // its epoll registration: keys are never reused, fd numbers are
  bool connecting = false;
  tp::Error error;  // set once: the connection is done
  // Accepted connections are gated until their first message is whole and parses.
  std::shared_ptr<ListenerState> gate;
  Clock::time_point deadline;
  bool first_ready = false;  // the gate's message waits in `body` for the first read
  std::deque<ReadOp> reads;
  uint64_t header = 0;
  size_t header_got = 0;
  bool in_body = false;
  size_t body_length = 0;
  size_t body_got = 0;
  std::vector<uint8_t> body;
  std::deque<WriteOp> writes;
  uint32_t events = 0;  // registered with epoll
};

struct ListenerState {
  int fd = -1;
  uint64_t key = 0;
  std::string addr;
  tp::Error error;
  bool paused = false;  // out of file descriptors: accepting resumes at the next tick
  size_t pending = 0;   // gated connections
  std::deque<tpt::Listener::accept_callback_fn> armed;
  std::deque<std::shared_ptr<ConnState>> ready;
};

class Loop;

class TcpConnection final : public tpt::Connection {
 public:
  TcpConnection(std::shared_ptr<Loop> loop, std::shared_ptr<ConnState> state)
      : loop_(std::move(loop)), state_(std::move(state)) {}
  ~TcpConnection() override { close(); }

  void read(read_callback_fn fn) override;
  void read(void* ptr, size_t length, read_callback_fn fn) override;
  void read(tp::AbstractNopHolder& object, read_nop_callback_fn fn) override;
  void write(const void* ptr, size_t length, write_callback_fn fn) override;
  void write(const tp::AbstractNopHolder& object, write_callback_fn fn) override;
  void setId(std::string) override {}
  void close() override;

 private:
  std::shared_ptr<Loop> loop_;
  std::shared_ptr<ConnState> state_;
};

class TcpListener final : public tpt::Listener {
 public:
  TcpListener(std::shared_ptr<Loop> loop, std::shared_ptr<ListenerState> state)
      : loop_(std::move(loop)), state_(std::move(state)) {}
  ~TcpListener() override { close(); }

  void accept(accept_callback_fn fn) override;
  std::string addr() const override { return state_->addr; }
  void setId(std::string) override {}
  void close() override;

 private:
  std::shared_ptr<Loop> loop_;
  std::shared_ptr<ListenerState> state_;
};

// The event loop: one thread, epoll, every socket nonblocking. Callers queue operations under the
// mutex and wake the thread; the thread does all I/O and runs callbacks with the mutex released,
// in the order the operations completed.
class Loop : public std::enable_shared_from_this<Loop> {
 public:
  explicit Loop(TcpLimits limits) : limits_(limits) {
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    wake_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_ < 0 || wake_ < 0) throw std::system_error(errno, std::generic_category(), "epoll/eventfd");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeKey;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &ev);
  }

  void start() {
    thread_ = std::thread([this] { run(); });
  }

  ~Loop() {
    join();
    ::close(epoll_);
    ::close(wake_);
  }

  std::shared_ptr<ConnState> connect(const std::string& addr) {
    auto c = std::make_shared<ConnState>();
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {
      c->error = make_error<tpt::ContextClosedError>();
      return c;
    }
    sockaddr_in to{};
    try {
      to = parse_address(addr);
    } catch (const std::exception& e) {
      c->error = tcp_error(e.what());
      return c;
    }
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      c->error = make_error<tp::SystemError>("socket", errno);
      return c;
    }
    no_delay(fd);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0 && errno != EINPROGRESS) {
      c->error = make_error<tp::SystemError>("connect", errno);
      ::close(fd);
      return c;
    }
    c->fd = fd;
    c->connecting = true;
    add(c);
    return c;
  }

  std::shared_ptr<ListenerState> listen(const std::string& addr) {
    const sockaddr_in at = parse_address(addr);
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), "socket");
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in bound{};
    socklen_t size = sizeof bound;
    if (bind(fd, reinterpret_cast<const sockaddr*>(&at), sizeof at) != 0 || ::listen(fd, SOMAXCONN) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &size) != 0) {
      const int error = errno;
      ::close(fd);
      throw std::system_error(error, std::generic_category(), "bind " + addr);
    }
    auto l = std::make_shared<ListenerState>();
    l->fd = fd;
    l->addr = format_address(bound);
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {
      ::close(fd);
      throw std::runtime_error("the transport is closed");
    }
    l->key = next_key_++;
    listeners_[l->key] = l;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = l->key;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev);
    return l;
  }

  void add_read(const std::shared_ptr<ConnState>& c, ReadOp op) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopped_) {
        c->reads.push_back(std::move(op));
        return touch(c);
      }
    }
    // The loop has ended: nobody else would answer.
    const tp::Error error = make_error<tpt::ContextClosedError>();
    if (op.kind == ReadOp::nop) return op.nop_fn(error);
    op.fn(error, nullptr, 0);
  }

  void add_write(const std::shared_ptr<ConnState>& c, WriteOp op) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopped_) {
        c->writes.push_back(std::move(op));
        return touch(c);
      }
    }
    op.fn(make_error<tpt::ContextClosedError>());
  }

  // Fails a write before it was queued (a nop object that would not serialize), in order.
  void fail_write(const std::shared_ptr<ConnState>& c, tpt::Connection::write_callback_fn fn, tp::Error error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopped_) {
        later_.push_back([fn = std::move(fn), error] { fn(error); });
        return touch(c);
      }
    }
    fn(error);
  }

  void close_connection(const std::shared_ptr<ConnState>& c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!c->error) fail(c, make_error<tpt::ConnectionClosedError>());
    wake();
  }

  void accept(const std::shared_ptr<ListenerState>& l, tpt::Listener::accept_callback_fn fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopped_) {
        l->armed.push_back(std::move(fn));
        match(l);
        return wake();
      }
    }
    fn(make_error<tpt::ContextClosedError>(), nullptr);
  }

  void close_listener(const std::shared_ptr<ListenerState>& l) {
    std::lock_guard<std::mutex> lock(mu_);
    shut(l, make_error<tpt::ListenerClosedError>());
    wake();
  }

  void close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
      for (auto& [key, l] : std::map<uint64_t, std::shared_ptr<ListenerState>>(listeners_)) {
        shut(l, make_error<tpt::ContextClosedError>());
      }
      for (auto& [key, c] : std::map<uint64_t, std::shared_ptr<ConnState>>(conns_)) {
        fail(c, make_error<tpt::ContextClosedError>());
      }
    }
    wake();
  }

  void join() {
    close();
    if (!thread_.joinable()) return;
    // Dropped from inside one of its own callbacks: the thread ends by itself once closed.
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }

  const TcpLimits& limits() const { return limits_; }

 private:
  static void no_delay(int fd) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }

  void wake() {
    const uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof one);
  }

  void add(const std::shared_ptr<ConnState>& c) {
    c->key = next_key_++;
    conns_[c->key] = c;
    epoll_event ev{};
    ev.data.u64 = c->key;
    c->events = 0;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, c->fd, &ev);
    touch(c);
  }

  // Something changed on `c`: the loop services it on its next turn.
  void touch(const std::shared_ptr<ConnState>& c) {
    dirty_.push_back(c);
    wake();
  }

  void run() {
    std::vector<epoll_event> events(64);
    for (;;) {
      const int n = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), timeout_ms());
      std::vector<std::function<void()>> callbacks;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (int i = 0; i < n; ++i) {
          // By key, not fd: a socket closed since epoll_wait returned may have handed its fd
          // number to a new one, and its events must not land there.
          const uint64_t key = events[i].data.u64;
          if (key == kWakeKey) {
            uint64_t count;
            (void)!::read(wake_, &count, sizeof count);
            continue;
          }
          // Copies: servicing a socket can remove it from the map.
          if (auto l = listeners_.find(key); l != listeners_.end()) {
            const auto listener = l->second;
            accept_all(listener);
            continue;
          }
          if (auto c = conns_.find(key); c != conns_.end()) {
            const auto conn = c->second;
            service(conn, events[i].events);
          }
        }
        // Services can queue more work on other connections (a listener's accept, a failure).
        while (!dirty_.empty()) {
          auto c = std::move(dirty_.front());
          dirty_.pop_front();
          service(c, 0);
        }
        expire();
        callbacks.swap(later_);
        if (closed_ && conns_.empty() && listeners_.empty() && dirty_.empty() && callbacks.empty()) {
          stopped_ = true;
          return;
        }
      }
      for (auto& cb : callbacks) cb();
    }
  }

  int timeout_ms() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!later_.empty() || !dirty_.empty()) return 0;
    auto next = Clock::now() + std::chrono::milliseconds(200);
    for (const auto& [key, c] : conns_)
      if (c->gate) next = std::min(next, c->deadline);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count();
    return static_cast<int>(std::max<int64_t>(ms, 0) + 1);
  }

  // Gated connections past their deadline are closed; a listener that ran out of descriptors
  // tries again.
  void expire() {
    const auto now = Clock::now();
    std::vector<std::shared_ptr<ConnState>> late;
    for (const auto& [key, c] : conns_)
      if (c->gate && c->deadline <= now) late.push_back(c);
    for (auto& c : late) fail(c, tcp_error("no hello within the deadline"));
    for (auto& [key, l] : listeners_) {
      if (!l->paused) continue;
      l->paused = false;
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = key;
      epoll_ctl(epoll_, EPOLL_CTL_MOD, l->fd, &ev);
    }
  }

  void accept_all(const std::shared_ptr<ListenerState>& l) {
    for (;;) {
      const int fd = accept4(l->fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // The pending connection stays in the backlog: stop polling it until the next tick.
          l->paused = true;
          epoll_event ev{};
          ev.data.u64 = l->key;
          epoll_ctl(epoll_, EPOLL_CTL_MOD, l->fd, &ev);
        }
        return;
      }
      if (l->pending >= limits_.max_pending) {
        ::close(fd);
        continue;
      }
      no_delay(fd);
      auto c = std::make_shared<ConnState>();
      c->fd = fd;
      c->gate = l;
      c->deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(limits_.first_message_s));
      ++l->pending;
      add(c);
    }
  }

  // Hands connections whose first message passed the gate to armed accept callbacks.
  void match(const std::shared_ptr<ListenerState>& l) {
    auto self = shared_from_this();
    while (!l->armed.empty() && (!l->ready.empty() || l->error)) {
      auto fn = std::move(l->armed.front());
      l->armed.pop_front();
      if (l->error) {
        later_.push_back([fn = std::move(fn), error = l->error] { fn(error, nullptr); });
        continue;
      }
      auto c = std::move(l->ready.front());
      l->ready.pop_front();
      later_.push_back([fn = std::move(fn), self, c] {
        fn(tp::Error::kSuccess, std::make_shared<TcpConnection>(self, c));
      });
    }
  }

  void shut(const std::shared_ptr<ListenerState>& l, tp::Error error) {
    if (l->error) return;
    l->error = std::move(error);
    if (l->fd >= 0) {
      epoll_ctl(epoll_, EPOLL_CTL_DEL, l->fd, nullptr);
      ::close(l->fd);
      listeners_.erase(l->key);
      l->fd = -1;
    }
    for (auto& c : l->ready) fail(c, l->error);
    l->ready.clear();
    std::vector<std::shared_ptr<ConnState>> gated;
    for (const auto& [key, c] : conns_)
      if (c->gate == l) gated.push_back(c);
    for (auto& c : gated) fail(c, l->error);
    match(l);
  }

  // The connection is done: its socket closes and every operation queued or queued later gets
  // `error`, reads before writes, each in order.
  void fail(const std::shared_ptr<ConnState>& c, tp::Error error) {
    if (!c->error) c->error = std::move(error);
    if (c->fd >= 0) {
      epoll_ctl(epoll_, EPOLL_CTL_DEL, c->fd, nullptr);
      ::close(c->fd);
      conns_.erase(c->key);
      c->fd = -1;
    }
    if (c->gate) {
      --c->gate->pending;
      c->gate.reset();
    }
    for (auto& op : c->reads) {
      if (op.kind == ReadOp::nop) {
        later_.push_back([fn = std::move(op.nop_fn), e = c->error] { fn(e); });
      } else {
        later_.push_back([fn = std::move(op.fn), e = c->error] { fn(e, nullptr, 0); });
      }
    }
    c->reads.clear();
    for (auto& op : c->writes) later_.push_back([fn = std::move(op.fn), e = c->error] { fn(e); });
    c->writes.clear();
    c->body = {};
  }

  void service(const std::shared_ptr<ConnState>& c, uint32_t events) {
    if (c->error) return fail(c, c->error);
    if (c->connecting) {
      if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return watch(c);
      int error = 0;
      socklen_t size = sizeof error;
      getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &error, &size);
      if (error != 0) return fail(c, make_error<tp::SystemError>("connect", error));
      sockaddr_in peer{};
      socklen_t peer_size = sizeof peer;
      if (getpeername(c->fd, reinterpret_cast<sockaddr*>(&peer), &peer_size) != 0) return watch(c);  // not yet
      c->connecting = false;
    }
    if (!write_some(c) || !read_some(c)) return;
    // A peer that hung up while nothing was asked of the socket: there is no more to read.
    if ((events & (EPOLLHUP | EPOLLERR)) && c->reads.empty() && !c->gate) return fail(c, make_error<tp::EOFError>());
    watch(c);
  }

  void watch(const std::shared_ptr<ConnState>& c) {
    if (c->fd < 0) return;
    uint32_t want = 0;
    if (c->connecting) {
      want = EPOLLOUT;
    } else {
      if (c->gate || (!c->reads.empty() && !c->first_ready)) want |= EPOLLIN;
      if (!c->writes.empty()) want |= EPOLLOUT;
    }
    if (want == c->events) return;
    c->events = want;
    epoll_event ev{};
    ev.events = want;
    ev.data.u64 = c->key;
    epoll_ctl(epoll_, EPOLL_CTL_MOD, c->fd, &ev);
  }

  bool write_some(const std::shared_ptr<ConnState>& c) {
    while (!c->writes.empty()) {
      WriteOp& op = c->writes.front();
      const size_t total = sizeof op.header + op.header;
      iovec parts[2];
      int count = 0;
      if (op.sent < sizeof op.header) {
        parts[count++] = {reinterpret_cast<uint8_t*>(&op.header) + op.sent, sizeof op.header - op.sent};
      }
      const size_t body_sent = op.sent > sizeof op.header ? op.sent - sizeof op.header : 0;
      if (op.header > body_sent) parts[count++] = {const_cast<uint8_t*>(op.data) + body_sent, op.header - body_sent};
      msghdr message{};
      message.msg_iov = parts;
      message.msg_iovlen = static_cast<size_t>(count);
      const ssize_t n = sendmsg(c->fd, &message, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        fail(c, make_error<tp::SystemError>("sendmsg", errno));
        return false;
      }
      op.sent += static_cast<size_t>(n);
      if (op.sent < total) continue;
      later_.push_back([fn = std::move(op.fn)] { fn(tp::Error::kSuccess); });
      c->writes.pop_front();
    }
    return true;
  }

  // Reads what the queued reads (or the gate) want; false when the connection failed.
  bool read_some(const std::shared_ptr<ConnState>& c) {
    for (;;) {
      if (c->first_ready) {
        if (c->reads.empty()) return true;
        c->first_ready = false;
        c->body_length = c->body.size();
        if (!deliver(c)) return false;
        continue;
      }
      if (!c->gate && c->reads.empty()) return true;
      if (!c->in_body) {
        const ssize_t n = recv(c->fd, reinterpret_cast<uint8_t*>(&c->header) + c->header_got,
                               sizeof c->header - c->header_got, 0);
        if (!advance(c, n)) return !c->error;
        c->header_got += static_cast<size_t>(n);
        if (c->header_got < sizeof c->header) continue;
        if (!begin_body(c)) return false;
        if (c->body_length > 0) continue;
      } else {
        uint8_t* into = nullptr;
        size_t want = 0;
        if (!c->gate && c->reads.front().kind == ReadOp::given) {
          into = static_cast<uint8_t*>(c->reads.front().ptr) + c->body_got;
          want = c->body_length - c->body_got;
        } else {
          if (c->body.size() == c->body_got) c->body.resize(std::min(c->body_length, c->body_got + kGrowth));
          into = c->body.data() + c->body_got;
          want = c->body.size() - c->body_got;
        }
        const ssize_t n = recv(c->fd, into, want, 0);
        if (!advance(c, n)) return !c->error;
        c->body_got += static_cast<size_t>(n);
        if (c->body_got < c->body_length) continue;
      }
      // A whole message.
      c->in_body = false;
      c->header_got = 0;
      if (c->gate) {
        if (!pass_gate(c)) return false;
        continue;
      }
      if (!deliver(c)) return false;
    }
  }

  // After recv: true when bytes arrived; false (and the connection failed, or nothing to read
  // now) otherwise.
  bool advance(const std::shared_ptr<ConnState>& c, ssize_t n) {
    if (n > 0) return true;
    if (n == 0) {
      fail(c, make_error<tp::EOFError>());
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      fail(c, make_error<tp::SystemError>("recv", errno));
    }
    return false;
  }

  // The length is known: check it against what may be read before anything is allocated.
  bool begin_body(const std::shared_ptr<ConnState>& c) {
    const uint64_t length = c->header;
    if (c->gate) {
      if (length > limits_.max_first_message) {
        fail(c, tcp_error("a first message of " + std::to_string(length) + " bytes"));
        return false;
      }
    } else {
      const ReadOp& op = c->reads.front();
      if (op.kind == ReadOp::given && length != op.length) {
        fail(c, tcp_error("the peer sent a message of " + std::to_string(length) + " bytes where " +
                          std::to_string(op.length) + " were agreed"));
        return false;
      }
      if (op.kind != ReadOp::given && length > limits_.max_message) {
        fail(c, tcp_error("the peer announced a message of " + std::to_string(length) + " bytes (at most " +
                          std::to_string(limits_.max_message) + ")"));
        return false;
      }
    }
    c->in_body = true;
    c->body_length = static_cast<size_t>(length);
    c->body_got = 0;
    c->body.clear();
    return true;
  }

  // The first message of an accepted connection must be TensorPipe's hello packet.
  bool pass_gate(const std::shared_ptr<ConnState>& c) {
    c->body.resize(c->body_length);
    if (!well_formed<tp::Packet>(c->body)) {
      fail(c, tcp_error("a first message that is not a hello"));
      return false;
    }
    auto l = c->gate;
    --l->pending;
    c->gate.reset();
    c->first_ready = true;
    l->ready.push_back(c);
    match(l);
    return true;
  }

  // Completes the front read with the message just read (or the gate's buffered one).
  bool deliver(const std::shared_ptr<ConnState>& c) {
    ReadOp op = std::move(c->reads.front());
    c->reads.pop_front();
    const size_t length = c->body_length;
    if (op.kind == ReadOp::given) {
      if (!c->body.empty()) {
        // The gate's buffered message, served to a read of agreed size.
        if (length != op.length) {
          c->reads.push_front(std::move(op));
          fail(c, tcp_error("the peer's first message has another size than agreed"));
          return false;
        }
        std::memcpy(op.ptr, c->body.data(), length);
        c->body.clear();
      }
      later_.push_back([fn = std::move(op.fn), ptr = op.ptr, length] { fn(tp::Error::kSuccess, ptr, length); });
      return true;
    }
    auto data = std::make_shared<std::vector<uint8_t>>(std::move(c->body));
    c->body.clear();
    data->resize(length);
    if (op.kind == ReadOp::allocated) {
      later_.push_back([fn = std::move(op.fn), data] { fn(tp::Error::kSuccess, data->data(), data->size()); });
      return true;
    }
    later_.push_back([fn = std::move(op.nop_fn), holder = op.holder, data] {
      bool parsed = well_formed_for(holder, *data);
      if (parsed) {
        tp::NopReader reader(data->data(), data->size());
        try {
          parsed = static_cast<bool>(holder->read(reader));
        } catch (...) {
          parsed = false;
        }
      }
      fn(parsed ? tp::Error::kSuccess : tcp_error("a malformed message"));
    });
    return true;
  }

  const TcpLimits limits_;
  int epoll_ = -1;
  int wake_ = -1;
  std::thread thread_;
  std::mutex mu_;
  bool closed_ = false;
  bool stopped_ = false;  // the thread has ended: operations are answered by their caller
  static constexpr uint64_t kWakeKey = 0;
  uint64_t next_key_ = 1;
  std::map<uint64_t, std::shared_ptr<ConnState>> conns_;
  std::map<uint64_t, std::shared_ptr<ListenerState>> listeners_;
  std::deque<std::shared_ptr<ConnState>> dirty_;
  std::vector<std::function<void()>> later_;
};

void TcpConnection::read(read_callback_fn fn) {
  ReadOp op;
  op.kind = ReadOp::allocated;
  op.fn = std::move(fn);
  loop_->add_read(state_, std::move(op));
}

void TcpConnection::read(void* ptr, size_t length, read_callback_fn fn) {
  ReadOp op;
  op.kind = ReadOp::given;
  op.ptr = ptr;
  op.length = length;
  op.fn = std::move(fn);
  loop_->add_read(state_, std::move(op));
}

void TcpConnection::read(tp::AbstractNopHolder& object, read_nop_callback_fn fn) {
  ReadOp op;
  op.kind = ReadOp::nop;
  op.holder = &object;
  op.nop_fn = std::move(fn);
  loop_->add_read(state_, std::move(op));
}

void TcpConnection::write(const void* ptr, size_t length, write_callback_fn fn) {
  WriteOp op;
  op.header = length;
  op.data = static_cast<const uint8_t*>(ptr);
  op.fn = std::move(fn);
  loop_->add_write(state_, std::move(op));
}

void TcpConnection::write(const tp::AbstractNopHolder& object, write_callback_fn fn) {
  WriteOp op;
  const size_t size = object.getSize();
  op.owned = std::make_unique<uint8_t[]>(size);
  tp::NopWriter writer(op.owned.get(), size);
  if (!object.write(writer)) return loop_->fail_write(state_, std::move(fn), tcp_error("cannot serialize a message"));
  op.header = size;
  op.data = op.owned.get();
  op.fn = std::move(fn);
  loop_->add_write(state_, std::move(op));
}

void TcpConnection::close() { loop_->close_connection(state_); }

void TcpListener::accept(accept_callback_fn fn) { loop_->accept(state_, std::move(fn)); }

void TcpListener::close() { loop_->close_listener(state_); }

class TcpContext final : public tpt::Context {
 public:
  explicit TcpContext(TcpLimits limits) : loop_(std::make_shared<Loop>(limits)) { loop_->start(); }
  ~TcpContext() override { join(); }

  std::shared_ptr<tpt::Connection> connect(std::string addr) override {
    return std::make_shared<TcpConnection>(loop_, loop_->connect(addr));
  }
  std::shared_ptr<tpt::Listener> listen(std::string addr) override {
    return std::make_shared<TcpListener>(loop_, loop_->listen(addr));
  }
  bool isViable() const override { return true; }
  const std::string& domainDescriptor() const override { return domain_; }
  void setId(std::string) override {}
  void close() override { loop_->close(); }
  void join() override { loop_->join(); }

 private:
  std::shared_ptr<Loop> loop_;
  // Any two hosts reach each other over TCP; the name only keeps other transports apart.
  const std::string domain_ = kDomain;
};

}  // namespace

std::shared_ptr<tpt::Context> make_tcp_transport(TcpLimits limits) { return std::make_shared<TcpContext>(limits); }

}  // namespace fax::remote
