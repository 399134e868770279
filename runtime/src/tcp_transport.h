#pragma once

// fax's TCP transport for TensorPipe (private to libfax_runtime). TensorPipe's own (libuv) transport
// trusts the bytes it reads: the first word of a message is a length it allocates without a
// bound (a few bytes of HTTP ask for exabytes: std::bad_alloc on its event loop ends the
// process), a connection that fails before its hello breaks the whole listener, and one that
// never speaks is kept forever. This transport speaks the same framing (a 64-bit length, then the
// bytes) but checks every length before allocating, lets a message into TensorPipe only once it
// is whole, and gates accepted connections: their first message (TensorPipe's hello packet) must
// be small, parse, and arrive within a deadline, and only so many may be waiting at once.
// Connections that fail the gate are closed here; TensorPipe never sees them.

#include <cstddef>
#include <memory>

namespace tensorpipe::transport {
class Context;
}

namespace fax::remote {

struct TcpLimits {
  /// The largest message read into memory the transport allocates (control messages: brochures,
  /// descriptors with a frame's metadata, such as the experiment's YAML). Tensors are read into
  /// buffers whose size both sides agreed on, and a message of another size is an error.
  size_t max_message = size_t{64} << 20;
  /// An accepted connection's first message: TensorPipe's hello packet (a context name or a
  /// registration id), a few dozen bytes.
  size_t max_first_message = 4096;
  /// Seconds an accepted connection has to deliver its first message.
  double first_message_s = 10;
  /// Accepted connections still waiting for their first message; beyond this, new ones are
  /// closed at once (a flood of silent connections cannot exhaust file descriptors).
  size_t max_pending = 256;
};

/// A transport context (register it as "tcp") with its own event-loop thread. Addresses are
/// "IPv4:port".
std::shared_ptr<tensorpipe::transport::Context> make_tcp_transport(TcpLimits limits = {});

}  // namespace fax::remote
