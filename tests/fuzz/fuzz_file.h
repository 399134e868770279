#pragma once

// Fuzz targets whose reader takes a path: each input is written to a private file in /dev/shm.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace fax::fuzz {

inline std::string input_file(const uint8_t* data, size_t size, const char* suffix) {
  static const std::string path = "/dev/shm/fax_fuzz_" + std::to_string(::getpid()) + suffix;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f != nullptr) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  return path;
}

}  // namespace fax::fuzz
