#include <fax/datasets/readers.h>

#include <ATen/ATen.h>

#include <fax/base/error.h>
#include <fax/datasets/in_memory.h>
#include <fax/io/hdf5.h>

namespace fax {
namespace {

// One client's examples from a TFF file: /examples/<id>/<x> and /<y>.
Examples read_client(const h5::File& file, const std::string& id, const TffHdf5Options& o) {
  const std::string group = "/examples/" + id;
  for (const auto& feature : {o.x, o.y}) {
    FAX_CHECK(file.exists(group + "/" + feature), "{}: client '{}' has no feature '{}' (members: {})", file.path(), id,
              feature, fmt::join(file.members(group), ", "));
  }
  at::Tensor x = file.read(group + "/" + o.x).to(at::kFloat);
  const at::Tensor y = file.read(group + "/" + o.y);
  FAX_CHECK(!y.is_floating_point(), "{}: {}/{} holds floats; labels must be integers", file.path(), group, o.y);
  FAX_CHECK(x.dim() >= 1 && y.dim() == 1 && x.size(0) == y.size(0) && x.size(0) > 0,
            "{}: client '{}' has {} inputs and {} labels (want as many, at least one, labels one per example)",
            file.path(), id, x.dim() ? x.size(0) : 0, y.dim() ? y.size(0) : 0);
  FAX_CHECK(y.min().item<int64_t>() >= 0, "{}: client '{}' has a negative label", file.path(), id);
  if (x.dim() == 3) x = x.unsqueeze(1);  // images without a channel axis
  return {x.contiguous(), y.to(at::kLong)};
}

// Clients are stacked into one model's batches: every input must have the first client's shape.
void check_same_input_shape(const std::string& path, const std::vector<std::pair<std::string, Examples>>& clients,
                            const std::vector<int64_t>& want) {
  for (const auto& [id, examples] : clients) {
    const auto got = examples.x.sizes().slice(1).vec();
    FAX_CHECK(got == want, "{}: client '{}' has inputs of shape [{}], the first training client [{}]", path, id,
              fmt::join(got, ", "), fmt::join(want, ", "));
  }
}

std::vector<std::pair<std::string, Examples>> read_file(const std::string& path, const TffHdf5Options& o) {
  const h5::File file(path);
  FAX_CHECK(file.exists("/examples"), "{}: not a TFF federated file (no /examples group)", path);
  std::vector<std::pair<std::string, Examples>> clients;
  for (const auto& id : file.members("/examples")) clients.emplace_back(id, read_client(file, id, o));
  FAX_CHECK(!clients.empty(), "{}: /examples holds no clients", path);
  return clients;
}

}  // namespace

std::unique_ptr<FederatedDataset> load_tff_hdf5(const TffHdf5Options& o) {
  FAX_CHECK(!o.path.empty(), "data.path: the TFF HDF5 file to read is not set");
  auto train = read_file(o.path, o);
  const std::vector<int64_t> input_shape = train.front().second.x.sizes().slice(1).vec();
  check_same_input_shape(o.path, train, input_shape);
  std::vector<Examples> clients;
  std::vector<std::string> names;
  std::vector<at::Tensor> test_x, test_y;
  if (!o.test_path.empty()) {
    const auto test_clients = read_file(o.test_path, o);
    check_same_input_shape(o.test_path, test_clients, input_shape);
    for (const auto& [id, examples] : test_clients) {
      test_x.push_back(examples.x);
      test_y.push_back(examples.y);
    }
  }
  for (auto& [id, examples] : train) {
    if (o.test_path.empty()) {
      const int64_t n = examples.size();
      const int64_t held = n > 1 ? std::max<int64_t>(1, static_cast<int64_t>(o.test_fraction * static_cast<double>(n))) : 0;
      test_x.push_back(examples.x.narrow(0, n - held, held));
      test_y.push_back(examples.y.narrow(0, n - held, held));
      examples = {examples.x.narrow(0, 0, n - held), examples.y.narrow(0, 0, n - held)};
    }
    clients.push_back(examples);
    names.push_back(id);
  }
  Examples test{at::cat(test_x), at::cat(test_y)};
  int64_t classes = o.classes;
  if (classes == 0) {
    int64_t largest = test.y.numel() ? test.y.max().item<int64_t>() : 0;
    for (const auto& c : clients) largest = std::max(largest, c.y.max().item<int64_t>());
    classes = largest + 1;
  }
  return std::make_unique<InMemoryDataset>(std::move(clients), std::move(test), classes,
                                           fmt::format("tff_hdf5({}, x={}, y={})", o.path, o.x, o.y), std::move(names));
}

}  // namespace fax
