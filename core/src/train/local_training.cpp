#include <fax/train/local_training.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <fax/base/error.h>
#include <fax/base/interrupt.h>
#include <fax/nn/layers.h>

namespace fax {

namespace {

// Images [..., C, H, W] cropped and flipped per image: draws [..., 3] hold each one's first row and
// column in the padded image and whether it is flipped.
at::Tensor augment_images(const at::Tensor& x, const at::Tensor& draws, const Augmentation& a) {
  const int64_t c = x.size(-3), h = x.size(-2), w = x.size(-1), p = a.pad;
  const at::Tensor images = x.reshape({-1, c, h, w});
  const int64_t n = images.size(0);
  at::Tensor padded = images;
  if (p > 0) {
    padded = at::empty({n, c, h + 2 * p, w + 2 * p}, x.options());
    for (int64_t i = 0; i < c; ++i) padded.select(1, i).fill_(a.fill.empty() ? 0.0 : a.fill.at(i));
    padded.narrow(2, p, h).narrow(3, p, w).copy_(images);
  }
  const at::Tensor d = draws.reshape({n, 3});
  const at::Tensor rows = d.select(1, 0).unsqueeze(1) + at::arange(h, d.options()).unsqueeze(0);  // [n, h]
  const at::Tensor ahead = at::arange(w, d.options()).unsqueeze(0).expand({n, w});
  const at::Tensor cols = d.select(1, 1).unsqueeze(1) + at::where(d.select(1, 2).unsqueeze(1) == 1, (w - 1) - ahead, ahead);
  const at::Tensor cropped = padded.gather(2, rows.view({n, 1, h, 1}).expand({n, c, h, w + 2 * p}));
  return cropped.gather(3, cols.view({n, 1, 1, w}).expand({n, c, h, w})).view(x.sizes());
}

// The data set's pool (nullptr: none), checked once: inputs and labels one row per example.
const Examples* checked_pool(const FederatedDataset& data) {
  const Examples* pool = data.pool();
  FAX_CHECK(pool == nullptr || (pool->x.defined() && pool->y.defined() && pool->x.dim() >= 1 && pool->y.dim() >= 1 &&
                                pool->y.size(0) == pool->size()),
            "data set {}: its example pool's inputs and labels are not one row per example", data.describe());
  return pool;
}

// Client `id`'s rows of the data set's pool, checked: a data set's word is not trusted with reads.
at::Tensor pool_rows(const FederatedDataset& data, const Examples& pool, int64_t id) {
  const at::Tensor rows = data.client_rows(id);
  const int64_t n = data.num_examples(id);
  FAX_CHECK(rows.defined() && rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.size(0) == n &&
                rows.is_cpu() && rows.layout() == at::kStrided,
            "data set {}: {}'s rows of its example pool are not [{}] int64", data.describe(), describe_client(data, id), n);
  if (n > 0) {
    const int64_t lo = rows.min().item<int64_t>(), hi = rows.max().item<int64_t>();
    FAX_CHECK(lo >= 0 && hi < pool.size(), "data set {}: {}'s rows of its example pool run from {} to {}, outside 0..{}",
              data.describe(), describe_client(data, id), lo, hi, pool.size() - 1);
  }
  return rows;
}

}  // namespace

ClientBatches::ClientBatches(const ClientChunk& chunk, const FederatedDataset& data, int64_t epochs,
                             int64_t batch_size, bool augment) {
  FAX_CHECK(epochs > 0, "local training needs at least one epoch (got {})", epochs);
  FAX_CHECK(batch_size >= 0, "batch size must be positive, or 0 for full batch (got {})", batch_size);
  const int64_t k = chunk.size;
  // Pooled data sets: each client's rows of the pool; else each client's examples, joined below.
  const Examples* pool = k > 0 ? checked_pool(data) : nullptr;
  std::vector<at::Tensor> pooled;
  std::vector<Examples> clients;
  std::vector<int64_t> sizes;
  int64_t widest = 0;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t id = chunk.client_id(i);
    if (pool != nullptr) {
      pooled.push_back(pool_rows(data, *pool, id));
    } else {
      clients.push_back(data.client(id));
    }
    const int64_t n = pool != nullptr ? pooled.back().size(0) : clients.back().size();
    FAX_CHECK(n > 0, "client {} has no training examples", id);
    sizes.push_back(n);
    widest = std::max(widest, n);
  }
  const at::Tensor& inputs = pool != nullptr ? pool->x : k > 0 ? clients[0].x : at::Tensor();
  // A chunk of no clients (an empty logical shard) has no step, and batches of one empty slot.
  const int64_t b = batch_size > 0 ? batch_size : std::max<int64_t>(widest, 1);
  auto batches_per_epoch = [b](int64_t n) { return (n + b - 1) / b; };
  int64_t steps = 0;
  for (int64_t n : sizes) steps = std::max(steps, epochs * batches_per_epoch(n));

