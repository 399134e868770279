#include <fax/spmd/ordered_sum.h>

#include <algorithm>

#include <ATen/ATen.h>

#include <fax/base/error.h>

namespace fax::detail {

std::vector<const ShardPartial*> by_shard(std::vector<const ShardPartial*> ordered) {
  std::sort(ordered.begin(), ordered.end(),
            [](const ShardPartial* a, const ShardPartial* b) { return a->shard < b->shard; });
  for (size_t i = 0; i < ordered.size(); ++i)
    FAX_ASSERT(ordered[i]->shard == static_cast<int64_t>(i), "allreduce: logical shards are {} at position {}",
               ordered[i]->shard, i);
  FAX_ASSERT(!ordered.empty(), "allreduce over no logical shards");
  return ordered;
}

void check_same_shapes(const std::vector<const ShardPartial*>& ordered, size_t j) {
  const at::Tensor& first = ordered.front()->values.at(j);
  for (const auto* p : ordered) {
    const at::Tensor& v = p->values.at(j);
    FAX_ASSERT(v.sizes() == first.sizes() && v.scalar_type() == first.scalar_type(),
               "allreduce value {}: shard {} has shape [{}] {}, shard 0 has [{}] {}", j, p->shard,
               fmt::join(v.sizes(), ","), c10::toString(v.scalar_type()), fmt::join(first.sizes(), ","),
               c10::toString(first.scalar_type()));
  }
}

void ordered_sum_slice(const std::vector<const ShardPartial*>& ordered, size_t j, const at::Tensor& out,
                       int64_t begin, int64_t length) {
  at::Tensor dst = out.view({-1}).narrow(0, begin, length);
  dst.copy_(ordered.front()->values[j].reshape({-1}).narrow(0, begin, length));
  for (size_t s = 1; s < ordered.size(); ++s)
    dst.add_(ordered[s]->values[j].reshape({-1}).narrow(0, begin, length));
}

at::Tensor ordered_sum(const std::vector<const ShardPartial*>& ordered, size_t j) {
  check_same_shapes(ordered, j);
  const at::Tensor& first = ordered.front()->values[j];
  at::Tensor out = at::empty(first.sizes(), first.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() > 0) ordered_sum_slice(ordered, j, out, 0, out.numel());
  return out;
}

}  // namespace fax::detail
