// libFuzzer target: the IDX reader (plain and gzip) on arbitrary bytes.
#include <fax/base/error.h>
#include <fax/datasets/idx.h>

#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    fax::read_idx(fax::fuzz::input_file(data, size, ".idx"));
  } catch (const fax::Error&) {
  }
  return 0;
}
