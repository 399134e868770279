#pragma once

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

}  // namespace fax::h5
