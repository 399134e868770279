// libFuzzer target: the simulated clock's trace readers (the first byte picks device or
// availability) on arbitrary bytes, then the clock on what they accepted.
#include <fax/base/error.h>
#include <fax/runtime/clock.h>

#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  try {
    const std::string path = fax::fuzz::input_file(data + 1, size - 1, ".csv");
    fax::SimulatedClock::Options o;
    if (data[0] % 2 == 0) {
      o.speed = o.network = "trace";
      const fax::SimulatedClock clock(o, 1, fax::read_device_trace(path));
      for (int64_t c = 0; c < 4; ++c) clock.duration(c, c, 100, 1000000, 1000000);
    } else {
      o.availability = "trace";
      const fax::SimulatedClock clock(o, 1, {}, fax::read_availability_trace(path));
      for (int64_t c = 0; c < 4; ++c) {
        for (fax::SimTime t : {fax::SimTime{0}, fax::SimTime{1}, fax::SimTime{86'400'000'000}, fax::SimTime{1} << 61}) {
          clock.available(c, t);
          clock.available_until(c, t);
          clock.available_until(c, t, t + 1000);
        }
      }
    }
  } catch (const fax::Error&) {
  }
  return 0;
}