  index_ = at::zeros({steps, k, b}, at::kLong);
  mask_ = at::zeros({steps, k, b});
  if (augment) augmentation_ = data.augmentation();
  if (augmentation_) {
    FAX_CHECK(k == 0 || (inputs.dim() == 4 && augmentation_->pad >= 0 &&
                         (augmentation_->fill.empty() || static_cast<int64_t>(augmentation_->fill.size()) == inputs.size(1))),
              "augmentation needs images [C, H, W] and a fill value per channel (inputs are [{}])",
              fmt::join(inputs.sizes().slice(1), ", "));
    draws_ = at::zeros({steps, k, b, 3}, at::kLong);
    draws_.narrow(3, 0, 2).fill_(augmentation_->pad);  // masked slots: the image as it is
  }
  int64_t offset = 0;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t n = sizes[i];
    const int64_t per_epoch = batches_per_epoch(n);
    at::Generator g = chunk.generator(i);
    // The client's rows of x_, in order; slots past its data point at its first one, masked out.
    const at::Tensor mine = pool != nullptr ? pooled[i] : at::arange(offset, offset + n, at::kLong);
    const int64_t first = pool != nullptr ? mine[0].item<int64_t>() : offset;
    at::Tensor order = at::full({epochs, per_epoch * b}, first, at::kLong);
    at::Tensor used = at::zeros({epochs, per_epoch * b});
    for (int64_t e = 0; e < epochs; ++e) {
      order[e].narrow(0, 0, n).copy_(mine.index_select(0, at::randperm(n, g, at::kLong)));
      used[e].narrow(0, 0, n).fill_(1.0);
    }
    index_.select(1, i).fill_(first);
    index_.select(1, i).narrow(0, 0, epochs * per_epoch).copy_(order.view({epochs * per_epoch, b}));
    mask_.select(1, i).narrow(0, 0, epochs * per_epoch).copy_(used.view({epochs * per_epoch, b}));
    if (augmentation_) {
      at::Tensor drawn = draws_.select(1, i).narrow(0, 0, epochs * per_epoch);
      drawn.narrow(2, 0, 2).copy_(at::randint(0, 2 * augmentation_->pad + 1, {epochs * per_epoch, b, 2}, g, at::kLong));
      if (augmentation_->flip) drawn.narrow(2, 2, 1).copy_(at::randint(0, 2, {epochs * per_epoch, b, 1}, g, at::kLong));
    }
    offset += n;
  }
  if (pool != nullptr) {
    x_ = pool->x;
    y_ = pool->y;
  } else {
    std::vector<at::Tensor> xs, ys;
    for (const Examples& c : clients) {
      xs.push_back(c.x);
      ys.push_back(c.y);
    }
    if (k == 0) {
      // No examples, shaped like everyone's.
      const Examples& like = data.test().size() > 0 ? data.test() : data.client(0);
      xs.push_back(like.x.narrow(0, 0, 0));
      ys.push_back(like.y.narrow(0, 0, 0));
    }
    // One client's examples are read where they lie (cat would copy them).
    const auto joined = [](const std::vector<at::Tensor>& parts) { return parts.size() == 1 ? parts[0] : at::cat(parts); };
    x_ = joined(xs);
    y_ = joined(ys);
  }
  // Masks and counts weigh losses: float, in the inputs' precision when those are floats.
  const at::ScalarType weight_type = x_.is_floating_point() ? x_.scalar_type() : at::kFloat;
  mask_ = mask_.to(weight_type);
  counts_ = mask_.sum(2);
  // Real slots lead each client's row of a step (the shuffled order fills slots from the start).
  const auto per_step = [](const at::Tensor& t) {
    const at::Tensor n = t.to(at::kLong).contiguous();
    return std::vector<int64_t>(n.data_ptr<int64_t>(), n.data_ptr<int64_t>() + n.numel());
  };
  if (k > 0) {  // else there is no step
    widths_ = per_step(counts_.amax(1));
    fewest_ = per_step(counts_.amin(1));
    real_ = per_step(counts_.sum(1));
  }
  examples_ = at::tensor(sizes, at::kLong).to(weight_type);
}

