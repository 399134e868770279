#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include <fax/spmd/communicator.h>

// The arithmetic of every allreduce backend, shared so that all of them produce the same bits:
// the partials of all logical shards, in shard order, summed element by element.
namespace fax::detail {

/// The partials sorted by logical shard; each shard 0..L-1 must appear exactly once.
std::vector<const ShardPartial*> by_shard(std::vector<const ShardPartial*> partials);

/// Checks that value j has the same shape and dtype in every partial.
void check_same_shapes(const std::vector<const ShardPartial*>& ordered, size_t j);

/// Writes elements [begin, begin + length) of value j summed over `ordered`: ((p0 + p1) + p2) + ...
void ordered_sum_slice(const std::vector<const ShardPartial*>& ordered, size_t j, const at::Tensor& out,
                       int64_t begin, int64_t length);

/// Value j summed over `ordered` into a new contiguous tensor.
at::Tensor ordered_sum(const std::vector<const ShardPartial*>& ordered, size_t j);

}  // namespace fax::detail
