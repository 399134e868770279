#pragma once

#include <string>

namespace fax::cli {

/// `word` as one word of a POSIX shell command line: in single quotes, each ' written as '\''.
inline std::string shell_word(const std::string& word) {
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace fax::cli
