#include <fax/datasets.h>

#include <fax/registry.h>
#include <fax/synthetic.h>

namespace fax {

const std::vector<DatasetEntry>& dataset_registry() {
  static const std::vector<DatasetEntry> registry = {
      {"synthetic",
       "synthetic(alpha, beta) of Li et al. 2020 (FedProx / LEAF): heterogeneous softmax-regression clients",
       {int_key("clients", "100", "clients in the population", 1),
        float_key("alpha", "1.0", "spread of the clients' models (0: one shared model mean)", 0),
        float_key("beta", "1.0", "spread of the clients' input distributions", 0),
        int_key("dimension", "60", "input features", 1),
        int_key("classes", "10", "classes", 2),
        bool_key("iid", "false", "one global model and input distribution for every client"),
        float_key("test_fraction", "0.1", "share of each client's examples held out for the test split", 0, 0.9),
        int_key("seed", "0", "seed of the data (independent of the training seed)", 0)},
       [](const Config& c) -> std::unique_ptr<FederatedDataset> {
         SyntheticOptions o;
         o.clients = c.get_int("data.clients");
         o.alpha = c.get_float("data.alpha");
         o.beta = c.get_float("data.beta");
         o.dimension = c.get_int("data.dimension");
         o.classes = c.get_int("data.classes");
         o.iid = c.get_bool("data.iid");
         o.test_fraction = c.get_float("data.test_fraction");
         o.seed = static_cast<uint64_t>(c.get_int("data.seed"));
         return std::make_unique<SyntheticDataset>(o);
       }},
  };
  return registry;
}

const DatasetEntry& find_dataset(const std::string& name) {
  return find_entry(dataset_registry(), name, "data set");
}

}  // namespace fax
