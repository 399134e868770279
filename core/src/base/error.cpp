#include <fax/base/error.h>
#include <fax/base/interrupt.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <new>

#include <c10/util/Exception.h>

namespace fax {

namespace {
// Lock-free, so setting it from a signal handler is safe.
std::atomic<bool> interrupt{false};
static_assert(std::atomic<bool>::is_always_lock_free);
}  // namespace

void request_interrupt() noexcept { interrupt.store(true); }
void clear_interrupt() noexcept { interrupt.store(false); }
bool interrupt_requested() noexcept { return interrupt.load(std::memory_order_relaxed); }
void check_interrupt() {
  if (interrupt_requested()) throw Interrupted("interrupted by a stop request (SIGINT or SIGTERM)");
}

void warn(const std::string& message) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  std::fprintf(stderr, "fax: warning: %s\n", message.c_str());
  std::fflush(stderr);
}

}  // namespace fax

namespace fax::detail {

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

bool is_out_of_memory(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::bad_alloc&) {
    return true;
  } catch (const c10::Error& e) {
    // LibTorch's allocator refusing, or a tensor size past what any allocation can hold.
    const std::string what = e.what_without_backtrace();
    return what.find("can't allocate memory") != std::string::npos ||
           what.find("Storage size calculation overflowed") != std::string::npos;
  } catch (...) {
    return false;
  }
}

void throw_internal(const char* file, int line, const char* condition, const std::string& message) {
  throw InternalError(fmt::format("internal error at {}:{}: {} ({})", file, line, message, condition));
}

}  // namespace fax::detail
