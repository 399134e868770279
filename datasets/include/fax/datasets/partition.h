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
  /// "label_dirichlet": the non-IID benchmark's distribution-based label imbalance, p_k ~ Dir_N(alpha)
  ///   (Li et al. 2022): each label's examples are split among the clients in proportions drawn
  ///   from Dirichlet(alpha), a client that already holds 1/N of the set taking no more; redrawn
  ///   until every client has min_examples. Client sizes differ.
  /// "shards": McMahan et al. 2017: examples sorted by label, cut into shards_per_client x clients
  ///   shards, each client gets shards_per_client of them (2: mostly two classes per client).
  /// "label_quantity": the non-IID benchmark's #C = k (Li et al. 2022): client i holds label
  ///   i mod classes and k - 1 other distinct labels drawn at random; each label's examples are
  ///   split evenly among the clients that hold it (a label no client holds goes unused).
  /// "quantity_skew": the non-IID benchmark's quantity skew: a random permutation cut into client
  ///   sizes in proportions drawn from Dirichlet(beta), redrawn until every client has
  ///   min_examples.
  std::string kind = "iid";
  int64_t clients = 100;
  double alpha = 0.5;
  int64_t shards_per_client = 2;
  /// Every client must get at least this many examples (an error otherwise).
  int64_t min_examples = 1;
  uint64_t seed = 0;
  int64_t labels_per_client = 2;  ///< label_quantity's k
  double beta = 0.5;              ///< quantity_skew's concentration
};

/// The example indices of each client. Deterministic for given labels and options.
std::vector<at::Tensor> partition(const at::Tensor& labels, int64_t num_classes, const PartitionOptions& options);

}  // namespace fax
