#include <fax/local_training.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <fax/error.h>

namespace fax {

ClientBatches::ClientBatches(const ClientChunk& chunk, const FederatedDataset& data, int64_t epochs,
                             int64_t batch_size) {
  FAX_CHECK(epochs > 0, "local training needs at least one epoch (got {})", epochs);
  FAX_CHECK(batch_size >= 0, "batch size must be positive, or 0 for full batch (got {})", batch_size);
  const int64_t k = chunk.size;
  std::vector<Examples> clients;
  std::vector<int64_t> sizes;
  int64_t widest = 0;
  for (int64_t i = 0; i < k; ++i) {
    clients.push_back(data.client(chunk.client_id(i)));
    const int64_t n = clients.back().size();
    FAX_CHECK(n > 0, "client {} has no training examples", chunk.client_id(i));
    sizes.push_back(n);
    widest = std::max(widest, n);
  }
  const int64_t b = batch_size > 0 ? batch_size : widest;
  auto batches_per_epoch = [b](int64_t n) { return (n + b - 1) / b; };
  int64_t steps = 0;
  for (int64_t n : sizes) steps = std::max(steps, epochs * batches_per_epoch(n));

  std::vector<at::Tensor> xs, ys;
  index_ = at::zeros({steps, k, b}, at::kLong);
  mask_ = at::zeros({steps, k, b});
  int64_t offset = 0;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t n = sizes[i];
    const int64_t per_epoch = batches_per_epoch(n);
    at::Generator g = chunk.generator(i);
    // Slots past the client's data point at its first example and are masked out.
    at::Tensor order = at::full({epochs, per_epoch * b}, offset, at::kLong);
    at::Tensor used = at::zeros({epochs, per_epoch * b});
    for (int64_t e = 0; e < epochs; ++e) {
      order[e].narrow(0, 0, n).copy_(at::randperm(n, g, at::kLong) + offset);
      used[e].narrow(0, 0, n).fill_(1.0);
    }
    index_.select(1, i).fill_(offset);
    index_.select(1, i).narrow(0, 0, epochs * per_epoch).copy_(order.view({epochs * per_epoch, b}));
    mask_.select(1, i).narrow(0, 0, epochs * per_epoch).copy_(used.view({epochs * per_epoch, b}));
    xs.push_back(clients[i].x);
    ys.push_back(clients[i].y);
    offset += n;
  }
  x_ = at::cat(xs);
  y_ = at::cat(ys);
  // Masks and counts weigh losses: float, in the inputs' precision when those are floats.
  const at::ScalarType weight_type = x_.is_floating_point() ? x_.scalar_type() : at::kFloat;
  mask_ = mask_.to(weight_type);
  examples_ = at::tensor(sizes, at::kLong).to(weight_type);
}

at::Tensor ClientBatches::client_steps() const { return (mask_.sum(2) > 0).to(mask_.scalar_type()).sum(0); }

Batch ClientBatches::batch(int64_t step) const {
  const at::Tensor rows = index_[step];  // [k, B]
  const int64_t k = rows.size(0);
  const int64_t b = rows.size(1);
  std::vector<int64_t> x_shape{k, b};
  x_shape.insert(x_shape.end(), x_.sizes().begin() + 1, x_.sizes().end());
  std::vector<int64_t> y_shape{k, b};
  y_shape.insert(y_shape.end(), y_.sizes().begin() + 1, y_.sizes().end());
  const at::Tensor flat = rows.reshape({-1});
  return {x_.index_select(0, flat).view(x_shape), y_.index_select(0, flat).view(y_shape), mask_[step]};
}

namespace {
// Per-client masked mean of per-example values [k, B].
at::Tensor masked_mean(const at::Tensor& values, const at::Tensor& mask) {
  return (values * mask).sum(1) / mask.sum(1).clamp_min(1.0);
}
}  // namespace

LocalSgdResult local_sgd(const Model& model, const ClientBatches& batches, const TensorTree& start,
                         const at::Tensor& lr, const LocalSgdOptions& options) {
  // Without create_graph the steps update a copy of `start` in place; with it they stay connected
  // to `start` (and to the rate), and a start that carries no graph gets fresh leaves to differentiate.
  TensorTree params = start.map([&](const at::Tensor& t) {
    if (!options.create_graph) return t.detach().clone().requires_grad_(true);
    return t.requires_grad() ? t : t.detach().requires_grad_(true);
  });
  const int64_t k = batches.clients();
  const at::Tensor step_size = lr.dim() == 0 ? lr : lr.view({k});
  at::Tensor loss_sum = at::zeros({k}, batches.examples().options());
  at::Tensor seen = at::zeros({k}, batches.examples().options());
  for (int64_t s = 0; s < batches.steps(); ++s) {
    const Batch batch = batches.batch(s);
    const at::Tensor losses = per_example(cross_entropy(model.forward(params, batch.x), batch.y), 2);
    at::Tensor per_client = masked_mean(losses, batch.mask);
    loss_sum += (losses.detach() * batch.mask).sum(1);
    seen += batch.mask.sum(1);
    if (options.penalty) per_client = per_client + options.penalty(params);
    // Clients are independent, so the gradient of the sum holds each client's own gradient.
    const auto grads = torch::autograd::grad({per_client.sum()}, params.tensors(), {}, true, options.create_graph);
    // A client whose steps are over (no real example in this batch) does not move.
    const at::Tensor rate = step_size * (batch.mask.sum(1) > 0).to(batch.mask.scalar_type());
    // In the parameters' dtype: a float64 rate must not promote float32 parameters.
    auto scale_for = [&](const at::Tensor& p) {
      std::vector<int64_t> shape(p.dim(), 1);
      shape[0] = k;
      return rate.view(shape).to(p.scalar_type());
    };
    size_t j = 0;
    if (options.create_graph) {
      std::vector<at::Tensor> next;
      for (const auto& [name, p] : params) next.push_back(p - scale_for(p) * grads[j++]);
      params = params.with_tensors(std::move(next));
    } else {
      // Nothing differentiates through the steps: update the leaves in place, one fused kernel a
      // tensor and no new buffers (p - s * g rounds the same as p + (-1 * s) * g).
      at::NoGradGuard no_grad;
      for (const auto& [name, p] : params) p.detach().addcmul_(scale_for(p), grads[j++], -1);
    }
  }
  return {options.create_graph ? params : detach(params), loss_sum / seen.clamp_min(1.0)};
}

std::pair<at::Tensor, at::Tensor> evaluate_batches(const Model& model, const ClientBatches& batches,
                                                   const TensorTree& params) {
  at::NoGradGuard no_grad;
  const int64_t k = batches.clients();
  at::Tensor loss = at::zeros({k}, batches.examples().options());
  at::Tensor hits = at::zeros({k}, batches.examples().options());
  at::Tensor seen = at::zeros({k}, batches.examples().options());
  for (int64_t s = 0; s < batches.steps(); ++s) {
    const Batch batch = batches.batch(s);
    const at::Tensor logits = model.forward(params, batch.x);
    loss += (per_example(cross_entropy(logits, batch.y), 2) * batch.mask).sum(1);
    hits += (per_example(correct(logits, batch.y), 2) * batch.mask).sum(1);
    seen += batch.mask.sum(1);
  }
  return {loss / seen.clamp_min(1.0), hits / seen.clamp_min(1.0)};
}

}  // namespace fax
