#include <fax/datasets/registry.h>

#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <limits>

#include <fax/base/registry.h>
#include <fax/base/settings.h>
#include <fax/datasets/readers.h>
#include <fax/datasets/synthetic.h>

namespace fax {

namespace {

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

// Fashion-MNIST's settings: where the files are and how the training set is split.
struct FashionMnistOptions {
  std::string path = "/usr/share/datasets/fashion-mnist";
  PartitionOptions partition{"dirichlet", 600, 0.5, 2, 10, 0};
};

// CIFAR's settings: where the binary files are, which labels (CIFAR-100), how the training set is
// split. No Debian package ships CIFAR: the path has no default.
constexpr int64_t kCifarBytes = int64_t{60000} * 3072 * 5;
struct CifarOptions {
  std::string path;
  std::string labels = "fine";
  bool augment = false;
  PartitionOptions partition{"dirichlet", 100, 0.5, 2, 10, 0};
};

// A registry entry whose settings, creation and estimate all go through one options struct.
template <class Options>
DatasetEntry entry(std::string name, std::string description, const Settings<Options>& settings,
                   std::function<std::unique_ptr<FederatedDataset>(const Options&)> create,
                   std::function<int64_t(const Options&)> estimate) {
  return {{std::move(name), std::move(description), settings.keys(),
           [settings, create](const Config& c) { return create(settings.read(c, "data")); }},
          [settings, estimate](const Config& c) { return estimate(settings.read(c, "data")); }};
}

Settings<SyntheticOptions> synthetic_settings() {
  using O = SyntheticOptions;
  return Settings<O>()
      .add("clients", &O::clients, "clients in the population", at_least(1))
      .add("alpha", &O::alpha, "spread of the clients' models (0: one shared model mean)", at_least(0))
      .add("beta", &O::beta, "spread of the clients' input distributions", at_least(0))
      .add("dimension", &O::dimension, "input features", at_least(1))
      .add("classes", &O::classes, "classes", at_least(2))
      .add("iid", &O::iid, "one global model and input distribution for every client")
      .add("test_fraction", &O::test_fraction, "share of each client's examples held out for the test split", in(0, 0.9))
      .add("seed", &O::seed, "seed of the data (independent of the training seed)");
}

Settings<PartitionOptions> partition_settings() {
  using O = PartitionOptions;
  return Settings<O>()
      .add("partition", &O::kind, "how the training set is split into clients",
           one_of({"iid", "dirichlet", "label_dirichlet", "shards", "label_quantity", "quantity_skew"}))
      .add("clients", &O::clients, "clients", at_least(1))
      .add("alpha", &O::alpha, "dirichlet and label_dirichlet concentration: smaller, fewer classes per client",
           above(0, 1e9))
      .add("shards_per_client", &O::shards_per_client, "shards partition: label-sorted shards per client", at_least(1))
      .add("labels_per_client", &O::labels_per_client, "label_quantity partition: labels per client (#C = k)", at_least(1))
      .add("beta", &O::beta, "quantity_skew partition: Dirichlet concentration of client sizes", above(0, 1e9))
      .add("min_examples", &O::min_examples, "every client gets at least this many examples", at_least(1))
      .add("seed", &O::seed, "seed of the partition (independent of the training seed)");
}

Settings<CifarOptions> cifar_settings(bool labels) {
  using O = CifarOptions;
  Settings<O> s = Settings<O>().add("path", &O::path, "folder of the binary version (or the folder it unpacks in)");
  if (labels) s.add("labels", &O::labels, "fine (100 classes) or coarse (20)", one_of({"fine", "coarse"}));
  s.add("augment", &O::augment, "clients train on random crops (padding 4) and horizontal flips of their images");
  return s.include(&O::partition, partition_settings());
}

Settings<FashionMnistOptions> fashion_mnist_settings() {
  using O = FashionMnistOptions;
  return Settings<O>()
      .add("path", &O::path, "directory of the IDX .gz files")
      .include(&O::partition, partition_settings());
}

Settings<TffHdf5Options> tff_hdf5_settings() {
  using O = TffHdf5Options;
  return Settings<O>()
      .add("path", &O::path, "the training file")
      .add("test_path", &O::test_path, "the test file with the same schema; empty: hold out test_fraction per client")
      .add("x", &O::x, "the input feature")
      .add("y", &O::y, "the label feature")
      .add("test_fraction", &O::test_fraction, "share of each client held out when there is no test file", in(0, 0.9))
      .add("classes", &O::classes, "number of classes; 0: the largest label + 1", at_least(0));
}

Settings<LeafOptions> leaf_settings() {
  using O = LeafOptions;
  return Settings<O>()
      .add("path", &O::path, "LEAF's data folder, holding train/ and test/")
      .add("classes", &O::classes, "number of classes; 0: the largest label + 1", at_least(0))
      .add("vocab", &O::vocab, "Sent140: most frequent training words kept (others share one id)", at_least(1))
      .add("sequence_length", &O::sequence_length, "Sent140: words per tweet (longer ones are cut)", at_least(1));
}

Settings<TextOptions> text_settings() {
  using O = TextOptions;
  return Settings<O>()
      .add("path", &O::path, "the corpus: a folder, a text file or a .h5 file")
      .add("feature", &O::feature, "TFF HDF5: the string feature")
      .add("sequence_length", &O::sequence_length, "tokens per training sequence", at_least(1))
      .add("max_vocab", &O::max_vocab, "characters allowed before falling back to a byte vocabulary", at_least(2))
      .add("test_fraction", &O::test_fraction, "share of each client's sequences held out", in(0, 0.9));
}

Settings<SyntheticTokensOptions> synthetic_tokens_settings() {
  using O = SyntheticTokensOptions;
  return Settings<O>()
      .add("clients", &O::clients, "clients", at_least(1))
      .add("sequences", &O::sequences, "sequences per client", at_least(2))
      .add("sequence_length", &O::sequence_length, "tokens per sequence", at_least(1))
      .add("vocab", &O::vocab, "vocabulary", at_least(2))
      .add("test_fraction", &O::test_fraction, "share of each client's sequences held out", in(0, 0.9))
      .add("seed", &O::seed, "seed of the data");
}

}  // namespace

const std::vector<DatasetEntry>& dataset_registry() {
  static const std::vector<DatasetEntry> registry = {
      entry<SyntheticOptions>(
          "synthetic",
          "synthetic(alpha, beta) of Li et al. 2020 (FedProx / LEAF): heterogeneous softmax-regression clients",
          synthetic_settings(), [](const SyntheticOptions& o) { return std::make_unique<SyntheticDataset>(o); },
          [](const SyntheticOptions& o) {
            // Each client's inputs (float) and labels (int64), kept once for training and copied
            // once into the test split; and the [dimension, classes] models drawn for each client.
            const int64_t per_example = plus({times({o.dimension, 4}), 8});
            return plus({times({2, o.clients, kSyntheticExamples, per_example}), times({3, o.dimension, o.classes, 4})});
          }),
      entry<FashionMnistOptions>(
          "fmnist", "Fashion-MNIST (Xiao et al. 2017), 60k training images split into clients, the 10k test images",
          fashion_mnist_settings(),
          [](const FashionMnistOptions& o) { return load_fashion_mnist(o.path, o.partition); },
          [](const FashionMnistOptions& o) { return plus({kFashionMnistBytes, times({o.partition.clients, 64})}); }),
      entry<CifarOptions>(
          "cifar10", "CIFAR-10 (Krizhevsky 2009), binary version: 50k training images split into clients, 10k test",
          cifar_settings(false), [](const CifarOptions& o) { return load_cifar10(o.path, o.partition, o.augment); },
          [](const CifarOptions& o) { return plus({kCifarBytes, times({o.partition.clients, 64})}); }),
      entry<CifarOptions>(
          "cifar100", "CIFAR-100 (Krizhevsky 2009), binary version: fine or coarse labels, split into clients",
          cifar_settings(true),
          [](const CifarOptions& o) { return load_cifar100(o.path, o.labels == "coarse", o.partition, o.augment); },
          [](const CifarOptions& o) { return plus({kCifarBytes, times({o.partition.clients, 64})}); }),
      entry<LeafOptions>(
          "leaf", "LEAF's JSON files (FEMNIST, Shakespeare, Sent140, Synthetic): each user a client",
          leaf_settings(), [](const LeafOptions& o) { return load_leaf(o); }, estimate_leaf_bytes),
      entry<TffHdf5Options>(
          "tff_hdf5", "a TensorFlow Federated HDF5 file (fed_emnist schema: /examples/<client>/<feature>)",
          tff_hdf5_settings(), [](const TffHdf5Options& o) { return load_tff_hdf5(o); },
          [](const TffHdf5Options& o) {
            // Pixels stored as bytes become floats.
            return times({4, plus({bytes_on_disk(o.path), bytes_on_disk(o.test_path)})});
          }),
      entry<TextOptions>(
          "text", "next-token prediction on text: a folder (client per file), client<TAB>text lines, or TFF HDF5 strings",
          text_settings(), [](const TextOptions& o) { return std::make_unique<TextDataset>(o); },
          [](const TextOptions& o) {
            // A token per byte as int64, in the inputs and again in the shifted labels, plus the text.
            return times({17, bytes_on_disk(o.path)});
          }),
      entry<SyntheticTokensOptions>(
          "synthetic_tokens", "token streams from per-client Markov chains, for language-model benchmarks",
          synthetic_tokens_settings(), [](const SyntheticTokensOptions& o) { return make_synthetic_tokens(o); },
          [](const SyntheticTokensOptions& o) {
            return times({16, o.clients, o.sequences, plus({o.sequence_length, 1})});
          }),
  };
  return registry;
}

const DatasetEntry& find_dataset(const std::string& name) {
  return find_entry(dataset_registry(), name, "data set");
}

}  // namespace fax
