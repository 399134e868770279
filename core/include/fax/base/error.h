#pragma once

#include <exception>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace fax {

/// An error the user can fix: bad input, bad configuration, misuse of the API. The message names
/// the file, key, client or round involved. The CLI prints it as one line and exits with code 2.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A broken invariant inside fax: a bug, never the user's fault. The CLI exits with code 1.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// Prints "fax: warning: <message>" as one line on stderr; safe to call from executor threads.
void warn(const std::string& message);

namespace detail {
/// The message of a caught exception (LibTorch's without its backtrace).
std::string describe(const std::exception_ptr& error);
/// Whether a caught exception is an allocation that failed (std::bad_alloc, or LibTorch's
/// allocator refusing): the run asked for more memory than the host gives, whoever asked.
bool is_out_of_memory(const std::exception_ptr& error);
[[noreturn]] void throw_internal(const char* file, int line, const char* condition,
                                 const std::string& message);
}  // namespace detail

}  // namespace fax

/// Throws fax::Error with an fmt-formatted message when `cond` is false.
#define FAX_CHECK(cond, ...)                               \
  do {                                                     \
    if (!(cond)) throw ::fax::Error(fmt::format(__VA_ARGS__)); \
  } while (false)

/// Throws fax::InternalError naming the source location when an invariant does not hold.
#define FAX_ASSERT(cond, ...)                                                      \
  do {                                                                             \
    if (!(cond))                                                                   \
      ::fax::detail::throw_internal(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (false)
