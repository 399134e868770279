#pragma once

// HDF5 plumbing shared by the run log and fax::h5::File (private to libfax_io).

#include <hdf5.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include <fax/base/error.h>

namespace fax::h5::detail {

// An HDF5 identifier closed by the matching H5?close.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept {
    std::swap(id_, o.id_);
    std::swap(close_, o.close_);
    return *this;
  }
  ~Handle() {
    if (id_ >= 0 && close_ != nullptr) close_(id_);
  }
  hid_t get() const { return id_; }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

// Runs an HDF5 call that returns an id or status; a negative result is an error naming `what`.
template <class T>
T checked(T result, const std::string& path, const std::string& what) {
  FAX_CHECK(result >= 0, "{}: HDF5 failed to {}", path, what);
  return result;
}

inline void silence_hdf5_errors() {
  static const bool once = [] { return H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr) >= 0; }();
  (void)once;
}

inline Handle utf8_string_type() {
  Handle t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  return t;
}

inline Handle intermediate_groups() {
  Handle p(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(p.get(), 1);
  return p;
}

inline hid_t native_type(at::ScalarType t, const std::string& path) {
  switch (t) {
    case at::kFloat: return H5T_NATIVE_FLOAT;
    case at::kDouble: return H5T_NATIVE_DOUBLE;
    case at::kLong: return H5T_NATIVE_INT64;
    case at::kInt: return H5T_NATIVE_INT32;
    case at::kShort: return H5T_NATIVE_INT16;
    case at::kChar: return H5T_NATIVE_INT8;
    case at::kByte: return H5T_NATIVE_UINT8;
    default: throw Error(fmt::format("{}: cannot store tensors of type {} in HDF5", path, c10::toString(t)));
  }
}

inline at::ScalarType scalar_type_of(hid_t type, const std::string& path) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT && (size == 4 || size == 8)) return size == 4 ? at::kFloat : at::kDouble;
  if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    if (size == 1) return is_signed ? at::kChar : at::kByte;
    if (is_signed && size == 2) return at::kShort;
    if (is_signed && size == 4) return at::kInt;
    if (is_signed && size == 8) return at::kLong;
  }
  throw Error(fmt::format("{}: unsupported HDF5 element type (class {}, {} bytes)", path, static_cast<int>(cls), size));
}

/// A variable-length UTF-8 string from a scalar dataset or attribute.
std::string read_vlen_string(hid_t object, bool attribute, const std::string& path);

// Writers (hdf5_write.cpp). `path` names the file in errors; datasets create the groups on the way.
void write_string(hid_t file, const std::string& name, const std::string& value, const std::string& path);
void write_strings(hid_t file, const std::string& name, const std::vector<std::string>& values, const std::string& path);
void write_string_attribute(hid_t object, const std::string& name, const std::string& value, const std::string& path);
/// A tensor as a dataset of its shape and type.
void write_tensor(hid_t file, const std::string& name, const at::Tensor& tensor, const std::string& path);
/// Writes a complete HDF5 file through `fill`, built in memory and then written crash-safely
/// (write_file_atomically: beside `path`, synced, renamed), so that `path` always holds a whole
/// file whenever the process dies, and a failed write (a full disk) leaves the previous file.
void write_atomically(const std::string& path, const std::function<void(hid_t)>& fill);

}  // namespace fax::h5::detail
