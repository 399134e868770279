#include <fax/datasets/readers.h>

#include <filesystem>

#include <ATen/ATen.h>

#include <fax/base/error.h>
#include <fax/datasets/idx.h>

namespace fax {

PartitionedDataset::PartitionedDataset(Examples train, Examples test, int64_t num_classes,
                                       const PartitionOptions& partition_options, std::string name,
                                       std::optional<Augmentation> augmentation)
    : train_(std::move(train)), test_(std::move(test)), num_classes_(num_classes), augmentation_(std::move(augmentation)) {
  for (const at::Tensor& indices : partition(train_.y, num_classes, partition_options)) {
    clients_.push_back(std::get<0>(indices.sort()));
  }
  std::string how = partition_options.kind;
  if (how == "dirichlet" || how == "label_dirichlet") how += fmt::format("(alpha={})", partition_options.alpha);
  if (how == "label_quantity") how += fmt::format("(k={})", partition_options.labels_per_client);
  if (how == "quantity_skew") how += fmt::format("(beta={})", partition_options.beta);
  if (how == "shards") how += fmt::format("({} per client)", partition_options.shards_per_client);
  description_ = fmt::format("{}: {} clients ({} split), {} training and {} test examples", name, clients_.size(), how,
                             train_.size(), test_.size());
  if (augmentation_) {
    description_ += fmt::format(", augmented (crop with padding {}{})", augmentation_->pad,
                                augmentation_->flip ? ", horizontal flip" : "");
  }
}

int64_t PartitionedDataset::num_examples(int64_t client) const { return clients_.at(client).numel(); }

at::Tensor PartitionedDataset::client_rows(int64_t client) const {
  FAX_CHECK(client >= 0 && client < num_clients(), "client {} is not in the population (0..{})", client,
            num_clients() - 1);
  return clients_[client];
}

Examples PartitionedDataset::client(int64_t client) const {
  const at::Tensor& rows = client_rows(client);
  return {train_.x.index_select(0, rows), train_.y.index_select(0, rows)};
}

std::vector<int64_t> PartitionedDataset::input_shape() const {
  return {train_.x.sizes().begin() + 1, train_.x.sizes().end()};
}

namespace {

// The IDX file `stem` in `directory`, compressed or not.
std::string idx_file(const std::string& directory, const std::string& stem) {
  const std::filesystem::path dir(directory);
  FAX_CHECK(std::filesystem::is_directory(dir), "{}: no such directory (data.path; install the Debian package "
            "dataset-fashion-mnist or point data.path at the IDX files)", directory);
  for (const char* suffix : {".gz", ""}) {
    const auto p = dir / (stem + suffix);
    if (std::filesystem::exists(p)) return p.string();
  }
  throw Error(fmt::format("{}: no {}.gz (or {}) in the Fashion-MNIST directory", (dir / stem).string(), stem, stem));
}

Examples load_split(const std::string& directory, const std::string& prefix) {
  const std::string images_path = idx_file(directory, prefix + "-images-idx3-ubyte");
  const std::string labels_path = idx_file(directory, prefix + "-labels-idx1-ubyte");
  const at::Tensor images = read_idx(images_path);
  const at::Tensor labels = read_idx(labels_path);
  FAX_CHECK(images.dim() == 3 && images.size(1) == 28 && images.size(2) == 28, "{}: expected 28x28 images, got [{}]",
            images_path, fmt::join(images.sizes(), ", "));
  FAX_CHECK(labels.dim() == 1 && labels.size(0) == images.size(0), "{}: {} labels for {} images", labels_path,
            labels.numel(), images.size(0));
  FAX_CHECK(labels.max().item<int64_t>() < 10, "{}: a label is outside 0..9", labels_path);
  const at::Tensor x = ((images.to(at::kFloat) / 255.0 - 0.2860) / 0.3530).unsqueeze(1).contiguous();
  return {x, labels.to(at::kLong)};
}

}  // namespace

std::unique_ptr<FederatedDataset> load_fashion_mnist(const std::string& directory, const PartitionOptions& partition) {
  Examples train = load_split(directory, "train");
  Examples test = load_split(directory, "t10k");
  return std::make_unique<PartitionedDataset>(std::move(train), std::move(test), 10, partition, "fashion-mnist");
}

}  // namespace fax