at::Tensor ClientBatches::client_steps() const { return (counts_ > 0).to(counts_.scalar_type()).sum(0); }

Batch ClientBatches::gather(const at::Tensor& index, const at::Tensor& mask, const at::Tensor& draws) const {
  const auto shape = [&](const at::Tensor& t) {
    std::vector<int64_t> out(index.sizes().begin(), index.sizes().end());
    out.insert(out.end(), t.sizes().begin() + 1, t.sizes().end());
    return out;
  };
  const at::Tensor flat = index.reshape({-1});
  // Rows gathered from a matrix (a view when x_ is contiguous): LibTorch's index_select copies the
  // rows of a 2-D tensor several times faster than the same bytes as rows of a 4-D one.
  const at::Tensor rows = x_.dim() > 2 && x_.is_contiguous() ? x_.flatten(1) : x_;
  at::Tensor x = rows.index_select(0, flat).view(shape(x_));
  if (augmentation_) x = augment_images(x, draws, *augmentation_);
  return {x, y_.index_select(0, flat).view(shape(y_)), mask};
}

namespace {
// The rows of `t` (clients on dimension `dim`) of chunk positions `clients`; undefined: all.
at::Tensor of_clients(const at::Tensor& t, int64_t dim, const at::Tensor& clients) {
  return clients.defined() ? t.index_select(dim, clients) : t;
}
}  // namespace

Batch ClientBatches::batch(int64_t step, const at::Tensor& clients) const {
  const int64_t width = widths_.at(step);
  return gather(of_clients(index_[step], 0, clients).narrow(1, 0, width),
                of_clients(mask_[step], 0, clients).narrow(1, 0, width),
                augmentation_ ? of_clients(draws_[step], 0, clients).narrow(1, 0, width) : at::Tensor());
}

Batch ClientBatches::batches(int64_t first, int64_t count, const at::Tensor& clients) const {
  const int64_t k = clients.defined() ? clients.size(0) : this->clients();
  const int64_t rows = count * batch_size();
  // [count, k, B] -> [k, count * B]: each client's steps back to back.
  const auto back_to_back = [&](const at::Tensor& t, std::vector<int64_t> shape) {
    return of_clients(t.narrow(0, first, count), 1, clients).transpose(0, 1).reshape(shape);
  };
  return gather(back_to_back(index_, {k, rows}), back_to_back(mask_, {k, rows}),
                augmentation_ ? back_to_back(draws_, {k, rows, 3}) : at::Tensor());
}

namespace {
std::atomic<int64_t> computed_rows{0};
std::atomic<int64_t> real_rows{0};

// The clients of a chunk still training. A client's steps are the chunk's first ones, so once they
// are over it leaves: its rows of the trained tensors are set aside as final, and the steps go on
// with the others' rows only (the rows of a batched product do not depend on one another, so this
// changes no bit of theirs).
class LiveClients {
 public:
  explicit LiveClients(const ClientBatches& batches) {
    const at::Tensor steps = batches.client_steps().to(at::kLong).contiguous();
    steps_.assign(steps.data_ptr<int64_t>(), steps.data_ptr<int64_t>() + steps.numel());
    for (int64_t i = 0; i < static_cast<int64_t>(steps_.size()); ++i) live_.push_back(i);
  }

  // Before step `s`: whether clients left since the last call; then each live tensor goes
  // through retire().
  bool leave(int64_t s) {
    std::vector<int64_t> keep, drop;
    for (int64_t j = 0; j < static_cast<int64_t>(live_.size()); ++j) (steps_[live_[j]] > s ? keep : drop).push_back(j);
    if (drop.empty()) return false;
    leaving_ = at::tensor(drop, at::kLong);
    leaving_positions_ = clients_.defined() ? clients_.index_select(0, leaving_) : leaving_;
    keep_ = at::tensor(keep, at::kLong);
    std::vector<int64_t> still;
    for (int64_t j : keep) still.push_back(live_[j]);
    live_ = std::move(still);
    clients_ = at::tensor(live_, at::kLong);
    return true;
  }

