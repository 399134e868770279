// libFuzzer target: raw bytes sent over loopback to a TensorPipe listener on fax's TCP transport,
// the door a coordinator opens to the network. Each input is one connection's bytes, then a
// half-close; the target waits for the listener to hang up on it. A finding is a crash (an
// allocation sized by the peer, an exception on the event loop) or a listener that no longer
// accepts: every so often a real TensorPipe pipe must still connect.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <tensorpipe/tensorpipe.h>

#include "remote_wire.h"

namespace {

struct Server {
  std::shared_ptr<tensorpipe::Context> context = fax::remote::make_context("fuzz-server");
  std::shared_ptr<tensorpipe::Listener> listener = context->listen({"tcp://127.0.0.1:0"});
  std::shared_ptr<tensorpipe::Context> client = fax::remote::make_context("fuzz-client");
  std::string address = listener->address("tcp");
  int port = std::stoi(address.substr(address.rfind(':') + 1));
  std::mutex mutex;
  std::vector<std::shared_ptr<tensorpipe::Pipe>> pipes;
  std::atomic<int> accepted{0};

  Server() { accept(); }

  void accept() {
    listener->accept([this](const tensorpipe::Error& error, std::shared_ptr<tensorpipe::Pipe> pipe) {
      if (error) {
        // The listener only fails when it is closed, which this target never does.
        std::fprintf(stderr, "the listener failed: %s\n", error.what().c_str());
        std::abort();
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        pipes.push_back(pipe);
        if (pipes.size() > 64) {
          for (auto& p : pipes) p->close();
          pipes.clear();
        }
      }
      ++accepted;
      accept();
    });
  }

  // A real pipe still gets through: the listener is alive.
  void check_alive() {
    const int before = accepted.load();
    auto pipe = client->connect("tcp://" + address);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (accepted.load() == before && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    pipe->close();
    if (accepted.load() == before) {
      std::fprintf(stderr, "the listener no longer accepts pipes\n");
      std::abort();
    }
  }
};

Server& server() {
  static Server* s = new Server();  // never destroyed: libFuzzer exits without unwinding
  return *s;
}

// Sends `data` on a new connection, half-closes it and waits (at most a second) for the listener
// to close its end.
void send_raw(const uint8_t* data, size_t size) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(server().port));
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0) {
    size_t sent = 0;
    while (sent < size) {
      const ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    shutdown(fd, SHUT_WR);
    char sink[4096];
    pollfd p{fd, POLLIN, 0};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (std::chrono::steady_clock::now() < deadline && poll(&p, 1, 50) >= 0) {
      if (p.revents == 0) continue;
      if (recv(fd, sink, sizeof sink, 0) <= 0) break;
    }
  }
  close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int runs = 0;
  send_raw(data, size);
  if (++runs % 256 == 1) server().check_alive();
  return 0;
}
