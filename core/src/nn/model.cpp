#include <fax/nn/model.h>

#include <limits>

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>

#include <fax/base/error.h>
#include <fax/base/registry.h>

namespace fax {

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& labels) {
  // nll_loss picks and negates in one kernel (gather, squeeze and neg took three, and as many again
  // in the backward). It ignores no label here: every one is range-checked.
  const at::Tensor rows = at::log_softmax(logits, -1).reshape({-1, logits.size(-1)});
  return at::nll_loss(rows, labels.reshape({-1}), {}, at::Reduction::None, std::numeric_limits<int64_t>::min())
      .view(labels.sizes());
}

at::Tensor correct(const at::Tensor& logits, const at::Tensor& labels) {
  return logits.argmax(-1).eq(labels).to(logits.scalar_type());
}

at::Tensor per_example(const at::Tensor& per_label, int64_t example_dims) {
  return per_label.dim() > example_dims ? per_label.flatten(example_dims).mean(-1) : per_label;
}

at::Tensor Model::input_features(const TensorTree&, const at::Tensor& x) const { return x.flatten(2); }

at::Tensor Model::forward_from_input_layer(const TensorTree&, const at::Tensor&) const {
  throw Error(fmt::format("model {} has no input layer to continue from", describe()));
}

at::Tensor Model::loss(const at::Tensor& logits, const at::Tensor& labels) const { return cross_entropy(logits, labels); }

const ModelEntry& find_model(const std::string& name) { return find_entry(model_registry(), name, "model"); }

}  // namespace fax
