#pragma once

#include <string>

#include <ATen/core/Tensor.h>

namespace fax {

/// Reads an IDX file (the MNIST / Fashion-MNIST format), gzip-compressed or not, into a uint8
/// tensor of the shape its header gives. Throws fax::Error naming the file when it is missing,
/// not IDX, of an element type other than unsigned bytes, truncated, or a corrupt gzip stream.
at::Tensor read_idx(const std::string& path);

}  // namespace fax
