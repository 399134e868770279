#include <fax/datasets/synthetic.h>

#include <ATen/ATen.h>

#include <fax/base/error.h>
#include <fax/base/rng.h>

namespace fax {
namespace {
// Data streams live in a round of their own so they never coincide with a training round's.
constexpr int64_t kDataRound = -1000;
}  // namespace

SyntheticDataset::SyntheticDataset(const SyntheticOptions& o) : options_(o) {
  FAX_CHECK(o.clients > 0, "data.clients must be positive (got {})", o.clients);
  FAX_CHECK(o.dimension > 0 && o.classes > 1, "synthetic data needs dimension > 0 and classes > 1");
  FAX_CHECK(o.test_fraction >= 0 && o.test_fraction < 1, "data.test_fraction must be in [0, 1) (got {})",
            o.test_fraction);
  const at::Tensor sigma_sqrt = at::arange(1, o.dimension + 1, at::kDouble).pow(-1.2).sqrt().to(at::kFloat);
  at::Generator shared = server_generator(o.seed, kDataRound);
  const at::Tensor w_global = at::randn({o.dimension, o.classes}, shared);
  const at::Tensor b_global = at::randn({o.classes}, shared);

  std::vector<at::Tensor> test_x, test_y;
  for (int64_t k = 0; k < o.clients; ++k) {
    at::Generator g = client_generator(o.seed, kDataRound, k);
    const double u = o.alpha * at::randn({1}, g).item<double>();
    const double b_k = o.beta * at::randn({1}, g).item<double>();
    const int64_t n = static_cast<int64_t>(std::exp(4.0 + 2.0 * at::randn({1}, g, at::kDouble).item<double>())) + 50;
    const at::Tensor w = o.iid ? w_global : at::randn({o.dimension, o.classes}, g) + u;
    const at::Tensor b = o.iid ? b_global : at::randn({o.classes}, g) + u;
    const at::Tensor v = o.iid ? at::full({o.dimension}, b_k) : at::randn({o.dimension}, g) + b_k;
    const at::Tensor x = v + sigma_sqrt * at::randn({n, o.dimension}, g);
    const at::Tensor y = at::addmm(b, x, w).argmax(1);
    const int64_t n_train = static_cast<int64_t>((1.0 - o.test_fraction) * static_cast<double>(n));
    train_.push_back({x.narrow(0, 0, n_train).contiguous(), y.narrow(0, 0, n_train).contiguous()});
    test_x.push_back(x.narrow(0, n_train, n - n_train));
    test_y.push_back(y.narrow(0, n_train, n - n_train));
  }
  test_ = {at::cat(test_x), at::cat(test_y)};
}

std::string SyntheticDataset::describe() const {
  return fmt::format("synthetic(alpha={}, beta={}{}): {} clients, {} features, {} classes", options_.alpha,
                     options_.beta, options_.iid ? ", iid" : "", options_.clients, options_.dimension, options_.classes);
}

int64_t SyntheticDataset::num_examples(int64_t client) const { return train_.at(client).size(); }

Examples SyntheticDataset::client(int64_t client) const {
  FAX_CHECK(client >= 0 && client < options_.clients, "client {} is not in the population (0..{})", client,
            options_.clients - 1);
  return train_[client];
}

}  // namespace fax
