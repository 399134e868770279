#include <fax/error.h>

#include <cstdio>
#include <mutex>

#include <c10/util/Exception.h>

namespace fax {

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

void throw_internal(const char* file, int line, const char* condition, const std::string& message) {
  throw InternalError(fmt::format("internal error at {}:{}: {} ({})", file, line, message, condition));
}

}  // namespace fax::detail