  // The rows of `t` (a live tensor) of the clients still training. With `name`, the rows of the
  // clients leaving are that leaf's final rows.
  at::Tensor retire(const at::Tensor& t, const std::string& name = {}) {
    if (!name.empty()) {
      at::Tensor& out = final_[name];
      if (!out.defined()) out = t.detach();  // every client was live: t holds each row
      else out.index_copy_(0, leaving_positions_, t.detach().index_select(0, leaving_));
    }
    return t.index_select(0, keep_);
  }

  // The chunk positions of the clients still training; undefined while they all are.
  const at::Tensor& clients() const { return clients_; }
  int64_t size() const { return static_cast<int64_t>(live_.size()); }

  // Every client's final rows: `live`'s (the clients still training) and those set aside.
  TensorTree result(const TensorTree& live) {
    TensorTree out;
    for (const auto& [name, t] : live) {
      auto it = final_.find(name);
      out.set(name, it == final_.end() ? t.detach() : it->second.index_copy_(0, clients_, t.detach()));
    }
    return out;
  }

 private:
  std::vector<int64_t> steps_;  // per client of the chunk
  std::vector<int64_t> live_;   // chunk positions
  at::Tensor clients_, keep_, leaving_, leaving_positions_;
  std::map<std::string, at::Tensor> final_;
};

// One step of a chunk: each client's objective (the masked mean cross-entropy of its batch) and
// step size, [k] each.
struct Step {
  at::Tensor objective;
  at::Tensor rates;
};

// Steps the chunk's clients and keeps their running mean training loss over the examples seen.
// What depends only on the step's counts (the objective's divisor, the rates, whether a step has
// any unused slot) is worked out once for all steps.
class StepTracker {
 public:
  StepTracker(const Model& model, const ClientBatches& batches, const at::Tensor& step_size)
      : model_(model),
        divisor_(batches.counts().clamp_min(1.0).unbind(0)),
        // A client whose steps are over (no real example in a step) does not move. Unbound in one
        // node: the rates' gradient (to a learned step size) is then gathered once, not step by step.
        rates_((step_size * (batches.counts() > 0).to(batches.counts().scalar_type())).unbind(0)),
        sum_(at::zeros({batches.clients()}, batches.examples().options())),
        seen_(batches.counts().sum(0)),
        batches_(batches) {}

  // Step `s`, whose batch is `batch`, of the chunk's clients `clients` (undefined: all).
  Step step(int64_t s, const at::Tensor& logits, const Batch& batch, const at::Tensor& clients) {
    const at::Tensor losses = per_example(model_.loss(logits, batch.y), 2);
    // Every slot real: the mask is all ones, and multiplying by it would change no bit.
    const at::Tensor total = (batches_.fewest(s) == batch.mask.size(1) ? losses : losses * batch.mask).sum(1);
    if (clients.defined()) sum_.index_add_(0, clients, total.detach());
    else sum_ += total.detach();
    computed_rows.fetch_add(batch.mask.numel(), std::memory_order_relaxed);
    real_rows.fetch_add(batches_.real(s), std::memory_order_relaxed);
    return {total / of_clients(divisor_.at(s), 0, clients), of_clients(rates_.at(s), 0, clients)};
  }
  at::Tensor mean() const { return sum_ / seen_.clamp_min(1.0); }

