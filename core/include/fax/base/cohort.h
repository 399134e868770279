#pragma once

#include <cstdint>
#include <vector>

namespace fax {

/// The clients taking part in one round: their global ids in cohort order, and their weights
/// (default 1). A client's *position* is its index in this order. It may be empty (a Poisson
/// draw of nobody).
class Cohort {
 public:
  explicit Cohort(std::vector<int64_t> client_ids, std::vector<double> weights = {});
  /// Clients 0, 1, ..., n - 1 with weight 1.
  static Cohort range(int64_t n);

  int64_t size() const { return static_cast<int64_t>(ids_.size()); }
  int64_t id(int64_t position) const { return ids_.at(position); }
  double weight(int64_t position) const { return weights_.at(position); }
  const std::vector<int64_t>& ids() const { return ids_; }
  const std::vector<double>& weights() const { return weights_; }

 private:
  std::vector<int64_t> ids_;
  std::vector<double> weights_;
};

/// Half-open range [begin, end).
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range& other) const { return begin == other.begin && end == other.end; }
};

/// How a cohort of N clients is cut into L logical shards and how E executors own them. Shards are
/// contiguous runs of cohort positions, as equal as possible (the first N mod L get one more);
/// executors own contiguous runs of shards, as equal as possible; with N < L the last shards are
/// empty. The cut into shards does not
/// depend on E: that is what makes results independent of the executor count.
class ShardLayout {
 public:
  ShardLayout(int64_t clients, int64_t logical_shards, int executors);

  int64_t clients() const { return clients_; }
  int64_t logical_shards() const { return shards_; }
  int executors() const { return executors_; }

  /// Cohort positions of logical shard `shard`.
  Range shard_clients(int64_t shard) const;
  /// Logical shards owned by `executor`.
  Range executor_shards(int executor) const;
  /// Cohort positions owned by `executor` (the union of its shards).
  Range executor_clients(int executor) const;
  /// The executor that owns logical shard `shard`.
  int owner(int64_t shard) const;

 private:
  int64_t clients_;
  int64_t shards_;
  int executors_;
};

}  // namespace fax
