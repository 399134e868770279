#include <fax/datasets/in_memory.h>

#include <fax/base/error.h>

namespace fax {

InMemoryDataset::InMemoryDataset(std::vector<Examples> clients, Examples test, int64_t num_classes, std::string name,
                                 std::vector<std::string> client_names)
    : clients_(std::move(clients)),
      test_(std::move(test)),
      num_classes_(num_classes),
      name_(std::move(name)),
      client_names_(std::move(client_names)) {
  FAX_CHECK(!clients_.empty(), "{}: a data set needs at least one client", name_);
  FAX_ASSERT(client_names_.empty() || client_names_.size() == clients_.size(), "{} names for {} clients",
             client_names_.size(), clients_.size());
  for (size_t i = 0; i < clients_.size(); ++i) {
    const Examples& c = clients_[i];
    FAX_CHECK(c.x.defined() && c.y.defined() && c.x.size(0) == c.y.size(0),
              "{}: client {} needs as many labels as inputs", name_, i);
    FAX_CHECK(c.x.sizes().slice(1) == clients_[0].x.sizes().slice(1),
              "{}: client {} has inputs of another shape than client 0", name_, i);
  }
}

std::string InMemoryDataset::describe() const {
  return fmt::format("{}: {} clients, {} classes", name_, clients_.size(), num_classes_);
}

int64_t InMemoryDataset::num_examples(int64_t client) const { return this->client(client).size(); }

Examples InMemoryDataset::client(int64_t client) const {
  FAX_CHECK(client >= 0 && client < num_clients(), "{}: client {} is not in the population (0..{})", name_, client,
            num_clients() - 1);
  return clients_[client];
}

std::string InMemoryDataset::client_name(int64_t client) const {
  return client_names_.empty() ? "" : client_names_.at(client);
}

std::vector<int64_t> InMemoryDataset::input_shape() const {
  const auto shape = clients_[0].x.sizes().slice(1);
  return {shape.begin(), shape.end()};
}

}  // namespace fax
