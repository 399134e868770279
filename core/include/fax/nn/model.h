#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <fax/base/config.h>
#include <fax/base/registry.h>
#include <fax/base/tensor_tree.h>

namespace fax {

/// The leaves of a model's input layer z = f(x) W + b: its first dense layer.
struct InputLayer {
  std::string weight;  ///< [features, outputs], or [k, features, outputs] batched over clients
  std::string bias;    ///< [outputs], or [k, outputs]
  /// f has parameters of its own (Model::input_features: the CNN's convolutions); without, f
  /// flattens the input and local SGD can form a block of steps' products at once.
  bool learned_features = false;
};

/// A model as a pure function of a parameter tree. Every model runs batched over clients: when
/// the leaves of `params` have a leading clients axis of size k, inputs have shape [k, batch, ...]
/// and outputs [k, batch, ...]; without it, [batch, ...] -> [batch, ...].
class Model {
 public:
  virtual ~Model() = default;
  virtual std::string describe() const = 0;
  /// Fresh parameters (no clients axis) drawn from `generator`.
  virtual TensorTree init(at::Generator generator) const = 0;
  virtual at::Tensor forward(const TensorTree& params, const at::Tensor& x) const = 0;
  /// The forward pass for evaluation (a module's eval mode: BatchNorm reads its running statistics
  /// and changes nothing); the training forward pass unless the model differs.
  virtual at::Tensor forward_eval(const TensorTree& params, const at::Tensor& x) const { return forward(params, x); }
  /// Multiply-adds times two of one example's forward pass, for FLOP counts.
  virtual int64_t forward_flops() const = 0;
  /// Elements of the tree init() returns, worked out without allocating it, so that fax-run can
  /// refuse a model that does not fit before it tries (saturates at INT64_MAX). -1: unknown.
  virtual int64_t num_parameters() const { return -1; }
  /// Elements of the intermediate values one example's forward pass keeps for its backward pass
  /// (layer outputs), for the same estimate. 0: unknown.
  virtual int64_t activations_per_example() const { return 0; }
  /// The model's first dense layer, z = f(x) W + b (W [features, outputs]), when its forward pass
  /// is forward_from_input_layer(linear(input_features(x), W, b)); local SGD then computes that
  /// layer's steps in factored form (local_training.h).
  virtual std::optional<InputLayer> input_layer() const { return std::nullopt; }
  /// f(x) for a batch x [k, b, ...]: [k, b, features]. The default flattens each example; a model
  /// whose InputLayer::learned_features is set computes it from `params`.
  virtual at::Tensor input_features(const TensorTree& params, const at::Tensor& x) const;
  /// The rest of the forward pass from the input layer's output z [..., outputs]. `params` need
  /// not hold the input layer's leaves. Only called when input_layer() names one.
  virtual at::Tensor forward_from_input_layer(const TensorTree& params, const at::Tensor& z) const;
  /// The loss of outputs [..., classes] against int64 labels [...], one value per label: the
  /// task's cross-entropy (next-token for text) unless the model has its own.
  virtual at::Tensor loss(const at::Tensor& logits, const at::Tensor& labels) const;
  /// Leaves that are state rather than parameters (a BatchNorm's running statistics): local SGD
  /// takes no gradient in them; the forward pass updates them in place, and algorithms average
  /// their change like any other leaf's.
  virtual bool is_buffer(const std::string& /*leaf*/) const { return false; }
  /// Clients per map_clients chunk when execution.vectorize is 0: 0 for a whole logical shard
  /// (batched models: the more clients, the larger the products); a model that runs client by
  /// client keeps its chunk's working set in cache with a few.
  virtual int64_t preferred_chunk() const { return 0; }
};

/// Cross-entropy of logits [..., classes] against int64 labels [...], per label.
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& labels);
/// 1 where the arg-max class equals the label, else 0 (float, shape of labels).
at::Tensor correct(const at::Tensor& logits, const at::Tensor& labels);
/// Reduces per-label values [examples..., labels...] to one value per example by averaging the
/// axes after the first `example_dims` (the tokens of a sequence); classification is unchanged.
at::Tensor per_example(const at::Tensor& per_label, int64_t example_dims);

/// What a model is built for: one input's shape (without the example axis; [tokens] for text)
/// and the number of classes (the vocabulary for text).
struct ModelShape {
  std::vector<int64_t> input_shape;
  int64_t num_classes = 0;
  at::ScalarType input_type = at::kFloat;  ///< the inputs' type: int64 token ids for text
  /// Axes of one example's label: 0, a class (images, Sent140's tweets); 1, a class per token
  /// (next-token prediction). -1: unknown, taken as per token for token inputs.
  int64_t label_rank = -1;
};

/// Models fax builds by name (`model.name` in an experiment); keys relative to "model.".
using ModelEntry = RegistryEntry<std::unique_ptr<Model>, const Config&, const ModelShape&>;

const std::vector<ModelEntry>& model_registry();
const ModelEntry& find_model(const std::string& name);

}  // namespace fax
