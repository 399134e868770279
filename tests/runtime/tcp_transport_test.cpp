// fax's TCP transport for TensorPipe (runtime/src/tcp_transport.h), driven directly: lengths are
// checked before anything is allocated, and the listener's gate keeps garbage and silence out.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <tensorpipe/common/nop.h>
#include <tensorpipe/core/nop_types.h>
#include <tensorpipe/transport/connection.h>
#include <tensorpipe/transport/context.h>
#include <tensorpipe/transport/listener.h>

#include "tcp_transport.h"

namespace fax::remote {
namespace {

namespace tp = tensorpipe;
using namespace std::chrono_literals;

// A listening transport and a client transport; `accepted` yields the server side of each
// connection that passes the gate.
struct Pair {
  explicit Pair(TcpLimits limits = {})
      : server(make_tcp_transport(limits)), client(make_tcp_transport(limits)), listener(server->listen("127.0.0.1:0")) {}
  ~Pair() {
    listener->close();
    server->join();
    client->join();
  }

  std::future<std::shared_ptr<tp::transport::Connection>> accept() {
    auto promise = std::make_shared<std::promise<std::shared_ptr<tp::transport::Connection>>>();
    listener->accept([promise](const tp::Error& error, std::shared_ptr<tp::transport::Connection> c) {
      promise->set_value(error ? nullptr : std::move(c));
    });
    return promise->get_future();
  }

  // A client connection that has said TensorPipe's hello (as a pipe does first).
  std::shared_ptr<tp::transport::Connection> connect() {
    auto c = client->connect(listener->addr());
    auto hello = std::make_shared<tp::NopHolder<tp::Packet>>();
    hello->getObject() = tp::SpontaneousConnection{"test"};
    c->write(*hello, [hello](const tp::Error&) {});
    return c;
  }

  std::shared_ptr<tp::transport::Context> server, client;
  std::shared_ptr<tp::transport::Listener> listener;
};

// Reads the hello a connection starts with.
void read_hello(tp::transport::Connection& c) {
  tp::NopHolder<tp::Packet> hello;
  std::promise<bool> read;
  c.read(hello, [&](const tp::Error& error) { read.set_value(!error); });
  ASSERT_TRUE(read.get_future().get());
  EXPECT_EQ(hello.getObject().get<tp::SpontaneousConnection>()->contextName, "test");
}

std::string read_error(tp::transport::Connection& c, void* into, size_t length) {
  std::promise<std::string> done;
  auto cb = [&](const tp::Error& error, const void*, size_t) { done.set_value(error ? error.what() : ""); };
  if (into != nullptr) {
    c.read(into, length, cb);
  } else {
    c.read(cb);
  }
  return done.get_future().get();
}

TEST(TcpTransport, MessagesOfAgreedSizeArriveWhole) {
  Pair pair;
  auto server_side = pair.accept();
  auto c = pair.connect();
  const std::string payload(3 << 20, 'x');  // larger than one socket buffer
  c->write(payload.data(), payload.size(), [](const tp::Error&) {});
  auto s = server_side.get();
  ASSERT_NE(s, nullptr);
  read_hello(*s);
  std::string got(payload.size(), '\0');
  EXPECT_EQ(read_error(*s, got.data(), got.size()), "");
  EXPECT_EQ(got, payload);
}

TEST(TcpTransport, AMessageOfAnotherSizeThanAgreedFailsTheRead) {
  Pair pair;
  auto server_side = pair.accept();
  auto c = pair.connect();
  const char ten[10] = {};
  c->write(ten, sizeof ten, [](const tp::Error&) {});
  auto s = server_side.get();
  read_hello(*s);
  char eight[8];
  EXPECT_THAT(read_error(*s, eight, sizeof eight), ::testing::HasSubstr("a message of 10 bytes where 8 were agreed"));
}

TEST(TcpTransport, AnAnnouncedLengthAboveTheCapFailsBeforeAllocating) {
  TcpLimits limits;
  limits.max_message = 1024;
  Pair pair(limits);
  auto server_side = pair.accept();
  auto c = pair.connect();
  const std::string big(2048, 'y');
  c->write(big.data(), big.size(), [](const tp::Error&) {});
  auto s = server_side.get();
  read_hello(*s);
  // Refused on its length word, before its bytes are read or anything is allocated for them.
  EXPECT_THAT(read_error(*s, nullptr, 0), ::testing::HasSubstr("announced a message of 2048 bytes (at most 1024)"));
}

// A raw socket to the listener, with `bytes` sent; returns whether the listener closed it within
// `seconds`.
bool closed_by_listener(const std::string& addr, const std::string& bytes, double seconds) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1))));
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to), 0);
  if (!bytes.empty()) {
    EXPECT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  }
  timeval timeout{static_cast<time_t>(seconds), static_cast<suseconds_t>((seconds - static_cast<int>(seconds)) * 1e6)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  char sink[64];
  const ssize_t n = recv(fd, sink, sizeof sink, 0);
  close(fd);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

TEST(TcpTransport, TheGateKeepsGarbageAndSilenceFromTheListener) {
  TcpLimits limits;
  limits.first_message_s = 0.3;
  Pair pair(limits);
  auto server_side = pair.accept();
  const std::string addr = pair.listener->addr();
  EXPECT_TRUE(closed_by_listener(addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 5)) << "an HTTP request";
  EXPECT_TRUE(closed_by_listener(addr, std::string(8, '\xff'), 5)) << "a huge first length";
  std::string not_hello(8, '\0');
  not_hello[0] = 3;
  EXPECT_TRUE(closed_by_listener(addr, not_hello + "abc", 5)) << "a first message that is not a hello";
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(closed_by_listener(addr, "", 5)) << "silence";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_EQ(server_side.wait_for(0s), std::future_status::timeout) << "garbage reached the accept callback";
  // The listener still accepts a real connection.
  auto c = pair.connect();
  ASSERT_EQ(server_side.wait_for(10s), std::future_status::ready);
  auto s = server_side.get();
  ASSERT_NE(s, nullptr);
  read_hello(*s);
}

}  // namespace
}  // namespace fax::remote
