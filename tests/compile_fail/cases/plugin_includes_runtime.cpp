// A plugin reaching past libfax_core: the coordinator lives in libfax_runtime, whose headers a
// target linking only fax::core (every plugin) does not see.
// expect: fax/runtime/coordinator.h: No such file or directory
#ifdef FAX_CONTROL
#include <fax/fax.h>
#else
#include <fax/runtime/coordinator.h>
#endif

void use() {}
