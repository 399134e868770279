#include "remote_wire.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>

#include <ATen/ATen.h>
#include <tensorpipe/tensorpipe.h>

#include <fax/base/error.h>

namespace fax::remote {
namespace {

// Frame metadata: kind, ints, strings, then each tensor's dtype and shape, as little-endian
// 64-bit integers and length-prefixed strings. Tensor bytes travel separately.
class Encoder {
 public:
  void i(int64_t v) { out_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void s(const std::string& v) {
    i(static_cast<int64_t>(v.size()));
    out_ += v;
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Decoder {
 public:
  explicit Decoder(const std::string& in) : in_(in) {}
  int64_t i() {
    int64_t v = 0;
    need(sizeof v);
    std::memcpy(&v, in_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string s() {
    const int64_t n = i();
    FAX_CHECK(n >= 0, "malformed frame: negative string length");
    need(static_cast<size_t>(n));
    std::string v = in_.substr(at_, static_cast<size_t>(n));
    at_ += static_cast<size_t>(n);
    return v;
  }
  int64_t count() {
    const int64_t n = i();
    FAX_CHECK(n >= 0 && static_cast<size_t>(n) <= in_.size(), "malformed frame: count {}", n);
    return n;
  }
  bool done() const { return at_ == in_.size(); }

 private:
  void need(size_t n) const { FAX_CHECK(n <= in_.size() - at_, "malformed frame: truncated"); }
  const std::string& in_;
  size_t at_ = 0;
};

constexpr int64_t kMaxDims = 16;

std::string encode(const Frame& f) {
  Encoder e;
  e.i(static_cast<int64_t>(f.kind));
  e.i(static_cast<int64_t>(f.ints.size()));
  for (int64_t v : f.ints) e.i(v);
  e.i(static_cast<int64_t>(f.strings.size()));
  for (const auto& v : f.strings) e.s(v);
  e.i(static_cast<int64_t>(f.tensors.size()));
  for (const auto& t : f.tensors) {
    e.i(static_cast<int64_t>(t.scalar_type()));
    e.i(t.dim());
    for (int64_t d : t.sizes()) e.i(d);
  }
  return e.take();
}

}  // namespace

Frame decode_frame(const std::string& metadata, std::vector<TensorMeta>& metas) {
  Decoder d(metadata);
  Frame f(static_cast<Kind>(d.i()));
  FAX_CHECK(static_cast<int64_t>(f.kind) >= static_cast<int64_t>(Kind::hello) &&
                static_cast<int64_t>(f.kind) <= static_cast<int64_t>(Kind::bye),
            "malformed frame: unknown kind {}", static_cast<int64_t>(f.kind));
  for (int64_t n = d.count(); n > 0; --n) f.ints.push_back(d.i());
  for (int64_t n = d.count(); n > 0; --n) f.strings.push_back(d.s());
  for (int64_t n = d.count(); n > 0; --n) {
    TensorMeta m;
    const int64_t dtype = d.i();
    FAX_CHECK(dtype >= 0 && dtype < static_cast<int64_t>(at::ScalarType::NumOptions), "malformed frame: dtype {}", dtype);
    m.dtype = static_cast<at::ScalarType>(dtype);
    const int64_t dims = d.i();
    FAX_CHECK(dims >= 0 && dims <= kMaxDims, "malformed frame: {} dimensions", dims);
    for (int64_t k = 0; k < dims; ++k) {
      m.sizes.push_back(d.i());
      FAX_CHECK(m.sizes.back() >= 0, "malformed frame: negative size");
    }
    metas.push_back(std::move(m));
  }
  FAX_CHECK(d.done(), "malformed frame: trailing bytes");
  return f;
}

namespace {

// TensorPipe's message without the source location it appends.
std::string message_of(const tensorpipe::Error& error) {
  std::string what = error.what();
  const auto origin = what.find(" (this error originated at");
  return origin == std::string::npos ? what : what.substr(0, origin);
}

}  // namespace

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::hello: return "hello";
    case Kind::welcome: return "welcome";
    case Kind::refuse: return "refuse";
    case Kind::ready: return "ready";
    case Kind::setup_failed: return "setup_failed";
    case Kind::heartbeat: return "heartbeat";
    case Kind::task: return "task";
    case Kind::collective: return "collective";
    case Kind::result: return "result";
    case Kind::done: return "done";
    case Kind::failed: return "failed";
    case Kind::abort: return "abort";
    case Kind::bye: return "bye";
  }
  return "?";
}

Frame& Frame::i(int64_t v) {
  ints.push_back(v);
  return *this;
}
Frame& Frame::s(std::string v) {
  strings.push_back(std::move(v));
  return *this;
}
Frame& Frame::t(at::Tensor v) {
  tensors.push_back(std::move(v));
  return *this;
}
Frame& Frame::tree(const TensorTree& tree) {
  i(static_cast<int64_t>(tree.size()));
  for (const auto& [name, value] : tree) s(name).t(value);
  return *this;
}

int64_t FrameReader::i() {
  FAX_CHECK(ints_ < frame_.ints.size(), "malformed {} message from {}: missing a number", kind_name(frame_.kind), peer_);
  return frame_.ints[ints_++];
}
std::string FrameReader::s() {
  FAX_CHECK(strings_ < frame_.strings.size(), "malformed {} message from {}: missing a string", kind_name(frame_.kind),
            peer_);
  return frame_.strings[strings_++];
}
at::Tensor FrameReader::t() {
  FAX_CHECK(tensors_ < frame_.tensors.size(), "malformed {} message from {}: missing a tensor", kind_name(frame_.kind),
            peer_);
  return frame_.tensors[tensors_++];
}
TensorTree FrameReader::tree() {
  TensorTree out;
  for (int64_t n = i(); n > 0; --n) {
    std::string name = s();
    out.set(name, t());
  }
  return out;
}

std::shared_ptr<tensorpipe::Context> make_context(const std::string& name, const TcpLimits& limits) {
  auto context = std::make_shared<tensorpipe::Context>(tensorpipe::ContextOptions().name(name));
  // fax's own TCP transport, not libuv's: it bounds what a peer can make it allocate and gates
  // new connections (tcp_transport.h).
  context->registerTransport(0, "tcp", make_tcp_transport(limits));
  // Between processes of one host (same kernel and namespaces) TensorPipe moves the pipe onto
  // shared memory: about twice the loopback TCP bandwidth here (5.1 vs 2.6 GB/s for 100 MB).
  context->registerTransport(10, "shm", tensorpipe::transport::shm::create());
  // Tensors go over the pipe's own connection; cma (process_vm_readv) would skip a copy between
  // processes of one host but fails where ptrace is restricted, which TensorPipe cannot detect.
  context->registerChannel(0, "basic", tensorpipe::channel::basic::create());
  return context;
}

namespace {

// "HOST:PORT" -> an IPv4 socket address (host names resolved).
sockaddr_in resolve(const std::string& host_port) {
  const auto colon = host_port.rfind(':');
  FAX_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < host_port.size(),
            "'{}' is not HOST:PORT (e.g. 127.0.0.1:29500)", host_port);
  const std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  FAX_CHECK(port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos && std::stol(port) <= 65535,
            "'{}': port '{}' is not a number from 0 to 65535", host_port, port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  FAX_CHECK(rc == 0 && found != nullptr, "'{}': cannot resolve host '{}': {}", host_port, host, gai_strerror(rc));
  sockaddr_in address = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  freeaddrinfo(found);
  address.sin_port = htons(static_cast<uint16_t>(std::stol(port)));
  return address;
}

std::string url_of(const sockaddr_in& address) {
  char ip[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &address.sin_addr, ip, sizeof ip);
  return fmt::format("tcp://{}:{}", ip, ntohs(address.sin_port));
}

}  // namespace

std::string tcp_url(const std::string& host_port) { return url_of(resolve(host_port)); }

std::string resolve_ip(const std::string& host_port) {
  const sockaddr_in address = resolve(host_port);
  char ip[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &address.sin_addr, ip, sizeof ip);
  return ip;
}

std::string local_ip_towards(const std::string& host_port) {
  // Connecting a UDP socket sends nothing; it only asks the kernel which address it would route from.
  const sockaddr_in peer = resolve(host_port);
  const int s = ::socket(AF_INET, SOCK_DGRAM, 0);
  FAX_CHECK(s >= 0, "socket: {}", std::strerror(errno));
  sockaddr_in local{};
  socklen_t length = sizeof local;
  const bool ok = ::connect(s, reinterpret_cast<const sockaddr*>(&peer), sizeof peer) == 0 &&
                  ::getsockname(s, reinterpret_cast<sockaddr*>(&local), &length) == 0;
  const int why = errno;
  ::close(s);
  FAX_CHECK(ok, "cannot find the local address that reaches {}: {}", host_port, std::strerror(why));
  char ip[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &local.sin_addr, ip, sizeof ip);
  return ip;
}

std::vector<std::string> listen_urls(const std::string& host_port) {
  // TensorPipe reports a failed bind by throwing on its event loop, which ends the process: try
  // the bind here first, so a busy port or a foreign address is an error the user can read.
  const sockaddr_in address = resolve(host_port);
  const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  FAX_CHECK(probe >= 0, "cannot listen on {}: socket: {}", host_port, std::strerror(errno));
  const int yes = 1;
  ::setsockopt(probe, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);  // as libuv binds
  const int bound = ::bind(probe, reinterpret_cast<const sockaddr*>(&address), sizeof address);
  const int bind_errno = errno;
  ::close(probe);
  FAX_CHECK(bound == 0, "cannot listen on {}: {}", host_port, std::strerror(bind_errno));
  static std::atomic<int> listeners{0};
  return {url_of(address), fmt::format("shm://fax-{}-{}-{}", getpid(), listeners++,
                                       std::chrono::steady_clock::now().time_since_epoch().count())};
}

Connection::Connection(std::shared_ptr<tensorpipe::Pipe> pipe, FrameFn on_frame, ErrorFn on_error)
    : pipe_(std::move(pipe)), on_frame_(std::move(on_frame)), on_error_(std::move(on_error)) {}

Connection::~Connection() { pipe_->close(); }

void Connection::start() { read_next(); }

bool Connection::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

void Connection::fail(const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) return;
    failed_ = true;
  }
  pipe_->close();
  on_error_(what);
}

void Connection::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failed_ = true;
  }
  pipe_->close();
}

