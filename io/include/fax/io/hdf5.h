#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace fax::h5 {

/// An HDF5 file opened for reading (libhdf5). Errors name the file and the object.
class File {
 public:
  /// Throws fax::Error when `path` is missing or not an HDF5 file.
  explicit File(const std::string& path);
  ~File();
  File(File&&) noexcept;
  File& operator=(File&&) noexcept;

  const std::string& path() const { return path_; }
  bool exists(const std::string& name) const;
  /// The members (groups and datasets) of a group, in name order.
  std::vector<std::string> members(const std::string& group) const;
  /// The datasets below a group, recursively, relative to it, in name order.
  std::vector<std::string> datasets_below(const std::string& group) const;
  /// A numeric dataset as a tensor of its shape (float32/64, int8..64, uint8).
  at::Tensor read(const std::string& dataset) const;
  /// A 1-D dataset of strings (variable or fixed length).
  std::vector<std::string> read_strings(const std::string& dataset) const;
  /// A scalar string dataset, or a string attribute of an object.
  std::string read_string(const std::string& dataset) const;
  std::string read_string_attribute(const std::string& object, const std::string& attribute) const;
  /// The file an external link `name` points to (its object must be the root, "/"); nothing
  /// when `name` is missing or not an external link. The link is not followed.
  std::optional<std::string> external_link(const std::string& name) const;
  /// Every string attribute of an object, in creation order where tracked.
  std::vector<std::pair<std::string, std::string>> string_attributes(const std::string& object) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

/// An HDF5 file being built by write_file. Datasets create the groups on their way.
class Writer {
 public:
  void string(const std::string& name, const std::string& value);
  void strings(const std::string& name, const std::vector<std::string>& values);
  /// A tensor as a dataset of its shape and type.
  void tensor(const std::string& name, const at::Tensor& tensor);

 private:
  friend void write_file(const std::string& path, const std::function<void(Writer&)>& fill);
  Writer(int64_t file, const std::string& path) : file_(file), path_(path) {}
  int64_t file_;  // an hid_t
  const std::string& path_;
};

/// Writes the HDF5 file `fill` builds, crash-safely: built in memory, then written beside `path`,
/// synced and renamed over it, so that `path` always holds a whole file, and a failed write (a
/// full disk) leaves the previous one.
void write_file(const std::string& path, const std::function<void(Writer&)>& fill);

}  // namespace fax::h5
