#pragma once

#include <fax/base/error.h>

namespace fax {

/// Thrown where a run polls for an interrupt (between local steps, chunks of clients and
/// evaluation batches, and while the coordinator waits for its workers) once one was requested:
/// the round in flight is abandoned, and the run keeps the state of the last completed round.
class Interrupted : public Error {
 public:
  using Error::Error;
};

/// Asks the run in this process to stop as soon as it next polls (SIGINT / SIGTERM).
/// Async-signal-safe: a signal handler may call it.
void request_interrupt() noexcept;
/// Withdraws a request (a new run starts clean).
void clear_interrupt() noexcept;
bool interrupt_requested() noexcept;
/// Throws Interrupted when a stop was requested.
void check_interrupt();

}  // namespace fax
