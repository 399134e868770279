#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fax/train/dataset.h>

namespace fax {

struct SyntheticOptions {
  int64_t clients = 100;
  double alpha = 1.0;  ///< how much the clients' models differ
  double beta = 1.0;   ///< how much the clients' input distributions differ
  int64_t dimension = 60;
  int64_t classes = 10;
  bool iid = false;
  double test_fraction = 0.1;
  uint64_t seed = 0;
};

/// The synthetic(alpha, beta) federated classification task of Li et al. 2020 (FedProx), as in
/// LEAF: client k draws u_k ~ N(0, alpha) and B_k ~ N(0, beta); its model W_k [d x c], b_k [c] has
/// entries ~ N(u_k, 1); its inputs x ~ N(v_k, Sigma) with v_k ~ N(B_k, 1) per coordinate and
/// Sigma = diag(j^-1.2); labels y = argmax(x W_k + b_k). Example counts are lognormal(4, 2) + 50.
/// iid: one global model and v_k = B_k for every client. Each client's data comes from its own
/// random stream (seed, client id), so the population is the same whatever builds it; its last
/// test_fraction of examples go to the test split.
class SyntheticDataset final : public FederatedDataset {
 public:
  explicit SyntheticDataset(const SyntheticOptions& options);

  std::string describe() const override;
  int64_t num_clients() const override { return options_.clients; }
  int64_t num_examples(int64_t client) const override;
  Examples client(int64_t client) const override;
  const Examples& test() const override { return test_; }
  std::vector<int64_t> input_shape() const override { return {options_.dimension}; }
  int64_t num_classes() const override { return options_.classes; }

 private:
  SyntheticOptions options_;
  std::vector<Examples> train_;
  Examples test_;
};

}  // namespace fax