 private:
  const Model& model_;
  std::vector<at::Tensor> divisor_, rates_;  // per step, [k]
  at::Tensor sum_, seen_;
  const ClientBatches& batches_;
};

// Per-client `rates` [k] shaped [k, 1, ...] to scale `like` [k, ...], in its dtype (a float64 rate
// must not promote float32 parameters).
at::Tensor per_row(const at::Tensor& rates, const at::Tensor& like) {
  std::vector<int64_t> shape(like.dim(), 1);
  shape[0] = rates.size(0);
  return rates.view(shape).to(like.scalar_type());
}

// Nothing differentiates through the steps: the leaves move in place, one fused kernel a tensor
// and no new buffers (p - s * g rounds the same as p + (-1 * s) * g).
void sgd_in_place(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads, const at::Tensor& rates) {
  at::NoGradGuard no_grad;
  // The rates shaped once per parameter rank and type (a model's weights share one, its biases another).
  std::map<std::pair<int64_t, at::ScalarType>, at::Tensor> shaped;
  for (size_t j = 0; j < params.size(); ++j) {
    at::Tensor& r = shaped[{params[j].dim(), params[j].scalar_type()}];
    if (!r.defined()) r = per_row(rates, params[j]);
    params[j].addcmul_(r, grads[j], -1);
  }
}

// The leaves local SGD steps: all but the model's buffers, in tree order.
std::vector<at::Tensor> trained_leaves(const Model& model, const TensorTree& params) {
  std::vector<at::Tensor> out;
  for (const auto& [name, t] : params)
    if (!model.is_buffer(name)) out.push_back(t);
  return out;
}

// The directions SGD with weight decay and momentum steps along (LocalSgdOptions::momentum), from
// the gradients; `velocity` carries the momentum from step to step (empty before the first). In
// place unless the steps stay differentiable.
std::vector<at::Tensor> momentum_directions(const std::vector<at::Tensor>& params, std::vector<at::Tensor> grads,
                                            std::vector<at::Tensor>& velocity, const LocalSgdOptions& options) {
  const bool in_place = !options.create_graph;
  at::AutoGradMode graph(options.create_graph);
  for (size_t j = 0; j < grads.size(); ++j) {
    if (options.weight_decay != 0.0) {
      const at::Tensor p = in_place ? params[j].detach() : params[j];
      grads[j] = in_place ? grads[j].add_(p, options.weight_decay) : grads[j] + options.weight_decay * p;
    }
  }
  if (options.momentum == 0.0) return grads;
  if (velocity.empty()) {
    // v = g at the first step, its own buffer when later steps update it in place.
    for (const at::Tensor& g : grads) velocity.push_back(in_place ? g.clone() : g);
    return velocity;
  }
  for (size_t j = 0; j < grads.size(); ++j)
    velocity[j] = in_place ? velocity[j].mul_(options.momentum).add_(grads[j])
                           : velocity[j] * options.momentum + grads[j];
  return velocity;
}

// The gradients of a step's summed per-client objectives: clients are independent, so the
// gradient of the sum holds each client's own gradient.
std::vector<at::Tensor> client_gradients(const at::Tensor& per_client, const std::vector<at::Tensor>& inputs,
                                         bool create_graph) {
  return torch::autograd::grad({per_client.sum()}, inputs, {}, create_graph, create_graph);
}

// Whether clients may leave their chunk: not while a graph runs through the steps (their rows stay
// connected to the start), nor with buffers the forward pass updates (BatchNorm's statistics move
// on a client's masked steps too, and leaving would change them).
bool may_leave(const Model& model, const TensorTree& start, bool create_graph) {
  if (create_graph) return false;
  for (const auto& [name, t] : start)
    if (model.is_buffer(name)) return false;
  return true;
}

// The leaves of `params` for the clients still training (LiveClients::leave), trained leaves
// ready to differentiate again.
TensorTree retire_leaves(const Model& model, LiveClients& live, const TensorTree& params) {
  TensorTree out;
  for (const auto& [name, t] : params) out.set(name, live.retire(t.detach(), name).requires_grad_(!model.is_buffer(name)));
  return out;
}

// local_sgd with the input layer in factored form (LocalSgdOptions::factor_input_layer): blocks of
// steps; in a block, z_s = (x_s W) + b_s - sum_{t<s in block} (x_s x_t^T) u_t with x = f(input),
// and at its end W -= X^T U. The other leaves (f's too) step through autograd as usual, from z.
LocalSgdResult factored_local_sgd(const Model& model, const InputLayer& layer, const ClientBatches& batches,
                                  const TensorTree& start, const at::Tensor& step_size, bool defer) {
  const int64_t b = batches.batch_size();
  at::Tensor w = start.at(layer.weight).detach();  // [k, d, h]
  bool w_owned = false;                             // start's rows are the caller's
  // With features known up front, w keeps every client's rows and the products read and update
  // those of the clients still training in place (gathering 40 MB at each leave cost more than the
  // block's update); learned features differentiate through w's product, which needs them gathered.
  const bool w_keeps_rows = !layer.learned_features;
  at::Tensor bias = start.at(layer.bias).detach().clone();
  FAX_CHECK(w.dim() == 3 && bias.dim() == 2, "{}: the input layer {} needs a clients axis", model.describe(),
            layer.weight);
  const int64_t d = w.size(1), h = w.size(2);
  // A block's Gram matrix costs about (its rows) / (2 h) of the products it saves.
  const int64_t block = std::max<int64_t>(1, h / (2 * b));
  TensorTree rest;
  for (const auto& [name, t] : start)
    if (name != layer.weight && name != layer.bias) rest.set(name, t.detach().clone().requires_grad_(!model.is_buffer(name)));
  std::vector<at::Tensor> inputs = trained_leaves(model, rest);
  StepTracker tracker(model, batches, step_size);
  LiveClients live(batches);
  const bool leaving = may_leave(model, start, false);
  std::optional<InputLayerFactors> factors;
  // f W for rows f [k, n, d]; clients that start from one broadcast W (a stride-0 clients axis)
  // share one product.
  const auto times_w = [&](const at::Tensor& f) {
    if (w.stride(0) == 0) return batched_matmul(f.reshape({-1, d}), w[0]).view({f.size(0), f.size(1), h});
    return w_keeps_rows && live.clients().defined() ? batched_matmul_rows(f, w, live.clients()) : batched_matmul(f, w);
  };
  for (int64_t first = 0; first < batches.steps(); first += block) {
    check_interrupt();
    // Clients leave between blocks (w's update needs a block's rows whole).
    if (leaving && live.leave(first)) {
      if (!w_keeps_rows) w = live.retire(w, layer.weight);
      bias = live.retire(bias, layer.bias);
      rest = retire_leaves(model, live, rest);
      inputs = trained_leaves(model, rest);
    }
    const int64_t k = live.size();
    const int64_t count = std::min(block, batches.steps() - first);
    const Batch rows = batches.batches(first, count, live.clients());
    // The block's features f(x): known up front when f only flattens (then so are their products
    // with W and their Gram matrix), else filled in step by step.
    const at::Tensor x = layer.learned_features ? at::empty({k, count * b, d}, w.options())
                                                : model.input_features(rest, rows.x);
    const at::Tensor xw = layer.learned_features ? at::Tensor() : times_w(x);
    const at::Tensor gram =
        layer.learned_features || count == 1 ? at::Tensor() : batched_matmul(x, x.transpose(1, 2));
    const at::Tensor u = at::empty({k, count * b, h}, w.options());
    for (int64_t j = 0; j < count; ++j) {
      const auto step_rows = [&](const at::Tensor& t) { return t.narrow(1, j * b, b); };
      const auto earlier = [&](const at::Tensor& t) { return t.narrow(1, 0, j * b); };
      at::Tensor z;
      if (!layer.learned_features) {
        z = step_rows(xw) + bias.unsqueeze(1);
        if (j > 0) z.sub_(batched_matmul(step_rows(gram).narrow(2, 0, j * b), earlier(u)));
        z.requires_grad_(true);
      } else {
        // f(x_s) depends on this step's parameters: its product and Gram rows join the graph.
        const at::Tensor f = model.input_features(rest, step_rows(rows.x));
        step_rows(x).copy_(f.detach());
        z = times_w(f) + bias.unsqueeze(1);
        if (j > 0) z = z - batched_matmul(batched_matmul(f, earlier(x).transpose(1, 2)), earlier(u));
      }
      const Step step = tracker.step(first + j, model.forward_from_input_layer(rest, z),
                                     {step_rows(rows.x), step_rows(rows.y), step_rows(rows.mask)}, live.clients());
      inputs.push_back(z);
      const auto grads = client_gradients(step.objective, inputs, false);
      inputs.pop_back();
      at::NoGradGuard no_grad;
      at::Tensor u_step = step_rows(u);
      at::mul_out(u_step, grads.back(), per_row(step.rates, grads.back()));
      bias.sub_(u_step.sum(1));
      sgd_in_place(inputs, grads, step.rates);
    }
    if (defer && count == batches.steps()) {
      factors = InputLayerFactors{layer.weight, x, u};
      break;
    }
    at::NoGradGuard no_grad;
    // Once w holds rows of its own (a block has ended), the next blocks update them in place.
    if (w_owned) {
      batched_matmul_add_(w, x.transpose(1, 2), u, -1.0, w_keeps_rows ? live.clients() : at::Tensor());
    } else {
      w = batched_matmul(x.transpose(1, 2), u, -1.0, w);
      w_owned = true;
    }
  }
  TensorTree params;  // in start's order
  for (const auto& [name, t] : start) {
    if (name == layer.weight) {
      if (!factors) params.set(name, w);
    } else {
      params.set(name, name == layer.bias ? bias : rest.at(name));
    }
  }
  return {live.result(params), tracker.mean(), factors};
}
}  // namespace

