#include <fax/io/hdf5.h>

#include <algorithm>
#include <optional>

#include <ATen/ATen.h>

#include "hdf5_util.h"

namespace fax::h5 {
using namespace detail;

namespace detail {
std::string read_vlen_string(hid_t object, bool attribute, const std::string& path) {
  Handle type = utf8_string_type();
  char* text = nullptr;
  const herr_t status = attribute ? H5Aread(object, type.get(), &text)
                                  : H5Dread(object, type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &text);
  std::string out = text != nullptr ? text : "";
  H5free_memory(text);
  checked(status, path, attribute ? "read a string attribute" : "read a string");
  return out;
}

}  // namespace detail

namespace {

// Deflate expands at most ~1032:1; a dataset that claims more than that of its stored bytes is corrupt.
constexpr uint64_t kMaxExpansion = 1100;
constexpr uint64_t kMaxBytes = uint64_t{1} << 40;

// The dataset's shape, once checked against what the file really stores: a corrupt header must fail
// with an error, not allocate terabytes.
std::vector<int64_t> checked_shape(hid_t ds, hid_t space, size_t stored_element_bytes, const std::string& where) {
  const int rank = H5Sget_simple_extent_ndims(space);
  FAX_CHECK(rank >= 0, "{}: unreadable dataspace", where);
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  uint64_t bytes = std::max<uint64_t>(stored_element_bytes, 1);
  for (const hsize_t d : dims) {
    FAX_CHECK(d == 0 || bytes <= kMaxBytes / d, "{}: corrupt: the shape claims more than {} bytes", where, kMaxBytes);
    bytes *= d;
  }
  const uint64_t stored = H5Dget_storage_size(ds);
  Handle dcpl(H5Dget_create_plist(ds), H5Pclose);
  const bool filtered = dcpl.get() >= 0 && H5Pget_layout(dcpl.get()) == H5D_CHUNKED && H5Pget_nfilters(dcpl.get()) > 0;
  const uint64_t limit = filtered ? stored * kMaxExpansion : stored;
  const bool empty = std::find(dims.begin(), dims.end(), hsize_t{0}) != dims.end();
  FAX_CHECK(empty || bytes <= limit, "{}: corrupt: the shape claims {} bytes, the file stores {}", where, bytes, stored);
  return {dims.begin(), dims.end()};
}

}  // namespace

struct File::Impl {
  Handle file;
};

File::File(const std::string& path) : impl_(std::make_unique<Impl>()), path_(path) {
  silence_hdf5_errors();
  FAX_CHECK(H5Fis_hdf5(path.c_str()) > 0, "{}: missing, unreadable or not an HDF5 file", path);
  impl_->file = Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  FAX_CHECK(impl_->file.get() >= 0, "{}: cannot open the HDF5 file", path);
}

File::~File() = default;
File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;

bool File::exists(const std::string& name) const {
  // H5Lexists checks one link at a time: walk the path so a missing parent is "no" rather than an error.
  std::string prefix;
  size_t start = name.front() == '/' ? 1 : 0;
  while (start <= name.size()) {
    const size_t slash = name.find('/', start);
    prefix = name.substr(0, slash);
    if (H5Lexists(impl_->file.get(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return true;
}

std::vector<std::string> File::members(const std::string& group) const {
  FAX_CHECK(exists(group), "{}: no group {}", path_, group);
  Handle g(checked(H5Gopen2(impl_->file.get(), group.c_str(), H5P_DEFAULT), path_, "open " + group), H5Gclose);
  std::vector<std::string> names;
  auto visit = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  checked(H5Literate(g.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, visit, &names), path_, "list " + group);
  return names;
}

std::vector<std::string> File::datasets_below(const std::string& group) const {
  std::vector<std::string> names;
  if (!exists(group)) return names;
  auto visit = [](hid_t, const char* name, const H5O_info_t* info, void* data) -> herr_t {
    if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  Handle g(checked(H5Gopen2(impl_->file.get(), group.c_str(), H5P_DEFAULT), path_, "open " + group), H5Gclose);
  checked(H5Ovisit2(g.get(), H5_INDEX_NAME, H5_ITER_INC, visit, &names, H5O_INFO_BASIC), path_, "list " + group);
  return names;
}

at::Tensor File::read(const std::string& name) const {
  FAX_CHECK(exists(name), "{}: no dataset {}", path_, name);
  Handle ds(checked(H5Dopen2(impl_->file.get(), name.c_str(), H5P_DEFAULT), path_, "open " + name), H5Dclose);
  Handle space(H5Dget_space(ds.get()), H5Sclose);
  Handle type(H5Dget_type(ds.get()), H5Tclose);
  const at::ScalarType st = scalar_type_of(type.get(), path_ + ":" + name);
  const std::vector<int64_t> shape = checked_shape(ds.get(), space.get(), H5Tget_size(type.get()), path_ + ":" + name);
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(st));
  if (t.numel() > 0) {
    checked(H5Dread(ds.get(), native_type(st, path_), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()), path_,
            "read " + name);
  }
  return t;
}

std::vector<std::string> File::read_strings(const std::string& name) const {
  FAX_CHECK(exists(name), "{}: no dataset {}", path_, name);
  Handle ds(checked(H5Dopen2(impl_->file.get(), name.c_str(), H5P_DEFAULT), path_, "open " + name), H5Dclose);
  Handle type(H5Dget_type(ds.get()), H5Tclose);
  FAX_CHECK(H5Tget_class(type.get()) == H5T_STRING, "{}: {} does not hold strings", path_, name);
  Handle space(H5Dget_space(ds.get()), H5Sclose);
  checked_shape(ds.get(), space.get(), H5Tget_size(type.get()), path_ + ":" + name);
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  std::vector<std::string> out;
  if (H5Tis_variable_str(type.get()) > 0) {
    Handle mem = utf8_string_type();
    std::vector<char*> raw(n, nullptr);
    // A read that fails halfway (a corrupt file) has already allocated some strings: reclaim before checking.
    const herr_t status = H5Dread(ds.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data());
    if (status >= 0) {
      for (char* r : raw) out.emplace_back(r != nullptr ? r : "");
    }
    H5Dvlen_reclaim(mem.get(), space.get(), H5P_DEFAULT, raw.data());
    checked(status, path_, "read " + name);
  } else {
    const size_t width = H5Tget_size(type.get());
    std::vector<char> raw(width * n);
    checked(H5Dread(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()), path_, "read " + name);
    for (hssize_t i = 0; i < n; ++i) {
      const char* begin = raw.data() + i * width;
      out.emplace_back(begin, strnlen(begin, width));
    }
  }
  return out;
}

std::string File::read_string(const std::string& name) const {
  FAX_CHECK(exists(name), "{}: no dataset {}", path_, name);
  Handle ds(checked(H5Dopen2(impl_->file.get(), name.c_str(), H5P_DEFAULT), path_, "open " + name), H5Dclose);
  return read_vlen_string(ds.get(), false, path_);
}

std::string File::read_string_attribute(const std::string& object, const std::string& attribute) const {
  // Open the object first: it may sit behind an external link (a checkpoint file).
  Handle o(checked(H5Oopen(impl_->file.get(), object.c_str(), H5P_DEFAULT), path_, "open " + object), H5Oclose);
  Handle a(checked(H5Aopen(o.get(), attribute.c_str(), H5P_DEFAULT), path_, "read attribute " + attribute + " of " + object),
           H5Aclose);
  return read_vlen_string(a.get(), true, path_);
}

std::optional<std::string> File::external_link(const std::string& name) const {
  if (!exists(name)) return std::nullopt;
  H5L_info_t info;
  checked(H5Lget_info(impl_->file.get(), name.c_str(), &info, H5P_DEFAULT), path_, "inspect the link " + name);
  if (info.type != H5L_TYPE_EXTERNAL) return std::nullopt;
  FAX_CHECK(info.u.val_size > 0 && info.u.val_size < (size_t{1} << 16), "{}: {}: corrupt external link", path_, name);
  std::vector<char> value(info.u.val_size);
  checked(H5Lget_val(impl_->file.get(), name.c_str(), value.data(), value.size(), H5P_DEFAULT), path_,
          "read the link " + name);
  const char* file = nullptr;
  const char* object = nullptr;
  unsigned flags = 0;
  checked(H5Lunpack_elink_val(value.data(), value.size(), &flags, &file, &object), path_, "read the link " + name);
  FAX_CHECK(file != nullptr && object != nullptr && std::string(object) == "/",
            "{}: {} links to an object other than a file's root", path_, name);
  return std::string(file);
}

std::vector<std::pair<std::string, std::string>> File::string_attributes(const std::string& object) const {
  Handle o(checked(H5Oopen(impl_->file.get(), object.c_str(), H5P_DEFAULT), path_, "open " + object), H5Oclose);
  H5O_info_t info;
  checked(H5Oget_info2(o.get(), &info, H5O_INFO_NUM_ATTRS), path_, "inspect " + object);
  std::vector<std::pair<std::string, std::string>> out;
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    Handle attr(H5Aopen_by_idx(o.get(), ".", H5_INDEX_CRT_ORDER, H5_ITER_INC, i, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (attr.get() < 0) {
      attr = Handle(checked(H5Aopen_by_idx(o.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, H5P_DEFAULT, H5P_DEFAULT),
                            path_, "read the attributes of " + object),
                    H5Aclose);
    }
    char name[256] = {0};
    H5Aget_name(attr.get(), sizeof(name), name);
    out.emplace_back(name, read_vlen_string(attr.get(), true, path_));
  }
  return out;
}

}  // namespace fax::h5
