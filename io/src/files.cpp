#include <fax/io/files.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>

#include <fax/base/error.h>

namespace fax {
namespace fs = std::filesystem;
namespace {

std::string errno_text(int error) { return std::strerror(error); }

std::string directory_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// A name beside `path` that no other writer picks: pid and random bits (two fax-run processes, or
// two threads of one, never share a temporary file).
std::string temporary_beside(const std::string& path) {
  static thread_local std::mt19937_64 bits(std::random_device{}() ^ static_cast<uint64_t>(getpid()));
  const fs::path p(path);
  const fs::path name = fmt::format(".{}.tmp-{}-{:012x}", p.filename().string(), getpid(), bits() & 0xffffffffffffull);
  return (p.parent_path() / name).string();
}

// Writes all of `size` bytes, retrying short writes and interruptions.
int write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

void fsync_directory(const std::string& dir, const std::string& path) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  FAX_CHECK(fd >= 0, "{}: written, but its directory cannot be opened to sync it: {}", path, errno_text(errno));
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  // Some file systems cannot sync a directory (EINVAL): the rename is then as durable as they allow.
  FAX_CHECK(rc == 0 || error == EINVAL, "{}: written, but its directory cannot be synced: {}", path, errno_text(error));
}

// The temporaries write_file_atomically leaves when its process dies mid-write. Called with the
// file's lock held: no live writer of `path` exists, so they are all stale.
void remove_stale_temporaries(const std::string& path) {
  const fs::path p(path);
  const std::string prefix = "." + p.filename().string() + ".tmp-";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory_of(path), ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) != 0) continue;
    std::error_code ignored;
    fs::remove(entry.path(), ignored);
  }
}

}  // namespace

void write_file_atomically(const std::string& path, const void* data, size_t size) {
  const std::string tmp = temporary_beside(path);
  struct stat existing {};
  const char* outcome = ::stat(path.c_str(), &existing) == 0 ? "the previous file is unchanged" : "nothing was written";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  FAX_CHECK(fd >= 0, "{}: cannot create a file in {}: {}; {}", path, directory_of(path), errno_text(errno), outcome);
  auto fail = [&](const char* step, int error) {
    ::unlink(tmp.c_str());
    throw Error(fmt::format("{}: cannot {}: {}; {}", path, step, errno_text(error), outcome));
  };
  if (const int error = write_all(fd, static_cast<const char*>(data), size)) {
    ::close(fd);
    fail("write", error);
  }
  if (::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    fail("write (sync)", error);
  }
  if (::close(fd) != 0) fail("write (close)", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("replace the file", errno);
  fsync_directory(directory_of(path), path);
}

void write_file_atomically(const std::string& path, const std::string& text) {
  write_file_atomically(path, text.data(), text.size());
}

std::string read_regular_file(const std::string& path, size_t max_bytes, const std::string& what) {
  struct stat info {};
  FAX_CHECK(::stat(path.c_str(), &info) == 0, "{}: cannot open {}: {}", path, what, errno_text(errno));
  FAX_CHECK(!S_ISDIR(info.st_mode), "{}: is a directory; {} must be a regular file", path, what);
  FAX_CHECK(S_ISREG(info.st_mode), "{}: is not a regular file (a FIFO, device or socket); {} must be one", path, what);
  FAX_CHECK(static_cast<uint64_t>(info.st_size) <= max_bytes, "{}: larger than {} MiB; {} is a small file", path,
            max_bytes >> 20, what);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FAX_CHECK(fd >= 0, "{}: cannot open {}: {}", path, what, errno_text(errno));
  // Read at most one byte past the limit: a file that grows meanwhile is still refused. The buffer
  // starts at the size stat gave (a limit is no reason to zero that much memory) and grows.
  std::string text(std::min<size_t>(max_bytes, static_cast<size_t>(info.st_size)) + 1, '\0');
  size_t got = 0;
  while (true) {
    if (got == text.size()) {
      if (text.size() > max_bytes) {
        ::close(fd);
        break;
      }
      text.resize(std::min(max_bytes + 1, 2 * text.size()));
    }
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : 0;
      ::close(fd);
      FAX_CHECK(n == 0, "{}: cannot read {}: {}", path, what, errno_text(error));
      break;
    }
    got += static_cast<size_t>(n);
  }
  FAX_CHECK(got <= max_bytes, "{}: larger than {} MiB; {} is a small file", path, max_bytes >> 20, what);
  text.resize(got);
  return text;
}