LocalSgdResult local_sgd(const Model& model, const ClientBatches& batches, const TensorTree& start,
                         const at::Tensor& lr, const LocalSgdOptions& options) {
  const int64_t k = batches.clients();
  const at::Tensor step_size = lr.dim() == 0 ? lr : lr.view({k});
  const std::optional<InputLayer> layer = model.input_layer();
  const bool plain_sgd = options.momentum == 0.0 && options.weight_decay == 0.0;
  if (options.factor_input_layer && !options.create_graph && !options.penalty && options.correction.empty() &&
      plain_sgd && layer)
    return factored_local_sgd(model, *layer, batches, start, step_size, options.defer_input_layer);
  // Without create_graph the steps update a copy of `start` in place; with it they stay connected
  // to `start` (and to the rate), and a start that carries no graph gets fresh leaves to differentiate.
  // The model's buffers are fresh copies the forward pass updates in place.
  TensorTree params;
  for (const auto& [name, t] : start) {
    if (model.is_buffer(name)) params.set(name, t.detach().clone());
    else if (!options.create_graph) params.set(name, t.detach().clone().requires_grad_(true));
    else params.set(name, t.requires_grad() ? t : t.detach().requires_grad_(true));
  }
  std::vector<at::Tensor> correction;  // per trained leaf, when options.correction is set
  if (!options.correction.empty()) {
    for (const auto& [name, t] : params) {
      if (model.is_buffer(name)) continue;
      FAX_CHECK(options.correction.contains(name), "{}: the local steps' correction has no leaf {}", model.describe(), name);
      correction.push_back(options.correction.at(name));
    }
  }
  StepTracker tracker(model, batches, step_size);
  LiveClients live(batches);
  const bool leaving = may_leave(model, start, options.create_graph);
  std::vector<at::Tensor> velocity;  // per leaf, with momentum
  for (int64_t s = 0; s < batches.steps(); ++s) {
    check_interrupt();
    if (leaving && live.leave(s)) {
      params = retire_leaves(model, live, params);
      for (at::Tensor& v : velocity) v = live.retire(v);
      for (at::Tensor& c : correction) c = live.retire(c);
    }
    const Batch batch = batches.batch(s, live.clients());
    const Step step = tracker.step(s, model.forward(params, batch.x), batch, live.clients());
    at::Tensor objective = step.objective;
    if (options.penalty) {
      // A penalty written for every client's rows would broadcast wrongly once some have left.
      const at::Tensor extra = options.penalty(params, live.clients());
      FAX_CHECK(extra.dim() == 1 && extra.size(0) == objective.size(0),
                "{}: the local steps' penalty returned a tensor of shape [{}] for {} clients still training (it gets "
                "their rows and chunk positions, and returns one value per row)",
                model.describe(), fmt::join(extra.sizes(), ", "), objective.size(0));
      objective = objective + extra;
    }
    const std::vector<at::Tensor> trained = trained_leaves(model, params);
    std::vector<at::Tensor> grads = client_gradients(objective, trained, options.create_graph);
    if (!plain_sgd) grads = momentum_directions(trained, std::move(grads), velocity, options);
    // Out of place: with momentum, grads are the velocity buffers.
    for (size_t j = 0; j < correction.size(); ++j) grads[j] = grads[j] + correction[j];
    if (!options.create_graph) {
      sgd_in_place(trained, grads, step.rates);
      continue;
    }
    std::vector<at::Tensor> next;
    size_t j = 0;
    for (const auto& [name, p] : params)
      next.push_back(model.is_buffer(name) ? p : p - per_row(step.rates, p) * grads[j++]);
    params = params.with_tensors(std::move(next));
  }
  return {options.create_graph ? params : live.result(params), tracker.mean(), std::nullopt};
}

RowSteps local_training_row_steps() {
  return {computed_rows.load(std::memory_order_relaxed), real_rows.load(std::memory_order_relaxed)};
}

}  // namespace fax
