#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace fax {

/// How a centralised data set is split into clients.
struct PartitionOptions {
  /// "iid": a random permutation cut into near-equal parts.
  /// "dirichlet": label skew (Hsu et al. 2019): every client draws class proportions from
  ///   Dirichlet(alpha) and gets an equal share of the examples in those proportions; small
  ///   alpha, few classes per client.
  /// "shards": McMahan et al. 2017: examples sorted by label, cut into shards_per_client x clients
  ///   shards, each client gets shards_per_client of them (2: mostly two classes per client).
  std::string kind = "iid";
  int64_t clients = 100;
  double alpha = 0.5;
  int64_t shards_per_client = 2;
  /// Every client must get at least this many examples (an error otherwise).
  int64_t min_examples = 1;
  uint64_t seed = 0;
};

/// The example indices of each client. Deterministic for given labels and options.
std::vector<at::Tensor> partition(const at::Tensor& labels, int64_t num_classes, const PartitionOptions& options);

}  // namespace fax
