// HDF5 writers: the run log's and checkpoints' (hdf5_util.h) and the public h5::Writer.

#include <vector>

#include <ATen/ATen.h>

#include <fax/io/files.h>

#include <fax/io/hdf5.h>

#include "hdf5_util.h"

namespace fax::h5::detail {

void write_string(hid_t file, const std::string& name, const std::string& value, const std::string& path) {
  Handle type = utf8_string_type();
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle ds(checked(H5Dcreate2(file, name.c_str(), type.get(), space.get(), intermediate_groups().get(), H5P_DEFAULT,
                               H5P_DEFAULT),
                    path, "create " + name),
            H5Dclose);
  const char* text = value.c_str();
  checked(H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &text), path, "write " + name);
}

void write_strings(hid_t file, const std::string& name, const std::vector<std::string>& values, const std::string& path) {
  Handle type = utf8_string_type();
  const hsize_t n = values.size();
  Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  Handle ds(checked(H5Dcreate2(file, name.c_str(), type.get(), space.get(), intermediate_groups().get(), H5P_DEFAULT,
                               H5P_DEFAULT),
                    path, "create " + name),
            H5Dclose);
  std::vector<const char*> texts;
  for (const auto& v : values) texts.push_back(v.c_str());
  if (n > 0) checked(H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, texts.data()), path, "write " + name);
}

void write_string_attribute(hid_t object, const std::string& name, const std::string& value, const std::string& path) {
  Handle type = utf8_string_type();
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(checked(H5Acreate2(object, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), path,
                      "create attribute " + name),
              H5Aclose);
  const char* text = value.c_str();
  checked(H5Awrite(attr.get(), type.get(), &text), path, "write attribute " + name);
}

void write_tensor(hid_t file, const std::string& name, const at::Tensor& tensor, const std::string& path) {
  const at::Tensor t = tensor.detach().cpu().contiguous();
  std::vector<hsize_t> dims(t.sizes().begin(), t.sizes().end());
  Handle space(t.dim() == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(t.dim(), dims.data(), nullptr), H5Sclose);
  const hid_t type = native_type(t.scalar_type(), path);
  Handle ds(checked(H5Dcreate2(file, name.c_str(), type, space.get(), intermediate_groups().get(), H5P_DEFAULT,
                               H5P_DEFAULT),
                    path, "create " + name),
            H5Dclose);
  if (t.numel() > 0) checked(H5Dwrite(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()), path, "write " + name);
}

void write_atomically(const std::string& path, const std::function<void(hid_t)>& fill) {
  silence_hdf5_errors();
  // The file is built in memory (HDF5's core driver, no backing store) and written out as one
  // image by write_file_atomically: HDF5 never holds a half-written file on disk, so a full disk
  // is one checked write() that fails, not a corrupt file or a failing H5Fclose at exit.
  std::vector<char> image;
  {
    Handle access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    checked(H5Pset_fapl_core(access.get(), size_t{1} << 20, 0), path, "set up an in-memory file");
    // Attribute creation order is tracked so the environment reads back in the order it was written.
    Handle props(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
    H5Pset_attr_creation_order(props.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
    Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, props.get(), access.get()), H5Fclose);
    FAX_CHECK(file.get() >= 0, "{}: HDF5 cannot create the file in memory", path);
    fill(file.get());
    checked(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), path, "flush the file");
    const ssize_t size = checked(H5Fget_file_image(file.get(), nullptr, 0), path, "measure the file");
    image.resize(static_cast<size_t>(size));
    checked(H5Fget_file_image(file.get(), image.data(), image.size()), path, "copy the file out of memory");
  }
  write_file_atomically(path, image.data(), image.size());
}

}  // namespace fax::h5::detail

namespace fax::h5 {

static_assert(sizeof(hid_t) == sizeof(int64_t), "h5::Writer keeps an hid_t as int64_t");

void Writer::string(const std::string& name, const std::string& value) { detail::write_string(file_, name, value, path_); }

void Writer::strings(const std::string& name, const std::vector<std::string>& values) {
  detail::write_strings(file_, name, values, path_);
}

void Writer::tensor(const std::string& name, const at::Tensor& tensor) { detail::write_tensor(file_, name, tensor, path_); }

void write_file(const std::string& path, const std::function<void(Writer&)>& fill) {
  detail::write_atomically(path, [&](hid_t file) {
    Writer writer(file, path);
    fill(writer);
  });
}

}  // namespace fax::h5
