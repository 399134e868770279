#pragma once

#include <string>
#include <vector>

#include <fax/train/dataset.h>

namespace fax {

/// A federated data set held as given: one Examples per client and a test split. For tests, and
/// for data a program builds itself.
class InMemoryDataset final : public FederatedDataset {
 public:
  InMemoryDataset(std::vector<Examples> clients, Examples test, int64_t num_classes, std::string name = "in-memory",
                  std::vector<std::string> client_names = {});

  std::string describe() const override;
  int64_t num_clients() const override { return static_cast<int64_t>(clients_.size()); }
  int64_t num_examples(int64_t client) const override;
  Examples client(int64_t client) const override;
  std::string client_name(int64_t client) const override;
  const Examples& test() const override { return test_; }
  std::vector<int64_t> input_shape() const override;
  int64_t num_classes() const override { return num_classes_; }

 private:
  std::vector<Examples> clients_;
  Examples test_;
  int64_t num_classes_;
  std::string name_;
  std::vector<std::string> client_names_;
};

}  // namespace fax
