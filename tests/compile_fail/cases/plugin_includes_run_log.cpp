// A plugin reaching for the run log: it lives in libfax_io, whose headers a target linking only
// fax::core (every plugin) does not see.
// expect: fax/io/run_log.h: No such file or directory
#ifdef FAX_CONTROL
#include <fax/train/algorithm.h>
#else
#include <fax/io/run_log.h>
#endif

void use() {}
