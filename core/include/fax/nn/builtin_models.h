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

/// A convolutional network: `channels.size()` blocks of a k x k convolution, 2x2 max pooling and
/// ReLU, then dense layers of widths `dense` with ReLU and a dense output layer.
struct CnnOptions {
  std::string name = "cnn";            ///< for describe()
  std::vector<int64_t> channels{32, 64};
  int64_t kernel = 5;
  bool same_padding = true;            ///< else "valid" (no padding)
  std::vector<int64_t> dense{512};
};

/// The CNN of McMahan et al. 2017 by default: conv 5x5 32, max pool, conv 5x5 64, max pool, dense
/// 512, dense classes, ReLU between; "same" padding. The LeNet-style CNN of the non-IID benchmark
/// (Li et al. 2022) is conv 5x5 6, pool, conv 5x5 16, pool, dense 120, 84 without padding
/// (lenet_options()). Inputs [channels, height, width]. Leaves "convN.w" [o, c, k, k], "convN.b",
/// "fcN.w" [in, out], "fcN.b", numbered from 1.
class Cnn final : public Model {
 public:
  Cnn(std::vector<int64_t> input_shape, int64_t classes, CnnOptions options = {});
  std::string describe() const override;
  TensorTree init(at::Generator generator) const override;
  at::Tensor forward(const TensorTree& params, const at::Tensor& x) const override;
  int64_t forward_flops() const override;
  int64_t num_parameters() const override;
  int64_t activations_per_example() const override;
  std::optional<InputLayer> input_layer() const override { return InputLayer{"fc1.w", "fc1.b", true}; }
  /// The convolutions and poolings, flattened: [k, b, features] (or [b, ...]).
  at::Tensor input_features(const TensorTree& params, const at::Tensor& x) const override;
  at::Tensor forward_from_input_layer(const TensorTree& params, const at::Tensor& z) const override;

 private:
  struct ConvLayer {
    int64_t in, out;        // channels
    int64_t height, width;  // its output, before pooling
  };
  CnnOptions o_;
  int64_t channels_, height_, width_, classes_;
  std::vector<ConvLayer> convs_;
  std::vector<int64_t> dense_;  // features after the convolutions, dense widths..., classes
};

CnnOptions lenet_options();

struct ResNetOptions {
  int64_t width = 64;       ///< channels of the first stage (doubling at each of the next three)
  int64_t groups = 2;       ///< GroupNorm groups (Hsieh et al. 2020: 2)
  std::vector<int64_t> blocks{2, 2, 2, 2};  ///< basic blocks per stage: ResNet-18
};

/// ResNet-18 for 32x32 images with GroupNorm in place of BatchNorm (Hsieh et al. 2020; He et al.
/// 2016's CIFAR stem: a 3x3 convolution, no max pool): 4 stages of basic blocks (3x3 conv, norm,
/// ReLU, 3x3 conv, norm, plus the shortcut, ReLU), strides 1, 2, 2, 2, a 1x1 convolution and norm on
/// shortcuts that change shape, global average pooling and a dense output. Convolutions have no
/// bias. Any input [channels, height, width] works (the pool is global).
class ResNet final : public Model {
 public:
  ResNet(std::vector<int64_t> input_shape, int64_t classes, ResNetOptions options = {});
  std::string describe() const override;
  TensorTree init(at::Generator generator) const override;
  at::Tensor forward(const TensorTree& params, const at::Tensor& x) const override;
  int64_t forward_flops() const override;
  int64_t num_parameters() const override;
  int64_t activations_per_example() const override;

 private:
  struct Conv {
    std::string name;  // leaf prefix: "<name>.w" [out, in, size, size]; its norm "<name>.gn.{g,b}"
    int64_t in, out, size, stride;
    int64_t height, width;  // output
  };
  ResNetOptions o_;
  int64_t channels_, height_, width_, classes_;
  std::vector<Conv> convs_;  // in forward order; a block's shortcut after its second conv
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
