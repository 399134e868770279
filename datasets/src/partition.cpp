#include <fax/datasets/partition.h>

#include <algorithm>

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

std::vector<at::Tensor> label_quantity(const at::Tensor& labels, int64_t num_classes, const PartitionOptions& o,
                                      at::Generator& g) {
  // Each client's labels: its own i mod classes first, then distinct others at random.
  std::vector<std::vector<int64_t>> held(o.clients);
  std::vector<int64_t> holders(num_classes, 0);
  for (int64_t i = 0; i < o.clients; ++i) {
    held[i].push_back(i % num_classes);
    while (static_cast<int64_t>(held[i].size()) < o.labels_per_client) {
      const int64_t label = at::randint(num_classes, {1}, g, at::kLong).item<int64_t>();
      if (std::find(held[i].begin(), held[i].end(), label) == held[i].end()) held[i].push_back(label);
    }
    for (int64_t label : held[i]) ++holders[label];
  }
  // Each label's examples, shuffled and cut evenly among its holders, in client order.
  std::vector<std::vector<at::Tensor>> pieces(num_classes);
  for (int64_t c = 0; c < num_classes; ++c) {
    if (holders[c] == 0) continue;
    const at::Tensor members = labels.eq(c).nonzero().flatten();
    pieces[c] = cut(members.index_select(0, at::randperm(members.numel(), g, at::kLong)), holders[c]);
  }
  std::vector<int64_t> next(num_classes, 0);
  std::vector<at::Tensor> out(o.clients);
  for (int64_t i = 0; i < o.clients; ++i) {
    std::vector<at::Tensor> mine;
    for (int64_t c = 0; c < num_classes; ++c)  // in label order, whatever order they were drawn in
      if (std::find(held[i].begin(), held[i].end(), c) != held[i].end()) mine.push_back(pieces[c][next[c]++]);
    out[i] = at::cat(mine);
  }
  return out;
}

std::vector<at::Tensor> label_dirichlet(const at::Tensor& labels, int64_t num_classes, const PartitionOptions& o,
                                       at::Generator& g) {
  const int64_t n = labels.numel();
  const int64_t floor = std::max<int64_t>(o.min_examples, 1);
  std::vector<at::Tensor> members;
  for (int64_t c = 0; c < num_classes; ++c) members.push_back(labels.eq(c).nonzero().flatten());
  // Redrawn until every client gets its floor, as the benchmark does; bounded.
  for (int attempt = 0; attempt < 1000; ++attempt) {
    std::vector<std::vector<at::Tensor>> mine(o.clients);
    std::vector<int64_t> sizes(o.clients, 0);
    for (int64_t c = 0; c < num_classes; ++c) {
      const at::Tensor shuffled = members[c].index_select(0, at::randperm(members[c].numel(), g, at::kLong));
      at::Tensor q = at::_sample_dirichlet(at::full({o.clients}, o.alpha, at::kDouble), g);
      // A client that already holds its even share of the whole set takes no more (the benchmark's rule).
      for (int64_t j = 0; j < o.clients; ++j)
        if (sizes[j] * o.clients >= n) q[j] = 0.0;
      if (q.sum().item<double>() <= 0) q.fill_(1.0);
      const at::Tensor ends = (q.cumsum(0) / q.sum() * static_cast<double>(shuffled.numel())).floor().to(at::kLong).contiguous();
      int64_t begin = 0;
      for (int64_t j = 0; j < o.clients; ++j) {
        const int64_t end = j + 1 == o.clients ? shuffled.numel() : std::max(begin, ends.data_ptr<int64_t>()[j]);
        if (end > begin) mine[j].push_back(shuffled.narrow(0, begin, end - begin));
        sizes[j] += end - begin;
        begin = end;
      }
    }
    if (*std::min_element(sizes.begin(), sizes.end()) < floor) continue;
    std::vector<at::Tensor> out;
    for (const auto& parts : mine) out.push_back(at::cat(parts));
    return out;
  }
  throw Error(fmt::format("label_dirichlet partition: 1000 draws from Dirichlet({}) per label over {} clients never "
                          "gave every client {} examples; raise data.alpha or lower data.min_examples",
                          o.alpha, o.clients, floor));
}

std::vector<at::Tensor> quantity_skew(const at::Tensor& labels, const PartitionOptions& o, at::Generator& g) {
  const int64_t n = labels.numel();
  const at::Tensor order = at::randperm(n, g, at::kLong);
  const int64_t floor = std::max<int64_t>(o.min_examples, 1);
  // Redrawn until every client gets its floor, as the benchmark does; bounded, for a beta so small
  // that no draw ever does.
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const at::Tensor q = at::_sample_dirichlet(at::full({o.clients}, o.beta, at::kDouble), g);
    const at::Tensor ends = (q.cumsum(0) / q.sum() * static_cast<double>(n)).floor().to(at::kLong).contiguous();
    std::vector<int64_t> bounds(ends.data_ptr<int64_t>(), ends.data_ptr<int64_t>() + o.clients);
    bounds.back() = n;
    std::vector<at::Tensor> out;
    int64_t begin = 0;
    bool enough = true;
    for (int64_t end : bounds) {
      enough = enough && end - begin >= floor;
      out.push_back(order.narrow(0, begin, std::max<int64_t>(end - begin, 0)));
      begin = std::max(begin, end);
    }
    if (enough) return out;
  }
  throw Error(fmt::format("quantity_skew partition: 1000 draws from Dirichlet({}) over {} clients never gave every "
                          "client {} of the {} examples; raise data.beta or lower data.min_examples",
                          o.beta, o.clients, floor, n));
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
  } else if (o.kind == "label_dirichlet") {
    FAX_CHECK(o.alpha > 0, "label_dirichlet partition needs alpha > 0 (got {})", o.alpha);
    out = label_dirichlet(labels, num_classes, o, g);
  } else if (o.kind == "label_quantity") {
    FAX_CHECK(o.labels_per_client >= 1 && o.labels_per_client <= num_classes,
              "label_quantity partition: data.labels_per_client must be 1 to the {} classes (got {})", num_classes,
              o.labels_per_client);
    out = label_quantity(labels, num_classes, o, g);
  } else if (o.kind == "quantity_skew") {
    FAX_CHECK(o.beta > 0, "quantity_skew partition needs beta > 0 (got {})", o.beta);
    out = quantity_skew(labels, o, g);
  } else {
    throw Error(fmt::format("unknown partition '{}' (iid, dirichlet, label_dirichlet, shards, label_quantity, "
                            "quantity_skew)", o.kind));
  }
  for (size_t c = 0; c < out.size(); ++c) {
    FAX_CHECK(out[c].numel() >= o.min_examples, "{} partition: client {} got {} examples, fewer than {}", o.kind, c,
              out[c].numel(), o.min_examples);
  }
  return out;
}

}  // namespace fax
