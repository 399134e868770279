#include <fax/nn/builtin_models.h>

#include <limits>
#include <sstream>

#include <ATen/ATen.h>

#include <fax/base/error.h>
#include <fax/base/settings.h>
#include <fax/nn/layers.h>

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

Cnn::Cnn(std::vector<int64_t> input_shape, int64_t classes) : classes_(classes) {
  FAX_CHECK(input_shape.size() == 3 && input_shape[1] % 4 == 0 && input_shape[2] % 4 == 0,
            "cnn needs inputs [channels, height, width] with height and width multiples of 4 (got [{}])",
            fmt::join(input_shape, ", "));
  channels_ = input_shape[0];
  height_ = input_shape[1];
  width_ = input_shape[2];
}

std::string Cnn::describe() const {
  return fmt::format("cnn({}x{}x{}: conv5x5x32, pool, conv5x5x64, pool, dense 512, dense {})", channels_, height_,
                     width_, classes_);
}

TensorTree Cnn::init(at::Generator g) const {
  const int64_t flat = 64 * (height_ / 4) * (width_ / 4);
  return TensorTree{{"conv1.w", fan_in_uniform({32, channels_, 5, 5}, channels_ * 25, g)},
                    {"conv1.b", fan_in_uniform({32}, channels_ * 25, g)},
                    {"conv2.w", fan_in_uniform({64, 32, 5, 5}, 32 * 25, g)},
                    {"conv2.b", fan_in_uniform({64}, 32 * 25, g)},
                    {"fc1.w", fan_in_uniform({flat, 512}, flat, g)},
                    {"fc1.b", fan_in_uniform({512}, flat, g)},
                    {"fc2.w", fan_in_uniform({512, classes_}, 512, g)},
                    {"fc2.b", fan_in_uniform({classes_}, 512, g)}};
}

at::Tensor Cnn::input_features(const TensorTree& params, const at::Tensor& x) const {
  // relu(pool(.)) is pool(relu(.)) (relu is monotone; a zero's sign aside), and a quarter of the
  // elementwise work. The gradients agree too: where the window's maximum is <= 0 both are zero.
  at::Tensor h = at::relu(fax::max_pool2(fax::conv2d(x, params.at("conv1.w"), params.at("conv1.b"), 2)));
  h = at::relu(fax::max_pool2(fax::conv2d(h, params.at("conv2.w"), params.at("conv2.b"), 2)));
  return h.flatten(h.dim() - 3);
}

at::Tensor Cnn::forward(const TensorTree& params, const at::Tensor& x) const {
  return forward_from_input_layer(params, fax::linear(input_features(params, x), params.at("fc1.w"), params.at("fc1.b")));
}

at::Tensor Cnn::forward_from_input_layer(const TensorTree& params, const at::Tensor& z) const {
  return fax::linear(at::relu(z), params.at("fc2.w"), params.at("fc2.b"));
}

int64_t Cnn::num_parameters() const {
  const int64_t flat = saturating_mul(64, saturating_mul(height_ / 4, width_ / 4));
  return saturating_add(saturating_add(dense(channels_ * 25, 32), dense(32 * 25, 64)),
                        saturating_add(dense(flat, 512), dense(512, classes_)));
}

int64_t Cnn::activations_per_example() const {
  // conv1 and its pool, conv2 and its pool, the dense layers.
  const int64_t pixels = saturating_mul(height_, width_);
  return saturating_add(saturating_add(saturating_mul(32 + 8, pixels), saturating_mul(16 + 4, pixels)),
                        512 + classes_);
}

int64_t Cnn::forward_flops() const {
  const int64_t conv1 = 2 * height_ * width_ * 32 * channels_ * 25;
  const int64_t conv2 = 2 * (height_ / 2) * (width_ / 2) * 64 * 32 * 25;
  const int64_t fc = 2 * (64 * (height_ / 4) * (width_ / 4) * 512 + 512 * classes_);
  return conv1 + conv2 + fc;
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

// The transformer's settings; its vocabulary and context come from the data.
const Settings<TransformerOptions>& transformer_settings() {
  using O = TransformerOptions;
  static const Settings<O> table = Settings<O>()
      .add("depth", &O::depth, "transformer blocks", at_least(1))
      .add("width", &O::width, "model width", at_least(1))
      .add("heads", &O::heads, "attention heads (divides width)", at_least(1));
  return table;
}

}  // namespace

const std::vector<ModelEntry>& model_registry() {
  static const std::vector<ModelEntry> registry = {
      {"softmax_regression", "multinomial logistic regression on flattened inputs", {},
       [](const Config&, const ModelShape& shape) -> std::unique_ptr<Model> {
         return std::make_unique<SoftmaxRegression>(product(shape.input_shape), shape.num_classes);
       }},
      {"mlp", "multilayer perceptron with ReLU (McMahan et al.: 784-200-200-10)", mlp_settings().keys(),
       [](const Config& c, const ModelShape& shape) -> std::unique_ptr<Model> {
         const MlpSettings o = mlp_settings().read(c, "model");
         return std::make_unique<Mlp>(shape.input_shape, parse_sizes(o.hidden, "model.hidden"), shape.num_classes);
       }},
      {"cnn", "the CNN of McMahan et al. 2017 (two 5x5 conv + pool, dense 512)", {},
       [](const Config&, const ModelShape& shape) -> std::unique_ptr<Model> {
         return std::make_unique<Cnn>(shape.input_shape, shape.num_classes);
       }},
      {"transformer", "decoder-only transformer language model (next-token prediction)", transformer_settings().keys(),
       [](const Config& c, const ModelShape& shape) -> std::unique_ptr<Model> {
         FAX_CHECK(shape.input_shape.size() == 1, "the transformer needs token sequences (a text data set)");
         TransformerOptions o = transformer_settings().read(c, "model");
         o.vocab = shape.num_classes;
         o.context = shape.input_shape[0];
         return std::make_unique<TransformerLm>(o);
       }},
  };
  return registry;
}

}  // namespace fax
