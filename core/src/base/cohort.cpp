#include <fax/base/cohort.h>

#include <fax/base/error.h>

namespace fax {
namespace {
// Start of part `i` when `total` items are cut into `parts` near-equal contiguous parts.
int64_t part_begin(int64_t total, int64_t parts, int64_t i) {
  const int64_t base = total / parts;
  const int64_t extra = total % parts;
  return i * base + std::min(i, extra);
}
}  // namespace

Cohort::Cohort(std::vector<int64_t> client_ids, std::vector<double> weights)
    : ids_(std::move(client_ids)), weights_(std::move(weights)) {
  if (weights_.empty()) weights_.assign(ids_.size(), 1.0);
  FAX_CHECK(weights_.size() == ids_.size(), "cohort of {} clients given {} weights", ids_.size(),
            weights_.size());
}

Cohort Cohort::range(int64_t n) {
  FAX_CHECK(n >= 0, "a cohort cannot have {} clients", n);
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = i;
  return Cohort(std::move(ids));
}

ShardLayout::ShardLayout(int64_t clients, int64_t logical_shards, int executors)
    : clients_(clients), shards_(logical_shards), executors_(executors) {
  FAX_CHECK(clients >= 0, "a cohort cannot have {} clients", clients);
  FAX_CHECK(logical_shards > 0, "execution.logical_shards must be positive (got {})", logical_shards);
  FAX_CHECK(executors > 0, "execution.executors must be positive (got {})", executors);
  FAX_CHECK(executors <= logical_shards,
            "execution.executors ({}) exceeds execution.logical_shards ({}): every executor needs "
            "at least one logical shard",
            executors, logical_shards);
}

Range ShardLayout::shard_clients(int64_t shard) const {
  FAX_ASSERT(shard >= 0 && shard < shards_, "shard {} of {}", shard, shards_);
  return {part_begin(clients_, shards_, shard), part_begin(clients_, shards_, shard + 1)};
}

Range ShardLayout::executor_shards(int executor) const {
  FAX_ASSERT(executor >= 0 && executor < executors_, "executor {} of {}", executor, executors_);
  return {part_begin(shards_, executors_, executor), part_begin(shards_, executors_, executor + 1)};
}

Range ShardLayout::executor_clients(int executor) const {
  const Range shards = executor_shards(executor);
  return {shard_clients(shards.begin).begin, shard_clients(shards.end - 1).end};
}

int ShardLayout::owner(int64_t shard) const {
  for (int e = 0; e < executors_; ++e)
    if (executor_shards(e).end > shard) return e;
  FAX_ASSERT(false, "shard {} of {} has no owner", shard, shards_);
}

}  // namespace fax