void Connection::read_next() {
  auto self = shared_from_this();
  pipe_->readDescriptor([self](const tensorpipe::Error& error, tensorpipe::Descriptor descriptor) {
    if (error) return self->fail(message_of(error));
    auto frame = std::make_shared<Frame>();
    tensorpipe::Allocation allocation;
    try {
      std::vector<TensorMeta> metas;
      *frame = decode_frame(descriptor.metadata, metas);
      FAX_CHECK(self->tensors_allowed_ || metas.empty(), "a {} message with tensors before authentication",
                kind_name(frame->kind));
      FAX_CHECK(descriptor.payloads.empty(), "unexpected payloads");
      size_t sent = 0;
      for (const auto& m : metas) {
        at::Tensor t = at::empty(m.sizes, at::TensorOptions().dtype(m.dtype));
        if (t.nbytes() > 0) {
          FAX_CHECK(sent < descriptor.tensors.size() && descriptor.tensors[sent].length == t.nbytes(),
                    "malformed frame: tensor sizes disagree with their shapes");
          tensorpipe::Allocation::Tensor slot;
          slot.buffer = tensorpipe::CpuBuffer{t.data_ptr()};
          allocation.tensors.push_back(std::move(slot));
          ++sent;
        }
        frame->tensors.push_back(std::move(t));
      }
      FAX_CHECK(sent == descriptor.tensors.size(), "malformed frame: more tensors than shapes");
    } catch (const std::exception& e) {  // fax::Error, or LibTorch refusing a shape
      return self->fail(e.what());
    }
    self->pipe_->read(std::move(allocation), [self, frame](const tensorpipe::Error& read_error) {
      if (read_error) return self->fail(message_of(read_error));
      self->on_frame_(std::move(*frame));
      self->read_next();
    });
  });
}

void Connection::send(Frame frame, std::function<void()> on_written) {
  if (closed()) return;
  tensorpipe::Message message;
  for (auto& t : frame.tensors) {
    t = t.detach().contiguous();
    if (t.nbytes() == 0) continue;
    tensorpipe::Message::Tensor slot;
    slot.buffer = tensorpipe::CpuBuffer{t.data_ptr()};
    slot.length = t.nbytes();
    message.tensors.push_back(std::move(slot));
  }
  message.metadata = encode(frame);
  // The tensors must outlive the write: the callback holds them.
  auto keep = std::make_shared<std::vector<at::Tensor>>(std::move(frame.tensors));
  auto self = shared_from_this();
  pipe_->write(std::move(message), [self, keep, on_written = std::move(on_written)](const tensorpipe::Error& error) {
    if (error) return self->fail(message_of(error));
    if (on_written) on_written();
  });
}

}  // namespace fax::remote
