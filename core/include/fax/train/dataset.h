#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <fax/nn/model.h>

namespace fax {

class FederatedDataset;
/// "client 7", or "client 7 (f0007_12)" when the data set names its clients: for messages.
std::string describe_client(const FederatedDataset& data, int64_t client);

/// Examples of one client (or of a test split): inputs with a leading example axis and labels.
struct Examples {
  at::Tensor x;  ///< [n, ...features]
  at::Tensor y;  ///< [n] int64 labels, or [n, ...] targets
  int64_t size() const { return x.defined() ? x.size(0) : 0; }
};

/// The random augmentation a data set asks for on its training images [C, H, W] (CIFAR's standard
/// one): a crop of the image padded by `pad` on every side with `fill` (per channel), and a
/// horizontal flip with probability 1/2. Local training draws both per example and step from the
/// client's random stream, so augmented runs stay bit-identical across executor counts; evaluation
/// sees the images as they are.
struct Augmentation {
  int64_t pad = 0;
  bool flip = false;
  std::vector<double> fill;  ///< per channel (the value of a black pixel after standardisation); empty: 0
};

/// A federated data set: a population of clients, each with its own training examples, and a
/// held-out test split. Implementations are immutable after construction and safe to read from
/// every executor thread at once.
class FederatedDataset {
 public:
  virtual ~FederatedDataset() = default;

  /// A short description for logs: "synthetic(alpha=1, beta=1): 100 clients".
  virtual std::string describe() const = 0;
  /// Clients in the population; client ids are 0 .. num_clients() - 1.
  virtual int64_t num_clients() const = 0;
  virtual int64_t num_examples(int64_t client) const = 0;
  virtual Examples client(int64_t client) const = 0;
  /// The name the source gives the client (a TFF client id, a file name), or "" when it has none.
  virtual std::string client_name(int64_t) const { return ""; }
  virtual const Examples& test() const = 0;
  /// Shape of one input (without the example axis) and number of classes.
  virtual std::vector<int64_t> input_shape() const = 0;
  virtual int64_t num_classes() const = 0;
  /// What local training does to the training images; none by default.
  virtual std::optional<Augmentation> augmentation() const { return std::nullopt; }
  /// The examples of every client in one pool, when the data set keeps them so; nullptr: none.
  /// Then client_rows(c) are client c's rows of it ([n] int64, n = num_examples(c)), and client(c)
  /// must equal those rows: local training gathers its batches straight from the pool, one copy
  /// instead of client()'s, a join and the gather.
  virtual const Examples* pool() const { return nullptr; }
  virtual at::Tensor client_rows(int64_t) const { return {}; }
};

/// What a model needs to know of `data`: its inputs' shape and type, its classes, its labels' rank.
inline ModelShape model_shape(const FederatedDataset& data) {
  const Examples& labelled = data.test().size() > 0 ? data.test() : data.client(0);
  return {data.input_shape(), data.num_classes(), labelled.x.scalar_type(), labelled.y.dim() - 1};
}

}  // namespace fax
