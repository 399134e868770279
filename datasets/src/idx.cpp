#include <fax/idx.h>

#include <zlib.h>

#include <filesystem>
#include <memory>

#include <ATen/ATen.h>

#include <fax/error.h>

namespace fax {
namespace {

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
    FAX_CHECK(size > 0 && size < (int64_t{1} << 31), "{}: IDX dimension {} has size {}", path, d, size);
    shape.push_back(size);
    total *= size;
  }
  FAX_CHECK(total <= (int64_t{1} << 34), "{}: IDX header claims {} elements", path, total);
  at::Tensor out = at::empty(shape, at::kByte);
  const int64_t got = read_some(f.get(), out.data_ptr(), total, path);
  FAX_CHECK(got == total, "{}: truncated: the header promises {} bytes of data, the file holds {}", path, total, got);
  return out;
}

}  // namespace fax
