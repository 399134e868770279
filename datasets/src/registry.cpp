#include <fax/datasets.h>

#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <limits>

#include <fax/registry.h>
#include <fax/sources.h>
#include <fax/synthetic.h>

namespace fax {

namespace {
PartitionOptions partition_options(const Config& c) {
  PartitionOptions o;
  o.kind = c.get_string("data.partition");
  o.clients = c.get_int("data.clients");
  o.alpha = c.get_float("data.alpha");
  o.shards_per_client = c.get_int("data.shards_per_client");
  o.min_examples = c.get_int("data.min_examples");
  o.seed = static_cast<uint64_t>(c.get_int("data.seed"));
  return o;
}

// Estimates: products saturate (settings can be absurd: 10^12 clients).
int64_t times(std::initializer_list<int64_t> factors) {
  int64_t out = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(out, std::max<int64_t>(f, 0), &out)) return std::numeric_limits<int64_t>::max();
  return out;
}

int64_t plus(std::initializer_list<int64_t> terms) {
  int64_t out = 0;
  for (int64_t t : terms)
    if (__builtin_add_overflow(out, std::max<int64_t>(t, 0), &out)) return std::numeric_limits<int64_t>::max();
  return out;
}

// The bytes of a file, or of the regular files of a folder; 0 when neither exists (create() says why).
int64_t bytes_on_disk(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return static_cast<int64_t>(fs::file_size(path, ec));
  int64_t total = 0;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    std::error_code e;
    if (entry.is_regular_file(e)) total += static_cast<int64_t>(entry.file_size(e));
  }
  return total;
}

// Synthetic clients hold exp(4 + 2 z) + 50 examples: 453 on average.
constexpr int64_t kSyntheticExamples = 460;
// Fashion-MNIST: 70,000 images of 784 pixels, as bytes and then as floats.
constexpr int64_t kFashionMnistBytes = int64_t{70000} * 784 * 5;

}  // namespace

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
       },
       [](const Config& c) {
         // Each client's inputs (float) and labels (int64), kept once for training and copied once
         // into the test split; and the [dimension, classes] models drawn for each client.
         const int64_t dimension = c.get_int("data.dimension");
         const int64_t per_example = plus({times({dimension, 4}), 8});
         return plus({times({2, c.get_int("data.clients"), kSyntheticExamples, per_example}),
                      times({3, dimension, c.get_int("data.classes"), 4})});
       }},
      {"fmnist",
       "Fashion-MNIST (Xiao et al. 2017), 60k training images split into clients, the 10k test images",
       {string_key("path", "/usr/share/datasets/fashion-mnist", "directory of the IDX .gz files"),
        string_key("partition", "dirichlet", "how the training set is split into clients", {"iid", "dirichlet", "shards"}),
        int_key("clients", "600", "clients", 1),
        float_key("alpha", "0.5", "dirichlet concentration: smaller, fewer classes per client", 0, 1e9, true),
        int_key("shards_per_client", "2", "shards partition: label-sorted shards per client", 1),
        int_key("min_examples", "10", "every client gets at least this many examples", 1),
        int_key("seed", "0", "seed of the partition (independent of the training seed)", 0)},
       [](const Config& c) -> std::unique_ptr<FederatedDataset> {
         return load_fashion_mnist(c.get_string("data.path"), partition_options(c));
       },
       [](const Config& c) { return plus({kFashionMnistBytes, times({c.get_int("data.clients"), 64})}); }},
      {"tff_hdf5", "a TensorFlow Federated HDF5 file (fed_emnist schema: /examples/<client>/<feature>)",
       {string_key("path", "", "the training file"),
        string_key("test_path", "", "the test file with the same schema; empty: hold out test_fraction per client"),
        string_key("x", "pixels", "the input feature"), string_key("y", "label", "the label feature"),
        float_key("test_fraction", "0.1", "share of each client held out when there is no test file", 0, 0.9),
        int_key("classes", "0", "number of classes; 0: the largest label + 1", 0)},
       [](const Config& c) -> std::unique_ptr<FederatedDataset> {
         TffHdf5Options o;
         o.path = c.get_string("data.path");
         o.test_path = c.get_string("data.test_path");
         o.x = c.get_string("data.x");
         o.y = c.get_string("data.y");
         o.test_fraction = c.get_float("data.test_fraction");
         o.classes = c.get_int("data.classes");
         return load_tff_hdf5(o);
       },
       [](const Config& c) {
         // Pixels stored as bytes become floats.
         return times({4, plus({bytes_on_disk(c.get_string("data.path")), bytes_on_disk(c.get_string("data.test_path"))})});
       }},
      {"text", "next-token prediction on text: a folder (client per file), client<TAB>text lines, or TFF HDF5 strings",
       {string_key("path", "", "the corpus: a folder, a text file or a .h5 file"),
        string_key("feature", "snippets", "TFF HDF5: the string feature"),
        int_key("sequence_length", "64", "tokens per training sequence", 1),
        int_key("max_vocab", "256", "characters allowed before falling back to a byte vocabulary", 2),
        float_key("test_fraction", "0.1", "share of each client's sequences held out", 0, 0.9)},
       [](const Config& c) -> std::unique_ptr<FederatedDataset> {
         TextOptions o;
         o.path = c.get_string("data.path");
         o.feature = c.get_string("data.feature");
         o.sequence_length = c.get_int("data.sequence_length");
         o.max_vocab = c.get_int("data.max_vocab");
         o.test_fraction = c.get_float("data.test_fraction");
         return std::make_unique<TextDataset>(o);
       },
       [](const Config& c) {
         // A token per byte as int64, in the inputs and again in the shifted labels, plus the text.
         return times({17, bytes_on_disk(c.get_string("data.path"))});
       }},
      {"synthetic_tokens", "token streams from per-client Markov chains, for language-model benchmarks",
       {int_key("clients", "64", "clients", 1), int_key("sequences", "32", "sequences per client", 2),
        int_key("sequence_length", "64", "tokens per sequence", 1), int_key("vocab", "256", "vocabulary", 2),
        float_key("test_fraction", "0.1", "share of each client's sequences held out", 0, 0.9),
        int_key("seed", "0", "seed of the data", 0)},
       [](const Config& c) -> std::unique_ptr<FederatedDataset> {
         SyntheticTokensOptions o;
         o.clients = c.get_int("data.clients");
         o.sequences = c.get_int("data.sequences");
         o.sequence_length = c.get_int("data.sequence_length");
         o.vocab = c.get_int("data.vocab");
         o.test_fraction = c.get_float("data.test_fraction");
         o.seed = static_cast<uint64_t>(c.get_int("data.seed"));
         return make_synthetic_tokens(o);
       },
       [](const Config& c) {
         return times({16, c.get_int("data.clients"), c.get_int("data.sequences"),
                       plus({c.get_int("data.sequence_length"), 1})});
       }},
  };
  return registry;
}

const DatasetEntry& find_dataset(const std::string& name) {
  return find_entry(dataset_registry(), name, "data set");
}

}  // namespace fax
