#include <fax/datasets/idx.h>

#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include <ATen/ATen.h>

#include <fax/base/error.h>

namespace fax {
namespace {

constexpr int64_t kMaxElements = int64_t{1} << 34;
constexpr int64_t kReadChunk = int64_t{1} << 24;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

// Reads up to `n` bytes; returns how many arrived. gzread also reads uncompressed files.
int64_t read_some(gzFile f, void* out, int64_t n, const std::string& path) {
  int64_t got = 0;
  auto* bytes = static_cast<unsigned char*>(out);
  while (got < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<int64_t>(n - got, 1 << 30));
    const int r = gzread(f, bytes + got, chunk);
    if (r < 0) {
      int code = 0;
      const char* message = gzerror(f, &code);
      throw Error(fmt::format("{}: corrupt data: {}", path, message));
    }
    if (r == 0) break;
    got += r;
  }
  return got;
}

}  // namespace

at::Tensor read_idx(const std::string& path) {
  FAX_CHECK(std::filesystem::is_regular_file(path), "{}: no such file", path);
  GzFile f(gzopen(path.c_str(), "rb"));
  FAX_CHECK(f != nullptr, "{}: cannot open", path);
  unsigned char magic[4] = {0};
  FAX_CHECK(read_some(f.get(), magic, 4, path) == 4 && magic[0] == 0 && magic[1] == 0,
            "{}: not an IDX file (bad magic number)", path);
  FAX_CHECK(magic[2] == 0x08, "{}: IDX element type 0x{:02x}; only unsigned bytes (0x08) are supported", path,
            magic[2]);
  const int rank = magic[3];
  FAX_CHECK(rank >= 1 && rank <= 4, "{}: IDX header claims {} dimensions", path, rank);
  std::vector<int64_t> shape;
  int64_t total = 1;
  for (int d = 0; d < rank; ++d) {
    unsigned char be[4];
    FAX_CHECK(read_some(f.get(), be, 4, path) == 4, "{}: truncated IDX header", path);
    const int64_t size = (int64_t{be[0]} << 24) | (int64_t{be[1]} << 16) | (int64_t{be[2]} << 8) | be[3];
    FAX_CHECK(size > 0 && size <= kMaxElements / total, "{}: IDX dimension {} has size {}: more than {} elements", path,
              d, size, kMaxElements);
    shape.push_back(size);
    total *= size;
  }
  // Read before allocating the whole tensor: a header can promise more than the file holds.
  std::vector<unsigned char> bytes;
  int64_t got = 0;
  while (got < total) {
    bytes.resize(static_cast<size_t>(std::min(total, got + kReadChunk)));
    const int64_t want = static_cast<int64_t>(bytes.size()) - got;
    const int64_t arrived = read_some(f.get(), bytes.data() + got, want, path);
    got += arrived;
    if (arrived < want) break;
  }
  FAX_CHECK(got == total, "{}: truncated: the header promises {} bytes of data, the file holds {}", path, total, got);
  at::Tensor out = at::empty(shape, at::kByte);
  std::memcpy(out.data_ptr(), bytes.data(), static_cast<size_t>(total));
  return out;
}

}  // namespace fax
