#include <fax/hdf5.h>

#include <ATen/ATen.h>

#include "hdf5_util.h"

namespace fax::h5 {
using namespace detail;

namespace detail {
std::string read_vlen_string(hid_t object, bool attribute, const std::string& path) {
  Handle type = utf8_string_type();
  char* text = nullptr;
  if (attribute) {
    checked(H5Aread(object, type.get(), &text), path, "read a string attribute");
  } else {
    checked(H5Dread(object, type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &text), path, "read a string");
  }
  std::string out = text != nullptr ? text : "";
  H5free_memory(text);
  return out;
}

}  // namespace detail

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
  const int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(std::max(rank, 0));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  const at::ScalarType st = scalar_type_of(type.get(), path_ + ":" + name);
  at::Tensor t = at::empty(std::vector<int64_t>(dims.begin(), dims.end()), at::TensorOptions().dtype(st));
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
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  std::vector<std::string> out;
  if (H5Tis_variable_str(type.get()) > 0) {
    Handle mem = utf8_string_type();
    std::vector<char*> raw(n, nullptr);
    checked(H5Dread(ds.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()), path_, "read " + name);
    for (char* r : raw) out.emplace_back(r != nullptr ? r : "");
    H5Dvlen_reclaim(mem.get(), space.get(), H5P_DEFAULT, raw.data());
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
