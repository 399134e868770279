// libFuzzer target: the TFF-style HDF5 reader on arbitrary bytes (seeded with valid files).
#include <fax/error.h>
#include <fax/sources.h>

#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fax::TffHdf5Options options;
  options.path = fax::fuzz::input_file(data, size, ".h5");
  try {
    fax::load_tff_hdf5(options);
  } catch (const fax::Error&) {
  }
  return 0;
}
