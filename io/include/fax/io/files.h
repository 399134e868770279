#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace fax {

/// Writes `size` bytes as the file `path` so that a failure never replaces good data: into a new
/// file beside it (same directory, so the rename cannot cross file systems), written, fsynced and
/// closed with every return checked, then renamed over `path`, and the directory fsynced. On any
/// failure the temporary file is removed, `path` keeps its previous content, and fax::Error says
/// what happened ("<path>: cannot write: No space left on device; the previous file is unchanged").
void write_file_atomically(const std::string& path, const void* data, size_t size);
void write_file_atomically(const std::string& path, const std::string& text);

/// The contents of `path`, which must be a regular file of at most `max_bytes`: a FIFO or a device
/// would block or never end, a folder reads as nothing. fax::Error names the file and `what` it
/// was to be ("the experiment file").
std::string read_regular_file(const std::string& path, size_t max_bytes, const std::string& what);

/// The file an output path names: a symbolic link is followed to its target (the lock and the
/// rename must apply to that file, not replace the link with a new one); other paths unchanged.
std::string resolve_output(const std::string& path);

/// Checks `path` before anything is written there: refused when it exists and is not a regular
/// file (a directory, a device such as /dev/null, a FIFO, a socket), or when it is one of `inputs`
/// (the same file, also through links or another spelling of the path). `what` names the output
/// in the message ("the run log").
void check_output_path(const std::string& path, const std::vector<std::string>& inputs, const std::string& what);

/// An exclusive lock on the file `path` for the life of the object, held through `path + ".lock"`
/// (flock: the kernel releases it when the process dies, even by kill -9). The lock file records
/// its holder (pid, host, command, start time); a second process that asks for the lock is refused
/// with a message naming that holder. Taking the lock removes the temporaries a writer of `path`
/// killed mid-write left beside it. The lock file is removed on release.
class FileLock {
 public:
  FileLock() = default;
  /// Takes the lock or throws fax::Error. `purpose` describes the holder ("fax-run run exp.yaml").
  FileLock(const std::string& path, const std::string& purpose);
  ~FileLock();
  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

  bool held() const { return fd_ >= 0; }
  const std::string& lock_path() const { return lock_path_; }

 private:
  void release();
  int fd_ = -1;
  std::string lock_path_;
};

}  // namespace fax
