// A minimal model plugin to copy: dense, layer norm, ReLU, dense, written with fax's batched layers
// so that a chunk of clients trains as one computation. Rename the class, `name` and the file,
// declare your settings, write init() and forward(), and build with fax_add_plugin.

#include <ATen/ATen.h>

#include <fax/fax.h>

namespace {

class NormedMlp final : public fax::Model {
 public:
  // model.name in an experiment; the library must be called fax_<name>.so.
  static constexpr const char* name = "example_model";
  static constexpr const char* description = "template model: dense, layer norm, ReLU, dense on flattened inputs";

  struct Options {
    int64_t hidden = 64;
  };

  // The keys under "model." in an experiment, bound to the members.
  static const fax::Settings<Options>& settings() {
    static const fax::Settings<Options> table =
        fax::Settings<Options>().add("hidden", &Options::hidden, "hidden width", fax::at_least(1));
    return table;
  }

  // Made once per process from the experiment and the shape the data set needs; a model that does
  // not fit the data says so with a fax::Error.
  NormedMlp(const fax::Config& config, const fax::ModelShape& shape)
      : o_(settings().read(config, "model")), classes_(shape.num_classes) {
    FAX_CHECK(!shape.input_shape.empty() && classes_ > 1, "example_model needs inputs with features and 2+ classes");
    for (int64_t d : shape.input_shape) inputs_ *= d;
  }

  std::string describe() const override {
    return fmt::format("example_model({} -> {} -> {})", inputs_, o_.hidden, classes_);
  }

  // Fresh parameters without a clients axis; fax stacks them per client when it trains.
  fax::TensorTree init(at::Generator g) const override {
    const auto uniform = [&](std::vector<int64_t> shape, int64_t fan_in) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
      return at::empty(shape).uniform_(-bound, bound, g);
    };
    return fax::TensorTree{{"in.w", uniform({inputs_, o_.hidden}, inputs_)},
                           {"in.b", uniform({o_.hidden}, inputs_)},
                           {"norm.g", at::ones({o_.hidden})},
                           {"norm.b", at::zeros({o_.hidden})},
                           {"out.w", uniform({o_.hidden, classes_}, o_.hidden)},
                           {"out.b", uniform({classes_}, o_.hidden)}};
  }

  // With a clients axis the leaves are [k, ...] and x is [k, batch, ...]; without, x is [batch, ...].
  // fax::linear, conv2d, group_norm, layer_norm, embedding and attention take either.
  at::Tensor forward(const fax::TensorTree& p, const at::Tensor& x) const override {
    const bool batched = p.at("in.w").dim() == 3;
    const at::Tensor flat = x.flatten(batched ? 2 : 1);
    const at::Tensor h = fax::layer_norm(fax::linear(flat, p.at("in.w"), p.at("in.b")), p.at("norm.g"), p.at("norm.b"));
    return fax::linear(at::relu(h), p.at("out.w"), p.at("out.b"));
  }

  // For the FLOP counts of fax-run bench and the memory estimate before a run.
  int64_t forward_flops() const override { return 2 * (inputs_ * o_.hidden + o_.hidden * classes_); }
  int64_t num_parameters() const override { return (inputs_ + 3) * o_.hidden + (o_.hidden + 1) * classes_; }
  int64_t activations_per_example() const override { return 3 * o_.hidden + classes_; }

 private:
  Options o_;
  int64_t inputs_ = 1;
  int64_t classes_;
};

}  // namespace

FAX_MODEL_PLUGIN(NormedMlp)
