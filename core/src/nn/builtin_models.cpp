#include <fax/nn/builtin_models.h>

#include <algorithm>
#include <limits>
#include <sstream>

#include <ATen/ATen.h>

#include <fax/base/error.h>
#include <fax/base/settings.h>
#include <fax/nn/layers.h>
#include <fax/nn/torchscript.h>

#include "kernels/kernels.h"

namespace fax {
namespace {

// Sizes for the memory estimate, which must not overflow on absurd settings (a width of 10^12):
// products and sums saturate at INT64_MAX.
int64_t saturating_add(int64_t a, int64_t b) {
  int64_t out = 0;
  return __builtin_add_overflow(a, b, &out) ? std::numeric_limits<int64_t>::max() : out;
}
int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t out = 0;
  return __builtin_mul_overflow(a, b, &out) ? std::numeric_limits<int64_t>::max() : out;
}
// Weights [in, out] and bias [out] of a dense layer.
int64_t dense(int64_t in, int64_t out) { return saturating_add(saturating_mul(in, out), out); }


int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// PyTorch's default for Linear and Conv2d: weights and biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
at::Tensor fan_in_uniform(std::vector<int64_t> shape, int64_t fan_in, at::Generator& g) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return at::empty(shape).uniform_(-bound, bound, g);
}

// Whether the parameters carry a clients axis: compare one leaf's rank with its unbatched rank.
bool is_batched(const TensorTree& params, const std::string& leaf, int64_t unbatched_rank) {
  return params.at(leaf).dim() == unbatched_rank + 1;
}

// Flattens the `input_rank` trailing axes of one input into features.
at::Tensor flatten_input(const at::Tensor& x, int64_t input_rank) { return x.flatten(x.dim() - input_rank); }

std::vector<int64_t> parse_sizes(const std::string& text, const std::string& key) {
  std::vector<int64_t> sizes;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    try {
      size_t used = 0;
      const int64_t v = std::stoll(part, &used);
      FAX_CHECK(used == part.size() && v > 0, "bad size");
      sizes.push_back(v);
    } catch (const std::exception&) {
      throw Error(fmt::format("{}: '{}' is not a comma-separated list of positive sizes", key, text));
    }
  }
  return sizes;
}

}  // namespace

SoftmaxRegression::SoftmaxRegression(int64_t inputs, int64_t classes) : inputs_(inputs), classes_(classes) {
  FAX_CHECK(inputs > 0 && classes > 1, "softmax_regression needs inputs > 0 and classes > 1 (got {} and {})", inputs,
            classes);
}

std::string SoftmaxRegression::describe() const {
  return fmt::format("softmax_regression({} -> {})", inputs_, classes_);
}

TensorTree SoftmaxRegression::init(at::Generator) const {
  // Zero initialisation, as in the FedProx reference for multinomial logistic regression: the
  // problem is convex, so the start point only shifts the curve.
  return TensorTree{{"w", at::zeros({inputs_, classes_})}, {"b", at::zeros({classes_})}};
}

at::Tensor SoftmaxRegression::forward(const TensorTree& params, const at::Tensor& x) const {
  const at::Tensor flat = x.reshape({-1, inputs_});
  const bool batched = is_batched(params, "w", 2);
  const at::Tensor out = fax::linear(batched ? flat.view({x.size(0), -1, inputs_}) : flat, params.at("w"), params.at("b"));
  return batched ? out : out.view({-1, classes_});
}

Mlp::Mlp(std::vector<int64_t> input_shape, std::vector<int64_t> hidden, int64_t classes)
    : input_rank_(static_cast<int64_t>(input_shape.size())) {
  FAX_CHECK(classes > 1, "mlp needs at least 2 classes (got {})", classes);
  sizes_.push_back(product(input_shape));
  sizes_.insert(sizes_.end(), hidden.begin(), hidden.end());
  sizes_.push_back(classes);
}

std::string Mlp::describe() const { return fmt::format("mlp({})", fmt::join(sizes_, "-")); }

TensorTree Mlp::init(at::Generator g) const {
  TensorTree p;
  for (size_t l = 0; l + 1 < sizes_.size(); ++l) {
    p.set(fmt::format("l{}.w", l), fan_in_uniform({sizes_[l], sizes_[l + 1]}, sizes_[l], g));
    p.set(fmt::format("l{}.b", l), fan_in_uniform({sizes_[l + 1]}, sizes_[l], g));
  }
  return p;
}

