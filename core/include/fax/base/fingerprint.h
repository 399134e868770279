#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace fax {

/// FNV-1a over `bytes`, continuing from `hash` (the offset basis to start): what identifies a
/// file's contents in an experiment's identity (plugins, TorchScript models).
inline uint64_t fnv1a(std::string_view bytes, uint64_t hash = 14695981039346656037ull) {
  for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

/// "(N bytes, FNV-1a H)" for contents of `size` bytes hashing to `hash`.
inline std::string describe_fingerprint(int64_t size, uint64_t hash) {
  return fmt::format("({} bytes, FNV-1a {:016x})", size, hash);
}

}  // namespace fax