std::string resolve_output(const std::string& path) {
  std::error_code ec;
  if (!fs::is_symlink(path, ec)) return path;
  const fs::path target = fs::canonical(path, ec);
  FAX_CHECK(!ec, "{}: a symbolic link to nothing that exists ({})", path, ec.message());
  return target.string();
}

void check_output_path(const std::string& path, const std::vector<std::string>& inputs, const std::string& what) {
  FAX_CHECK(!path.empty(), "{}: an empty file name", what);
  struct stat out {};
  if (::stat(path.c_str(), &out) == 0) {
    FAX_CHECK(!S_ISDIR(out.st_mode), "{}: {} is a directory; give a file name", path, what);
    FAX_CHECK(S_ISREG(out.st_mode),
              "{}: {} exists and is not a regular file (a device, FIFO or socket); fax writes only regular files",
              path, what);
  }
  std::error_code ec;
  const fs::path canonical_out = fs::weakly_canonical(path, ec);
  for (const auto& input : inputs) {
    if (input.empty()) continue;
    struct stat in {};
    const bool same_inode = ::stat(input.c_str(), &in) == 0 && ::stat(path.c_str(), &out) == 0 &&
                            in.st_dev == out.st_dev && in.st_ino == out.st_ino;
    std::error_code ec_in;
    const bool same_path = !ec && fs::weakly_canonical(input, ec_in) == canonical_out && !ec_in;
    FAX_CHECK(!same_inode && !same_path, "{}: {} would overwrite the input {}; choose another output", path, what,
              input);
  }
}

FileLock::FileLock(const std::string& path, const std::string& purpose) : lock_path_(path + ".lock") {
  // Take the lock, then make sure the lock file is still the one at lock_path_: a holder that
  // released it in between has unlinked it, and a lock on an unlinked file protects nothing.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    FAX_CHECK(fd >= 0, "{}: cannot create the file's lock {}: {}", path, lock_path_, errno_text(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      char holder[512] = {};
      const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
      ::close(fd);
      FAX_CHECK(error != EWOULDBLOCK, "{} is in use by {} (lock file {}); wait for it to finish or stop it first", path,
                n > 0 ? std::string(holder, static_cast<size_t>(n)) : std::string("another process"), lock_path_);
      throw Error(fmt::format("{}: cannot lock {}: {}", path, lock_path_, errno_text(error)));
    }
    struct stat held {}, now {};
    if (::fstat(fd, &held) == 0 && ::stat(lock_path_.c_str(), &now) == 0 && held.st_ino == now.st_ino &&
        held.st_dev == now.st_dev) {
      char host[256] = {};
      if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown");
      const std::time_t since = std::time(nullptr);
      char when[64] = {};
      std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&since));
      const std::string text = fmt::format("{} (pid {} on {}, since {})", purpose, getpid(), host, when);
      // The description is a courtesy to the next process: a lock whose text cannot be written
      // (a full disk) still locks.
      if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, text.data(), text.size(), 0);
      fd_ = fd;
      remove_stale_temporaries(path);
      return;
    }
    ::close(fd);
  }
  throw Error(fmt::format("{}: cannot lock {}: it keeps being replaced", path, lock_path_));
}

FileLock::~FileLock() { release(); }

FileLock::FileLock(FileLock&& other) noexcept : fd_(other.fd_), lock_path_(std::move(other.lock_path_)) {
  other.fd_ = -1;
}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = other.fd_;
    lock_path_ = std::move(other.lock_path_);
    other.fd_ = -1;
  }
  return *this;
}

void FileLock::release() {
  if (fd_ < 0) return;
  // Unlinked while still held, so a process waiting on this file finds it gone and retries.
  ::unlink(lock_path_.c_str());
  ::close(fd_);
  fd_ = -1;
}

}  // namespace fax