at::Tensor Mlp::forward(const TensorTree& params, const at::Tensor& x) const {
  return forward_from_input_layer(params,
                                  fax::linear(flatten_input(x, input_rank_), params.at("l0.w"), params.at("l0.b")));
}

at::Tensor Mlp::forward_from_input_layer(const TensorTree& params, const at::Tensor& z) const {
  at::Tensor h = z;
  for (size_t l = 1; l + 1 < sizes_.size(); ++l)
    h = fax::linear(at::relu(h), params.at(fmt::format("l{}.w", l)), params.at(fmt::format("l{}.b", l)));
  return h;
}

int64_t SoftmaxRegression::num_parameters() const { return dense(inputs_, classes_); }

int64_t Mlp::num_parameters() const {
  int64_t n = 0;
  for (size_t l = 0; l + 1 < sizes_.size(); ++l) n = saturating_add(n, dense(sizes_[l], sizes_[l + 1]));
  return n;
}

int64_t Mlp::activations_per_example() const {
  int64_t n = 0;
  for (size_t l = 1; l < sizes_.size(); ++l) n = saturating_add(n, sizes_[l]);
  return n;
}

int64_t Mlp::forward_flops() const {
  int64_t flops = 0;
  for (size_t l = 0; l + 1 < sizes_.size(); ++l) flops += 2 * sizes_[l] * sizes_[l + 1];
  return flops;
}

Cnn::Cnn(std::vector<int64_t> input_shape, int64_t classes, CnnOptions options) : o_(std::move(options)), classes_(classes) {
  FAX_CHECK(input_shape.size() == 3, "{} needs inputs [channels, height, width] (got [{}])", o_.name,
            fmt::join(input_shape, ", "));
  FAX_CHECK(classes > 1, "{} needs at least 2 classes (got {})", o_.name, classes);
  FAX_CHECK(o_.kernel > 0 && !o_.channels.empty(), "{} needs a kernel size and at least one convolution", o_.name);
  channels_ = input_shape[0];
  height_ = input_shape[1];
  width_ = input_shape[2];
  int64_t c = channels_, h = height_, w = width_;
  const int64_t shrink = o_.same_padding ? 0 : o_.kernel - 1;
  for (int64_t out : o_.channels) {
    FAX_CHECK(out > 0, "{}: convolution widths must be positive (got {})", o_.name, out);
    FAX_CHECK(h - shrink >= 2 && w - shrink >= 2,
              "{}: inputs of {}x{} are too small for its {} convolutions of {}x{} and 2x2 poolings", o_.name, height_,
              width_, o_.channels.size(), o_.kernel, o_.kernel);
    convs_.push_back({c, out, h - shrink, w - shrink});
    c = out;
    h = (h - shrink) / 2;
    w = (w - shrink) / 2;
  }
  dense_.push_back(saturating_mul(c, saturating_mul(h, w)));
  for (int64_t width : o_.dense) {
    FAX_CHECK(width > 0, "{}: dense widths must be positive (got {})", o_.name, width);
    dense_.push_back(width);
  }
  dense_.push_back(classes);
}

CnnOptions lenet_options() {
  CnnOptions o;
  o.name = "lenet";
  o.channels = {6, 16};
  o.same_padding = false;
  o.dense = {120, 84};
  return o;
}

std::string Cnn::describe() const {
  std::vector<std::string> layers;
  for (const ConvLayer& conv : convs_)
    layers.push_back(fmt::format("conv{}x{}x{}{}, pool", o_.kernel, o_.kernel, conv.out, o_.same_padding ? "" : " valid"));
  for (size_t l = 1; l < dense_.size(); ++l) layers.push_back(fmt::format("dense {}", dense_[l]));
  return fmt::format("{}({}x{}x{}: {})", o_.name, channels_, height_, width_, fmt::join(layers, ", "));
}

