#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fax/nn/model.h>

namespace fax {

/// Softmax (multinomial logistic) regression on flattened inputs: logits = x W + b. Zero init.
class SoftmaxRegression final : public Model {
 public:
  SoftmaxRegression(int64_t inputs, int64_t classes);
  std::string describe() const override;
  TensorTree init(at::Generator generator) const override;
  at::Tensor forward(const TensorTree& params, const at::Tensor& x) const override;
  int64_t forward_flops() const override { return 2 * inputs_ * classes_; }
  int64_t num_parameters() const override;
  int64_t activations_per_example() const override { return classes_; }
  std::optional<InputLayer> input_layer() const override { return InputLayer{"w", "b"}; }
  at::Tensor forward_from_input_layer(const TensorTree&, const at::Tensor& z) const override { return z; }

 private:
  int64_t inputs_;
  int64_t classes_;
};

/// A multilayer perceptron with ReLU on flattened inputs (McMahan et al.'s 784-200-200-10 by
/// default). Layers "l0", "l1", ... with weights "lN.w" [in, out] and biases "lN.b".
class Mlp final : public Model {
 public:
  Mlp(std::vector<int64_t> input_shape, std::vector<int64_t> hidden, int64_t classes);
  std::string describe() const override;
  TensorTree init(at::Generator generator) const override;
  at::Tensor forward(const TensorTree& params, const at::Tensor& x) const override;
  int64_t forward_flops() const override;
  int64_t num_parameters() const override;
  int64_t activations_per_example() const override;
  std::optional<InputLayer> input_layer() const override { return InputLayer{"l0.w", "l0.b"}; }
  at::Tensor forward_from_input_layer(const TensorTree& params, const at::Tensor& z) const override;

 private:
  int64_t input_rank_;
  std::vector<int64_t> sizes_;  // inputs, hidden..., classes
};

/// The CNN of McMahan et al. 2017: conv 5x5 32, max pool, conv 5x5 64, max pool, dense 512,
/// dense classes, ReLU between; "same" padding. Inputs [channels, height, width].
class Cnn final : public Model {
 public:
  Cnn(std::vector<int64_t> input_shape, int64_t classes);
  std::string describe() const override;
  TensorTree init(at::Generator generator) const override;
  at::Tensor forward(const TensorTree& params, const at::Tensor& x) const override;
  int64_t forward_flops() const override;
  int64_t num_parameters() const override;
  int64_t activations_per_example() const override;
  std::optional<InputLayer> input_layer() const override { return InputLayer{"fc1.w", "fc1.b", true}; }
  /// The convolutions and poolings, flattened: [k, b, 64 * h/4 * w/4] (or [b, ...]).
  at::Tensor input_features(const TensorTree& params, const at::Tensor& x) const override;
  at::Tensor forward_from_input_layer(const TensorTree& params, const at::Tensor& z) const override;

 private:
  int64_t channels_, height_, width_, classes_;
};

struct TransformerOptions {
  int64_t vocab = 0;
  int64_t context = 0;  ///< tokens per sequence
  int64_t depth = 2;
  int64_t width = 64;
  int64_t heads = 4;
};

/// A decoder-only (GPT-style) transformer language model: token and position embeddings, `depth`
/// pre-norm blocks of causal self-attention and a 4x GELU MLP, a final layer norm and an output
/// projection to the vocabulary. Inputs are token ids [tokens]; outputs next-token logits.
class TransformerLm final : public Model {
 public:
  explicit TransformerLm(TransformerOptions options);
  std::string describe() const override;
  TensorTree init(at::Generator generator) const override;
  at::Tensor forward(const TensorTree& params, const at::Tensor& x) const override;
  int64_t forward_flops() const override;
  int64_t num_parameters() const override;
  int64_t activations_per_example() const override;

 private:
  TransformerOptions o_;
};

}  // namespace fax
