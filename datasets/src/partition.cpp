#include <fax/datasets/partition.h>

#include <ATen/ATen.h>

#include <fax/base/error.h>
#include <fax/base/rng.h>

namespace fax {
namespace {

constexpr int64_t kPartitionRound = -2000;  // a stream domain of its own

// Cuts `order` into `parts` contiguous near-equal pieces.
std::vector<at::Tensor> cut(const at::Tensor& order, int64_t parts) {
  std::vector<at::Tensor> out;
  const int64_t n = order.numel();
  for (int64_t i = 0; i < parts; ++i) {
    const int64_t begin = n * i / parts, end = n * (i + 1) / parts;
    out.push_back(order.narrow(0, begin, end - begin));
  }
  return out;
}

std::vector<at::Tensor> iid(const at::Tensor& labels, const PartitionOptions& o, at::Generator& g) {
  return cut(at::randperm(labels.numel(), g, at::kLong), o.clients);
}

std::vector<at::Tensor> shards(const at::Tensor& labels, const PartitionOptions& o, at::Generator& g) {
  // Shuffle first so ties in the (stable) sort by label are in random order.
  const at::Tensor shuffled = at::randperm(labels.numel(), g, at::kLong);
  const at::Tensor by_label = shuffled.index_select(0, std::get<1>(labels.index_select(0, shuffled).sort(/*stable=*/c10::optional<bool>(true), 0)));
  const auto pieces = cut(by_label, o.clients * o.shards_per_client);
  const at::Tensor assignment = at::randperm(o.clients * o.shards_per_client, g, at::kLong);
  const auto* a = assignment.data_ptr<int64_t>();
  std::vector<at::Tensor> out;
  for (int64_t c = 0; c < o.clients; ++c) {
    std::vector<at::Tensor> mine;
    for (int64_t s = 0; s < o.shards_per_client; ++s) mine.push_back(pieces[a[c * o.shards_per_client + s]]);
    out.push_back(at::cat(mine));
  }
  return out;
}

// Hsu et al. 2019: client i draws class proportions q_i ~ Dirichlet(alpha) and receives an equal
// share of the examples, drawn class by class in those proportions without replacement. When a
// class runs out, the client's remaining slots are drawn from the classes still available, in its
// own proportions.
std::vector<at::Tensor> dirichlet(const at::Tensor& labels, int64_t num_classes, const PartitionOptions& o,
                                  at::Generator& g) {
  std::vector<at::Tensor> pools;
  std::vector<int64_t> taken(num_classes, 0);
  for (int64_t c = 0; c < num_classes; ++c) {
    const at::Tensor members = labels.eq(c).nonzero().flatten();
    pools.push_back(members.index_select(0, at::randperm(members.numel(), g, at::kLong)));
  }
  const int64_t share = labels.numel() / o.clients;
  std::vector<at::Tensor> out;
  for (int64_t client = 0; client < o.clients; ++client) {
    at::Tensor q = at::_sample_dirichlet(at::full({num_classes}, o.alpha, at::kDouble), g);
    std::vector<at::Tensor> mine;
    int64_t needed = share;
    while (needed > 0) {
      for (int64_t c = 0; c < num_classes; ++c)
        if (taken[c] == pools[c].numel()) q[c] = 0.0;
      // A draw that puts all mass on exhausted classes (or underflows) falls back to uniform.
      if (q.sum().item<double>() <= 0) {
        for (int64_t c = 0; c < num_classes; ++c) q[c] = taken[c] < pools[c].numel() ? 1.0 : 0.0;
      }
      const at::Tensor counts = at::bincount(at::multinomial(q, needed, true, g), {}, num_classes);
      for (int64_t c = 0; c < num_classes; ++c) {
        const int64_t take = std::min(counts[c].item<int64_t>(), pools[c].numel() - taken[c]);
        if (take == 0) continue;
        mine.push_back(pools[c].narrow(0, taken[c], take));
        taken[c] += take;
        needed -= take;
      }
    }
    out.push_back(at::cat(mine));
  }
  return out;
}

}  // namespace

std::vector<at::Tensor> partition(const at::Tensor& labels, int64_t num_classes, const PartitionOptions& o) {
  FAX_CHECK(o.clients > 0, "data.clients must be positive (got {})", o.clients);
  FAX_CHECK(o.clients * std::max<int64_t>(o.min_examples, 1) <= labels.numel(),
            "cannot give {} clients at least {} examples each from {} examples", o.clients,
            std::max<int64_t>(o.min_examples, 1), labels.numel());
  at::Generator g = server_generator(o.seed, kPartitionRound);
  std::vector<at::Tensor> out;
  if (o.kind == "iid") {
    out = iid(labels, o, g);
  } else if (o.kind == "shards") {
    FAX_CHECK(o.shards_per_client > 0 && o.clients * o.shards_per_client <= labels.numel(),
              "shards partition: {} clients x {} shards exceeds {} examples", o.clients, o.shards_per_client,
              labels.numel());
    out = shards(labels, o, g);
  } else if (o.kind == "dirichlet") {
    FAX_CHECK(o.alpha > 0, "dirichlet partition needs alpha > 0 (got {})", o.alpha);
    out = dirichlet(labels, num_classes, o, g);
  } else {
    throw Error(fmt::format("unknown partition '{}' (iid, dirichlet, shards)", o.kind));
  }
  for (size_t c = 0; c < out.size(); ++c) {
    FAX_CHECK(out[c].numel() >= o.min_examples, "{} partition: client {} got {} examples, fewer than {}", o.kind, c,
              out[c].numel(), o.min_examples);
  }
  return out;
}

}  // namespace fax