TensorTree Cnn::init(at::Generator g) const {
  TensorTree p;
  const int64_t area = o_.kernel * o_.kernel;
  for (size_t l = 0; l < convs_.size(); ++l) {
    const ConvLayer& conv = convs_[l];
    p.set(fmt::format("conv{}.w", l + 1), fan_in_uniform({conv.out, conv.in, o_.kernel, o_.kernel}, conv.in * area, g));
    p.set(fmt::format("conv{}.b", l + 1), fan_in_uniform({conv.out}, conv.in * area, g));
  }
  for (size_t l = 0; l + 1 < dense_.size(); ++l) {
    p.set(fmt::format("fc{}.w", l + 1), fan_in_uniform({dense_[l], dense_[l + 1]}, dense_[l], g));
    p.set(fmt::format("fc{}.b", l + 1), fan_in_uniform({dense_[l + 1]}, dense_[l], g));
  }
  return p;
}

at::Tensor Cnn::input_features(const TensorTree& params, const at::Tensor& x) const {
  // relu(pool(.)) is pool(relu(.)) (relu is monotone; a zero's sign aside), and a quarter of the
  // elementwise work. The gradients agree too: where the window's maximum is <= 0 both are zero.
  const int64_t padding = o_.same_padding ? o_.kernel / 2 : 0;
  const bool batched = params.at("conv1.w").dim() == 5;
  // fax's convolutions with the batch innermost (kernels.h) where oneDNN's are weak: narrow layers.
  // LeNet (6 and 16 channels) runs 2.4x faster on them (B = 64) and 4.3x (B = 10); McMahan's cnn
  // (32 and 64) 2.4x slower (B = 10), as each weight gradient then streams its wide inputs once per
  // block of 4 output channels (docs/models.md). The choice depends on the model only, never on
  // a step's width, so every client keeps its bits in any chunk.
  const bool narrow = std::all_of(convs_.begin(), convs_.end(), [](const ConvLayer& c) { return c.out <= 16; });
  const at::Tensor& first = params.at("conv1.w");
  if (narrow && x.dim() == (batched ? 5 : 4) && x.numel() > 0 && kernels::batch_inner_takes(x, o_.kernel) &&
      first.scalar_type() == x.scalar_type() && first.device() == x.device()) {
    // One transpose in, one out.
    const auto client_axis = [batched](const at::Tensor& t) { return batched ? t : t.unsqueeze(0); };
    at::Tensor h = kernels::to_batch_inner(client_axis(x), padding);
    for (size_t l = 0; l < convs_.size(); ++l) {
      const std::string conv = fmt::format("conv{}.", l + 1);
      if (l > 0) h = kernels::pad_batch_inner(h, padding);
      h = at::relu(kernels::max_pool2_batch_inner(
          kernels::conv2d_batch_inner(h, client_axis(params.at(conv + "w")), client_axis(params.at(conv + "b")))));
    }
    const at::Tensor features = kernels::flatten_batch_inner(h, x.size(batched ? 1 : 0));
    return batched ? features : features.squeeze(0);
  }
  at::Tensor h = x;
  for (size_t l = 0; l < convs_.size(); ++l) {
    const std::string conv = fmt::format("conv{}.", l + 1);
    h = at::relu(fax::max_pool2(fax::conv2d(h, params.at(conv + "w"), params.at(conv + "b"), padding)));
  }
  return h.flatten(h.dim() - 3);
}

at::Tensor Cnn::forward(const TensorTree& params, const at::Tensor& x) const {
  return forward_from_input_layer(params, fax::linear(input_features(params, x), params.at("fc1.w"), params.at("fc1.b")));
}

at::Tensor Cnn::forward_from_input_layer(const TensorTree& params, const at::Tensor& z) const {
  at::Tensor h = z;
  for (size_t l = 2; l < dense_.size(); ++l)
    h = fax::linear(at::relu(h), params.at(fmt::format("fc{}.w", l)), params.at(fmt::format("fc{}.b", l)));
  return h;
}

int64_t Cnn::num_parameters() const {
  int64_t n = 0;
  for (const ConvLayer& conv : convs_) n = saturating_add(n, dense(conv.in * o_.kernel * o_.kernel, conv.out));
  for (size_t l = 0; l + 1 < dense_.size(); ++l) n = saturating_add(n, dense(dense_[l], dense_[l + 1]));
  return n;
}

