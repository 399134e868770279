#include <fax/base/version.h>

namespace fax {
const char* version() { return FAX_VERSION; }
}  // namespace fax
