#include <fax/error.h>

namespace fax::detail {

void throw_internal(const char* file, int line, const char* condition, const std::string& message) {
  throw InternalError(fmt::format("internal error at {}:{}: {} ({})", file, line, message, condition));
}

}  // namespace fax::detail