int64_t Cnn::activations_per_example() const {
  // Each convolution's output and its pooling (a quarter), then the dense layers.
  int64_t n = 0;
  for (const ConvLayer& conv : convs_)
    n = saturating_add(n, saturating_mul(conv.out, saturating_mul(conv.height, conv.width)) / 4 * 5);
  for (size_t l = 1; l < dense_.size(); ++l) n = saturating_add(n, dense_[l]);
  return n;
}

int64_t Cnn::forward_flops() const {
  int64_t flops = 0;
  for (const ConvLayer& conv : convs_)
    flops += 2 * conv.height * conv.width * conv.out * conv.in * o_.kernel * o_.kernel;
  for (size_t l = 0; l + 1 < dense_.size(); ++l) flops += 2 * dense_[l] * dense_[l + 1];
  return flops;
}

ResNet::ResNet(std::vector<int64_t> input_shape, int64_t classes, ResNetOptions options)
    : o_(std::move(options)), classes_(classes) {
  FAX_CHECK(input_shape.size() == 3, "resnet needs inputs [channels, height, width] (got [{}])",
            fmt::join(input_shape, ", "));
  FAX_CHECK(classes > 1, "resnet needs at least 2 classes (got {})", classes);
  FAX_CHECK(o_.width > 0 && o_.groups > 0 && o_.width % o_.groups == 0,
            "resnet: width ({}) must be a positive multiple of groups ({})", o_.width, o_.groups);
  channels_ = input_shape[0];
  height_ = input_shape[1];
  width_ = input_shape[2];
  int64_t h = height_, w = width_;
  // A 3x3 convolution with padding 1 (or a 1x1 without) and stride s keeps ceil(side / s).
  const auto add = [&](std::string name, int64_t in, int64_t out, int64_t size, int64_t stride) {
    h = (h - 1) / stride + 1;
    w = (w - 1) / stride + 1;
    convs_.push_back({std::move(name), in, out, size, stride, h, w});
  };
  add("stem", channels_, o_.width, 3, 1);
  int64_t in = o_.width;
  for (size_t stage = 0; stage < o_.blocks.size(); ++stage) {
    const int64_t out = saturating_mul(o_.width, int64_t{1} << std::min<size_t>(stage, 20));
    for (int64_t block = 0; block < o_.blocks[stage]; ++block) {
      const std::string name = fmt::format("stage{}.block{}.", stage + 1, block + 1);
      const int64_t stride = stage > 0 && block == 0 ? 2 : 1;
      const int64_t h_in = h, w_in = w;
      add(name + "conv1", in, out, 3, stride);
      add(name + "conv2", out, out, 3, 1);
      if (stride != 1 || in != out) {
        h = h_in;
        w = w_in;
        add(name + "shortcut", in, out, 1, stride);
      }
      in = out;
    }
  }
}

std::string ResNet::describe() const {
  int64_t depth = 2;  // the stem and the output layer
  for (int64_t b : o_.blocks) depth += 2 * b;
  return fmt::format("resnet{}_gn({}x{}x{}: width {}, {} groups, {} classes)", depth, channels_, height_, width_,
                     o_.width, o_.groups, classes_);
}

TensorTree ResNet::init(at::Generator g) const {
  // He et al.'s initialisation as in torchvision: N(0, 2 / fan_out) convolutions; unit norm gains.
  TensorTree p;
  for (const Conv& c : convs_) {
    const double std = std::sqrt(2.0 / static_cast<double>(c.out * c.size * c.size));
    p.set(c.name + ".w", at::empty({c.out, c.in, c.size, c.size}).normal_(0.0, std, g));
    p.set(c.name + ".gn.g", at::ones({c.out}));
    p.set(c.name + ".gn.b", at::zeros({c.out}));
  }
  const int64_t features = convs_.back().out;
  p.set("fc.w", fan_in_uniform({features, classes_}, features, g));
  p.set("fc.b", fan_in_uniform({classes_}, features, g));
  return p;
}

