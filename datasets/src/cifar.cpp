// CIFAR-10 and CIFAR-100 in their binary version (https://www.cs.toronto.edu/~kriz/cifar.html):
// records of a label byte (CIFAR-100: coarse, then fine) and 3072 pixel bytes, 1024 per channel
// (R, G, B), rows of 32.

#include <fstream>
#include <filesystem>

#include <ATen/ATen.h>

#include <fax/base/error.h>
#include <fax/datasets/readers.h>

namespace fax {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kPixels = 3 * 32 * 32;

// The per-channel statistics of each training set (pixels scaled to [0, 1]).
struct ChannelStats {
  double mean[3];
  double std[3];
};
constexpr ChannelStats kCifar10Stats{{0.4914, 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616}};
constexpr ChannelStats kCifar100Stats{{0.5071, 0.4865, 0.4409}, {0.2673, 0.2564, 0.2762}};

// The records of `files` in `directory`: labels (the label byte at `label_byte` of `label_bytes`)
// and standardised images [n, 3, 32, 32].
Examples read_records(const fs::path& directory, const std::vector<std::string>& files, int64_t label_bytes,
                      int64_t label_byte, int64_t classes, const ChannelStats& stats) {
  const int64_t record = label_bytes + kPixels;
  std::vector<at::Tensor> parts;
  for (const std::string& name : files) {
    const fs::path path = directory / name;
    std::error_code ec;
    FAX_CHECK(fs::is_regular_file(path, ec), "{}: no such file", path.string());
    const int64_t size = static_cast<int64_t>(fs::file_size(path, ec));
    FAX_CHECK(!ec && size > 0 && size % record == 0,
              "{}: truncated or not a CIFAR binary file: {} bytes is not a whole number of {}-byte records",
              path.string(), size, record);
    at::Tensor bytes = at::empty({size / record, record}, at::kByte);
    std::ifstream in(path, std::ios::binary);
    in.read(reinterpret_cast<char*>(bytes.data_ptr<uint8_t>()), size);
    FAX_CHECK(in.gcount() == size, "{}: cannot read the whole file", path.string());
    const at::Tensor labels = bytes.select(1, label_byte).to(at::kLong);
    const int64_t largest = labels.max().item<int64_t>();
    FAX_CHECK(largest < classes, "{}: label {} is out of range (the data set has {} classes)", path.string(), largest,
              classes);
    parts.push_back(bytes);
  }
  const at::Tensor all = parts.size() == 1 ? parts[0] : at::cat(parts);
  const at::Tensor mean = at::tensor({stats.mean[0], stats.mean[1], stats.mean[2]}, at::kFloat).view({1, 3, 1, 1});
  const at::Tensor std = at::tensor({stats.std[0], stats.std[1], stats.std[2]}, at::kFloat).view({1, 3, 1, 1});
  const at::Tensor images = (all.narrow(1, label_bytes, kPixels).to(at::kFloat).div_(255.0).view({-1, 3, 32, 32}) - mean) / std;
  return {images.contiguous(), all.select(1, label_byte).to(at::kLong)};
}

// The folder holding the files: `path`, or the folder the archive unpacks to inside it.
fs::path data_folder(const std::string& path, const std::string& unpacked, const std::string& first_file) {
  FAX_CHECK(!path.empty(), "data.path: set it to the folder of the binary version ({}, from "
            "https://www.cs.toronto.edu/~kriz/cifar.html)", unpacked);
  std::error_code ec;
  FAX_CHECK(fs::is_directory(path, ec), "data.path: {}: no such folder", path);
  if (!fs::exists(fs::path(path) / first_file, ec) && fs::exists(fs::path(path) / unpacked / first_file, ec))
    return fs::path(path) / unpacked;
  return path;
}

// The standard CIFAR augmentation: 4 pixels of black (standardised) around, a horizontal flip.
std::optional<Augmentation> standard_augmentation(bool augment, const ChannelStats& stats) {
  if (!augment) return std::nullopt;
  Augmentation a;
  a.pad = 4;
  a.flip = true;
  // In float, as the images are standardised: a black pixel's exact value.
  for (int c = 0; c < 3; ++c) a.fill.push_back(-static_cast<float>(stats.mean[c]) / static_cast<float>(stats.std[c]));
  return a;
}

}  // namespace

std::unique_ptr<FederatedDataset> load_cifar10(const std::string& path, const PartitionOptions& partition, bool augment) {
  const fs::path dir = data_folder(path, "cifar-10-batches-bin", "data_batch_1.bin");
  Examples train = read_records(dir, {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                                      "data_batch_5.bin"}, 1, 0, 10, kCifar10Stats);
  Examples test = read_records(dir, {"test_batch.bin"}, 1, 0, 10, kCifar10Stats);
  return std::make_unique<PartitionedDataset>(std::move(train), std::move(test), 10, partition, "cifar10",
                                              standard_augmentation(augment, kCifar10Stats));
}

std::unique_ptr<FederatedDataset> load_cifar100(const std::string& path, bool coarse, const PartitionOptions& partition,
                                                bool augment) {
  const fs::path dir = data_folder(path, "cifar-100-binary", "train.bin");
  const int64_t classes = coarse ? 20 : 100;
  Examples train = read_records(dir, {"train.bin"}, 2, coarse ? 0 : 1, classes, kCifar100Stats);
  Examples test = read_records(dir, {"test.bin"}, 2, coarse ? 0 : 1, classes, kCifar100Stats);
  return std::make_unique<PartitionedDataset>(std::move(train), std::move(test), classes, partition,
                                              coarse ? "cifar100 (coarse labels)" : "cifar100",
                                              standard_augmentation(augment, kCifar100Stats));
}

}  // namespace fax
