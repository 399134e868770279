#include <fax/client_update.h>

#include <ATen/ATen.h>

namespace fax {
namespace {
// The loss, the kept flag and the extras ride along with the deltas in one clients value.
constexpr const char* kLoss = "__loss";
constexpr const char* kKept = "__kept";
const std::string kExtra = "__extra/";

// Per row: 1 when every value of every leaf of `rows` and `loss` is finite.
at::Tensor finite_rows(const TensorTree& rows, const at::Tensor& loss) {
  at::Tensor finite = at::isfinite(loss);
  for (const auto& [name, t] : rows) finite = finite & at::isfinite(t.detach()).flatten(1).all(1);
  return finite;
}

// Applies the non-finite policy to a chunk's results: stop, or zero the rows of dropped clients.
at::Tensor screen(const RoundContext& ctx, const ClientChunk& chunk, TensorTree& rows, at::Tensor& loss) {
  const at::Tensor finite = finite_rows(rows, loss);
  for (int64_t i = 0; i < chunk.size; ++i) {
    if (finite[i].item<bool>()) continue;
    const std::string who = describe_client(ctx.data, chunk.client_id(i));
    FAX_CHECK(ctx.nonfinite == NonFinite::drop,
              "round {}: the update of {} is not finite (NaN or Inf); set execution.nonfinite=drop to drop such "
              "clients instead",
              ctx.round + 1, who);
    warn(fmt::format("round {}: dropped {}: its update is not finite (NaN or Inf)", ctx.round + 1, who));
  }
  if (ctx.nonfinite == NonFinite::drop) {
    rows = rows.map([&](const at::Tensor& t) {
      std::vector<int64_t> shape(t.dim(), 1);
      shape[0] = t.size(0);
      return at::where(finite.view(shape), t, at::zeros_like(t));
    });
    loss = at::where(finite, loss, at::zeros_like(loss));
  }
  return finite.to(loss.scalar_type());
}
}  // namespace

std::vector<ConfigKey> client_training_keys() {
  return {positive_float_key("client_lr", "0.1", "client SGD learning rate"),
          int_key("local_epochs", "1", "passes over each client's data per round (E)", 1),
          int_key("batch_size", "10", "client minibatch size (B); 0: the whole local data set", 0)};
}

ClientTraining client_training(const Config& config) {
  ClientTraining t;
  t.epochs = config.get_int("algorithm.local_epochs");
  t.batch_size = config.get_int("algorithm.batch_size");
  t.lr = Server<at::Tensor>(at::scalar_tensor(config.get_float("algorithm.client_lr"), at::kDouble));
  return t;
}

Clients<at::Tensor> full_batch_losses(const RoundContext& ctx, const Clients<TensorTree>& params) {
  return map_clients([&](const ClientChunk& chunk, const TensorTree& rows) {
    const Batch b = ClientBatches(chunk, ctx.data, 1, 0).batch(0);
    const at::Tensor losses = per_example(cross_entropy(ctx.model.forward(rows, b.x), b.y), 2);
    return (losses * b.mask).sum(1) / b.mask.sum(1);
  }, params);
}

std::string describe_client(const FederatedDataset& data, int64_t client) {
  const std::string name = data.client_name(client);
  return name.empty() ? fmt::format("client {}", client) : fmt::format("client {} ({})", client, name);
}

ClientUpdates train_clients(const RoundContext& ctx, const Clients<TensorTree>& start, const ClientTraining& t) {
  const auto lr = broadcast(t.lr);
  const auto out = map_clients([&](const ClientChunk& chunk, const TensorTree& params, const at::Tensor& rates) {
    const ClientBatches batches(chunk, ctx.data, t.epochs, t.batch_size);
    LocalSgdOptions options = t.customize ? t.customize(chunk, params) : LocalSgdOptions{};
    options.create_graph = options.create_graph || t.create_graph;
    const LocalSgdResult local = local_sgd(ctx.model, batches, params, rates, options);
    TensorTree rows = sub(params, local.params);
    at::Tensor loss = local.loss;
    const at::Tensor kept = screen(ctx, chunk, rows, loss);
    rows.set(kLoss, loss);
    rows.set(kKept, kept);
    if (t.after) {
      for (const auto& [name, extra] : t.after(chunk, params, local.params, batches.client_steps()))
        rows.set(kExtra + name, extra);
    }
    return rows;
  }, start, lr);
  const TensorTree& all = out.value();
  TensorTree deltas;
  for (const auto& [name, rows] : all)
    if (name != kLoss && name != kKept && name.rfind(kExtra, 0) != 0) deltas.set(name, rows);
  const at::Tensor& kept = all.at(kKept);
  return {Clients<TensorTree>(std::move(deltas)), Clients<at::Tensor>(all.at(kLoss)),
          Clients<TensorTree>(unprefixed(all, kExtra)),
          Clients<at::Tensor>(ctx.example_counts().value().to(kept.scalar_type()) * kept), Clients<at::Tensor>(kept)};
}

RoundUpdate mean_client_update(const RoundContext& ctx, const TensorTree& params, const ClientTraining& training) {
  ClientUpdates local = train_clients(ctx, broadcast(Server<TensorTree>(params)), training);
  // Every executor sees the same total, so they all stop together.
  FAX_CHECK(sum(local.kept).value().item<double>() > 0, "round {}: every client's update was not finite", ctx.round + 1);
  TensorTree mean = weighted_mean(local.deltas, local.weights).value();
  return {std::move(local), std::move(mean)};
}

RoundMetrics round_metrics(const RoundContext& ctx, const RoundUpdate& update) {
  RoundMetrics metrics;
  metrics.server.set("train/loss", weighted_mean(update.local.losses, update.local.weights).value().detach());
  metrics.server.set("train/update_norm", squared_norm(update.mean).sqrt().detach());
  metrics.server.set("train/dropped_clients",
                     static_cast<double>(ctx.program.cohort_size()) - sum(update.local.kept).value().detach());
  metrics.clients.emplace_back("train_loss", Clients<at::Tensor>(update.local.losses.value().detach()));
  return metrics;
}

}  // namespace fax