at::Tensor ResNet::forward(const TensorTree& params, const at::Tensor& x) const {
  const auto conv_norm = [&](const Conv& c, const at::Tensor& in) {
    const at::Tensor out = fax::conv2d(in, params.at(c.name + ".w"), {}, c.size / 2, c.stride);
    return fax::group_norm(out, o_.groups, params.at(c.name + ".gn.g"), params.at(c.name + ".gn.b"));
  };
  at::Tensor h = at::relu(conv_norm(convs_[0], x));
  for (size_t i = 1; i < convs_.size();) {
    const bool projected = i + 2 < convs_.size() && convs_[i + 2].size == 1;
    const at::Tensor inner = conv_norm(convs_[i + 1], at::relu(conv_norm(convs_[i], h)));
    h = at::relu(inner + (projected ? conv_norm(convs_[i + 2], h) : h));
    i += projected ? 3 : 2;
  }
  return fax::linear(h.mean({-2, -1}), params.at("fc.w"), params.at("fc.b"));
}

int64_t ResNet::num_parameters() const {
  int64_t n = dense(convs_.back().out, classes_);
  for (const Conv& c : convs_)
    n = saturating_add(n, saturating_add(saturating_mul(c.out, saturating_mul(c.in, c.size * c.size)), 2 * c.out));
  return n;
}

int64_t ResNet::activations_per_example() const {
  // Each convolution's output, its normalisation and ReLU.
  int64_t n = classes_;
  for (const Conv& c : convs_) n = saturating_add(n, saturating_mul(3 * c.out, saturating_mul(c.height, c.width)));
  return n;
}

int64_t ResNet::forward_flops() const {
  int64_t flops = 2 * convs_.back().out * classes_;
  for (const Conv& c : convs_) flops += 2 * c.height * c.width * c.out * c.in * c.size * c.size;
  return flops;
}

TransformerLm::TransformerLm(TransformerOptions o) : o_(o) {
  FAX_CHECK(o.vocab > 1 && o.context > 0, "transformer needs a vocabulary and a context (got {} and {})", o.vocab,
            o.context);
  FAX_CHECK(o.depth > 0 && o.width > 0 && o.heads > 0 && o.width % o.heads == 0,
            "transformer: width ({}) must be a positive multiple of heads ({}), depth positive ({})", o.width,
            o.heads, o.depth);
}

std::string TransformerLm::describe() const {
  return fmt::format("transformer(vocab {}, context {}, depth {}, width {}, heads {})", o_.vocab, o_.context,
                     o_.depth, o_.width, o_.heads);
}

int64_t TransformerLm::num_parameters() const {
  const int64_t d = o_.width;
  // Per block: two layer norms, qkv and output projections, the 4x MLP.
  const int64_t block = saturating_add(saturating_add(saturating_mul(4, d), dense(d, 3 * d)),
                                       saturating_add(dense(d, d), saturating_add(dense(d, 4 * d), dense(4 * d, d))));
  const int64_t embeddings = saturating_mul(saturating_add(o_.vocab, o_.context), d);
  return saturating_add(saturating_add(embeddings, saturating_mul(o_.depth, block)),
                        saturating_add(2 * d, dense(d, o_.vocab)));
}

int64_t TransformerLm::activations_per_example() const {
  // Per token and block: norms, qkv, attention output, residuals, the MLP's 4x width (~16 d),
  // plus a row of attention scores per head; then the logits.
  const int64_t per_token = saturating_add(
      saturating_mul(o_.depth, saturating_add(saturating_mul(16, o_.width), saturating_mul(o_.heads, o_.context))),
      o_.vocab);
  return saturating_mul(per_token, o_.context);
}

TensorTree TransformerLm::init(at::Generator g) const {
  // GPT-2 style: N(0, 0.02) weights, zero biases, unit layer-norm gains.
  auto normal = [&](std::vector<int64_t> shape) { return at::empty(shape).normal_(0.0, 0.02, g); };
  const int64_t d = o_.width;
  TensorTree p{{"embed.tokens", normal({o_.vocab, d})}, {"embed.positions", normal({o_.context, d})}};
  for (int64_t l = 0; l < o_.depth; ++l) {
    const std::string b = fmt::format("block{}.", l);
    p.set(b + "ln1.g", at::ones({d}));
    p.set(b + "ln1.b", at::zeros({d}));
    p.set(b + "attn.qkv.w", normal({d, 3 * d}));
    p.set(b + "attn.qkv.b", at::zeros({3 * d}));
    p.set(b + "attn.out.w", normal({d, d}));
    p.set(b + "attn.out.b", at::zeros({d}));
    p.set(b + "ln2.g", at::ones({d}));
    p.set(b + "ln2.b", at::zeros({d}));
    p.set(b + "mlp.in.w", normal({d, 4 * d}));
    p.set(b + "mlp.in.b", at::zeros({4 * d}));
    p.set(b + "mlp.out.w", normal({4 * d, d}));
    p.set(b + "mlp.out.b", at::zeros({d}));
  }
  p.set("ln.g", at::ones({d}));
  p.set("ln.b", at::zeros({d}));
  p.set("head.w", normal({d, o_.vocab}));
  p.set("head.b", at::zeros({o_.vocab}));
  return p;
}

