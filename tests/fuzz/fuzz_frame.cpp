// libFuzzer target: the metadata of a TensorPipe frame as it arrives from the network (the first
// bytes a coordinator parses from a peer that has not authenticated yet), read as a hello.

#include <cstdint>
#include <string>
#include <vector>

#include <fax/base/error.h>

#include "remote_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string metadata(reinterpret_cast<const char*>(data), size);
  std::vector<fax::remote::TensorMeta> metas;
  try {
    const fax::remote::Frame frame = fax::remote::decode_frame(metadata, metas);
    fax::remote::FrameReader hello(frame, "a fuzzed peer");
    hello.i();
    for (int k = 0; k < 4; ++k) hello.s();
  } catch (const fax::Error&) {
  }
  return 0;
}
