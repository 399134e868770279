#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fax/datasets/partition.h>
#include <fax/train/dataset.h>

/// The federated data sets fax reads or builds. Each constructor throws fax::Error naming the file
/// or setting at fault.
namespace fax {

/// A centralised data set split into clients by a partitioner; a client's examples are gathered on
/// demand from the shared arrays.
class PartitionedDataset final : public FederatedDataset {
 public:
  PartitionedDataset(Examples train, Examples test, int64_t num_classes, const PartitionOptions& partition,
                     std::string name, std::optional<Augmentation> augmentation = std::nullopt);
  std::string describe() const override { return description_; }
  int64_t num_clients() const override { return static_cast<int64_t>(clients_.size()); }
  int64_t num_examples(int64_t client) const override;
  Examples client(int64_t client) const override;
  const Examples& test() const override { return test_; }
  std::vector<int64_t> input_shape() const override;
  int64_t num_classes() const override { return num_classes_; }
  std::optional<Augmentation> augmentation() const override { return augmentation_; }
  const Examples* pool() const override { return &train_; }
  at::Tensor client_rows(int64_t client) const override;

 private:
  Examples train_;
  Examples test_;
  int64_t num_classes_;
  std::optional<Augmentation> augmentation_;
  std::vector<at::Tensor> clients_;  // sorted example indices
  std::string description_;
};

/// Fashion-MNIST (Xiao et al. 2017) from the IDX .gz files in `directory` (Debian's
/// dataset-fashion-mnist: /usr/share/datasets/fashion-mnist): 60k training images split into
/// clients by `partition`, the 10k test images as the test split. Pixels scaled to [0, 1] and
/// standardised (mean 0.2860, std 0.3530); inputs [1, 28, 28].
std::unique_ptr<FederatedDataset> load_fashion_mnist(const std::string& directory, const PartitionOptions& partition);

/// CIFAR-10 in its binary version: data_batch_1..5.bin (50k training images, split into clients by
/// `partition`) and test_batch.bin (10k), in `path` or in its cifar-10-batches-bin folder. Pixels
/// scaled to [0, 1] and standardised per channel (mean 0.4914, 0.4822, 0.4465; std 0.2470, 0.2435,
/// 0.2616: the training set's); inputs [3, 32, 32]. `augment`: local training crops each image from
/// it padded by 4 black pixels and flips it horizontally with probability 1/2 (fax::Augmentation).
/// Throws fax::Error naming the file when one is missing, truncated (not whole records) or has a
/// label out of range.
std::unique_ptr<FederatedDataset> load_cifar10(const std::string& path, const PartitionOptions& partition,
                                               bool augment = false);

/// CIFAR-100 in its binary version: train.bin and test.bin, in `path` or in its cifar-100-binary
/// folder; the 20 coarse or the 100 fine labels. Standardised with mean 0.5071, 0.4865, 0.4409 and
/// std 0.2673, 0.2564, 0.2762.
std::unique_ptr<FederatedDataset> load_cifar100(const std::string& path, bool coarse, const PartitionOptions& partition,
                                                bool augment = false);

struct LeafOptions {
  std::string path;              ///< LEAF's data folder: train/ and test/ of .json files
  int64_t classes = 0;           ///< 0: the largest label + 1
  int64_t vocab = 10000;         ///< Sent140: the most frequent training words kept
  int64_t sequence_length = 25;  ///< Sent140: words per tweet (LEAF's 25)
};

/// LEAF's JSON files (FEMNIST, Shakespeare, Sent140, Synthetic): each user of train/ is a client,
/// the users of test/ together are the test split. The task follows from the rows: lists of
/// numbers are features ([1, 28, 28] when there are 784: FEMNIST's images); strings are
/// Shakespeare's characters (LEAF's 80, id 80 for any other), trained as next-character prediction
/// at every position (labels: the row shifted by one, then y); lists of strings are Sent140 tweets
/// (the text at index 4, split into words as LEAF does). CelebA (image file names) and Reddit
/// (nested token lists) are refused. The files are parsed as a stream: the JSON text is never held.
std::unique_ptr<FederatedDataset> load_leaf(const LeafOptions& options);
/// About how many bytes load_leaf(options) holds, from the sizes of the files it would read and the
/// first row of the first training file, without parsing them; 0 when the folder is not LEAF's
/// (load_leaf then says why).
int64_t estimate_leaf_bytes(const LeafOptions& options);

struct TffHdf5Options {
  std::string path;       ///< a TFF-style file: /examples/<client id>/<feature>
  std::string test_path;  ///< the matching test file; empty: hold out test_fraction of each client
  std::string x = "pixels";
  std::string y = "label";
  double test_fraction = 0.1;
  int64_t classes = 0;  ///< 0: the largest label + 1
};

/// Numeric features of a TensorFlow Federated HDF5 file (fed_emnist's schema): one client per group
/// under /examples, in name order; inputs float32 (a rank-2 example gains a channel axis), labels
/// int64.
std::unique_ptr<FederatedDataset> load_tff_hdf5(const TffHdf5Options& options);

struct TextOptions {
  /// A folder (each regular file is a client, in name order), a text file of "client<TAB>text"
  /// lines (a client per key, lines joined), or a TFF HDF5 file whose /examples/<client>/<feature>
  /// holds strings (Shakespeare's "snippets").
  std::string path;
  std::string feature = "snippets";
  int64_t sequence_length = 64;
  /// Character vocabulary when the corpus has at most this many distinct characters, else bytes.
  int64_t max_vocab = 256;
  double test_fraction = 0.1;
};

/// Next-token prediction on text: each client's text becomes non-overlapping windows of
/// sequence_length + 1 tokens (inputs: the first sequence_length, labels: the last). The last
/// test_fraction of each client's windows form the test split. Clients with no full window are
/// left out.
class TextDataset final : public FederatedDataset {
 public:
  explicit TextDataset(const TextOptions& options);
  std::string describe() const override;
  int64_t num_clients() const override { return static_cast<int64_t>(train_.size()); }
  int64_t num_examples(int64_t client) const override;
  Examples client(int64_t client) const override;
  std::string client_name(int64_t client) const override { return names_.at(client); }
  const Examples& test() const override { return test_; }
  std::vector<int64_t> input_shape() const override { return {options_.sequence_length}; }
  int64_t num_classes() const override { return vocab_size_; }

  bool byte_level() const { return byte_level_; }
  const std::vector<std::string>& client_names() const { return names_; }
  /// The token ids of `text` under this data set's vocabulary (unknown characters: id 0).
  std::vector<int64_t> encode(const std::string& text) const;

 private:
  TextOptions options_;
  bool byte_level_ = false;
  std::vector<uint32_t> alphabet_;  // code points, sorted; id = index
  int64_t vocab_size_ = 0;
  std::vector<std::string> names_;
  std::vector<Examples> train_;
  Examples test_;
};

struct SyntheticTokensOptions {
  int64_t clients = 64;
  int64_t sequences = 32;  ///< per client (of which test_fraction go to the test split)
  int64_t sequence_length = 64;
  int64_t vocab = 256;
  double test_fraction = 0.1;
  uint64_t seed = 0;
};

/// Token streams for language-model benchmarks: each client samples from its own first-order
/// Markov chain, a shared random transition table perturbed per client, so the streams are
/// learnable and heterogeneous.
std::unique_ptr<FederatedDataset> make_synthetic_tokens(const SyntheticTokensOptions& options);

}  // namespace fax