at::Tensor TransformerLm::forward(const TensorTree& params, const at::Tensor& x) const {
  const bool batched = is_batched(params, "embed.positions", 2);
  const int64_t t = x.size(-1);
  FAX_CHECK(t <= o_.context, "transformer: sequences of {} tokens exceed the context of {}", t, o_.context);
  // Positions [t, d] (or [k, 1, t, d]) broadcast over the batch.
  const at::Tensor positions = params.at("embed.positions");
  at::Tensor h = fax::embedding(x, params.at("embed.tokens")) +
                 (batched ? positions.narrow(1, 0, t).unsqueeze(1) : positions.narrow(0, 0, t));
  for (int64_t l = 0; l < o_.depth; ++l) {
    const std::string b = fmt::format("block{}.", l);
    auto p = [&](const char* name) -> const at::Tensor& { return params.at(b + name); };
    h = h + fax::causal_self_attention(fax::layer_norm(h, p("ln1.g"), p("ln1.b")), p("attn.qkv.w"), p("attn.qkv.b"),
                                  p("attn.out.w"), p("attn.out.b"), o_.heads);
    const at::Tensor inner = at::gelu(fax::linear(fax::layer_norm(h, p("ln2.g"), p("ln2.b")), p("mlp.in.w"), p("mlp.in.b")));
    h = h + fax::linear(inner, p("mlp.out.w"), p("mlp.out.b"));
  }
  return fax::linear(fax::layer_norm(h, params.at("ln.g"), params.at("ln.b")), params.at("head.w"), params.at("head.b"));
}

int64_t TransformerLm::forward_flops() const {
  // Per sequence: 2 flops per weight per token in the matmuls, plus attention scores and mixing
  // (2 * t * d each per token, counted in full although half is masked).
  const int64_t d = o_.width, t = o_.context;
  const int64_t per_token = 2 * (o_.depth * 12 * d * d + d * o_.vocab) + o_.depth * 4 * t * d;
  return per_token * t;
}

namespace {

// The MLP's one setting.
struct MlpSettings {
  std::string hidden = "200,200";
};

const Settings<MlpSettings>& mlp_settings() {
  static const Settings<MlpSettings> table =
      Settings<MlpSettings>().add("hidden", &MlpSettings::hidden, "hidden layer widths, comma-separated");
  return table;
}

// The configurable CNN's settings.
struct CnnSettings {
  std::string channels = "32,64";
  std::string dense = "512";
  int64_t kernel = 5;
  std::string padding = "same";
};

const Settings<CnnSettings>& cnn_settings() {
  using O = CnnSettings;
  static const Settings<O> table = Settings<O>()
      .add("channels", &O::channels, "convolution widths, comma-separated (each conv, 2x2 max pool, ReLU)")
      .add("dense", &O::dense, "hidden dense widths after the convolutions, comma-separated")
      .add("kernel", &O::kernel, "convolution kernel size", at_least(1))
      .add("padding", &O::padding, "convolution padding: same (keeps the size) or valid (none)", one_of({"same", "valid"}));
  return table;
}

const Settings<ResNetOptions>& resnet_settings() {
  using O = ResNetOptions;
  static const Settings<O> table = Settings<O>()
      .add("width", &O::width, "channels of the first stage (doubled at each later one)", at_least(1))
      .add("groups", &O::groups, "GroupNorm groups (divides width)", at_least(1));
  return table;
}

struct TorchScriptSettings {
  std::string path;
};

const Settings<TorchScriptSettings>& torchscript_settings() {
  static const Settings<TorchScriptSettings> table = Settings<TorchScriptSettings>().add(
      "path", &TorchScriptSettings::path, "the TorchScript file (torch.jit.save of a scripted or traced module)");
  return table;
}

// The transformer's settings; its vocabulary and context come from the data.
const Settings<TransformerOptions>& transformer_settings() {
  using O = TransformerOptions;
  static const Settings<O> table = Settings<O>()
      .add("depth", &O::depth, "transformer blocks", at_least(1))
      .add("width", &O::width, "model width", at_least(1))
      .add("heads", &O::heads, "attention heads (divides width)", at_least(1));
  return table;
}


// The shape of numeric inputs: a model of features refuses token ids (text) with a message.
const ModelShape& features(const ModelShape& shape, const char* model) {
  FAX_CHECK(at::isFloatingType(shape.input_type), "{} needs numeric features, but this data set gives token ids "
            "(text): use the transformer or a TorchScript module", model);
  return shape;
}

}  // namespace

