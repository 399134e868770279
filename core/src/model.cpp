#include <fax/model.h>

#include <ATen/ATen.h>

#include <fax/error.h>
#include <fax/registry.h>

namespace fax {

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& labels) {
  return at::log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1).neg();
}

at::Tensor correct(const at::Tensor& logits, const at::Tensor& labels) {
  return logits.argmax(-1).eq(labels).to(logits.scalar_type());
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  if (w.dim() == 3) return at::baddbmm(bias.unsqueeze(1), x, w);
  return at::addmm(bias, x, w);
}

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
  const at::Tensor& w = params.at("w");
  const bool batched = w.dim() == 3;
  const at::Tensor flat = batched ? x.reshape({x.size(0), x.size(1), inputs_}) : x.reshape({x.size(0), inputs_});
  return linear(flat, w, params.at("b"));
}

namespace {
int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
}  // namespace

const std::vector<ModelEntry>& model_registry() {
  static const std::vector<ModelEntry> registry = {
      {"softmax_regression", "multinomial logistic regression on flattened inputs", {},
       [](const Config&, const ModelShape& shape) -> std::unique_ptr<Model> {
         return std::make_unique<SoftmaxRegression>(product(shape.input_shape), shape.num_classes);
       }},
  };
  return registry;
}

const ModelEntry& find_model(const std::string& name) { return find_entry(model_registry(), name, "model"); }

}  // namespace fax