const std::vector<ModelEntry>& model_registry() {
  static const std::vector<ModelEntry> registry = {
      {"softmax_regression", "multinomial logistic regression on flattened inputs", {},
       [](const Config&, const ModelShape& shape) -> std::unique_ptr<Model> {
         return std::make_unique<SoftmaxRegression>(product(features(shape, "softmax_regression").input_shape),
                                                    shape.num_classes);
       }},
      {"mlp", "multilayer perceptron with ReLU (McMahan et al.: 784-200-200-10)", mlp_settings().keys(),
       [](const Config& c, const ModelShape& shape) -> std::unique_ptr<Model> {
         const MlpSettings o = mlp_settings().read(c, "model");
         return std::make_unique<Mlp>(features(shape, "mlp").input_shape, parse_sizes(o.hidden, "model.hidden"),
                                      shape.num_classes);
       }},
      {"cnn", "CNN, by default McMahan et al. 2017's (two 5x5 conv + pool, dense 512)", cnn_settings().keys(),
       [](const Config& c, const ModelShape& shape) -> std::unique_ptr<Model> {
         const CnnSettings s = cnn_settings().read(c, "model");
         CnnOptions o;
         o.channels = parse_sizes(s.channels, "model.channels");
         o.dense = parse_sizes(s.dense, "model.dense");
         o.kernel = s.kernel;
         o.same_padding = s.padding == "same";
         return std::make_unique<Cnn>(features(shape, "cnn").input_shape, shape.num_classes, o);
       }},
      {"lenet", "LeNet-style CNN of the non-IID benchmark (Li et al. 2022: conv 6, 16, dense 120, 84)", {},
       [](const Config&, const ModelShape& shape) -> std::unique_ptr<Model> {
         return std::make_unique<Cnn>(features(shape, "lenet").input_shape, shape.num_classes, lenet_options());
       }},
      {"resnet18_gn", "ResNet-18 with GroupNorm for 32x32 images (Hsieh et al. 2020)", resnet_settings().keys(),
       [](const Config& c, const ModelShape& shape) -> std::unique_ptr<Model> {
         return std::make_unique<ResNet>(features(shape, "resnet18_gn").input_shape, shape.num_classes,
                                         resnet_settings().read(c, "model"));
       }},
      {"transformer", "decoder-only transformer language model (next-token prediction)", transformer_settings().keys(),
       [](const Config& c, const ModelShape& shape) -> std::unique_ptr<Model> {
         FAX_CHECK(shape.input_shape.size() == 1 && !at::isFloatingType(shape.input_type),
                   "the transformer needs token sequences (a text data set)");
         FAX_CHECK(shape.label_rank != 0, "the transformer predicts the next token at every position, but this data "
                   "set has one label per sequence (e.g. Sent140's tweets): use a sequence classifier, e.g. a "
                   "TorchScript module (model.name: torchscript)");
         TransformerOptions o = transformer_settings().read(c, "model");
         o.vocab = shape.num_classes;
         o.context = shape.input_shape[0];
         return std::make_unique<TransformerLm>(o);
       }},
      {"torchscript", "a PyTorch module saved with torch.jit.save (model.path), trained per client",
       torchscript_settings().keys(),
       [](const Config& c, const ModelShape& shape) -> std::unique_ptr<Model> {
         return load_torchscript_model(torchscript_settings().read(c, "model").path, shape);
       }},
  };
  return registry;
}

}  // namespace fax
