#include <fax/client_update.h>

#include <ATen/ATen.h>

namespace fax {
namespace {
// The loss and the extras ride along with the deltas in one clients value.
constexpr const char* kLoss = "__loss";
const std::string kExtra = "__extra/";
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

ClientUpdates train_clients(const RoundContext& ctx, const Clients<TensorTree>& start, const ClientTraining& t) {
  const auto lr = broadcast(t.lr);
  const auto out = map_clients([&](const ClientChunk& chunk, const TensorTree& params, const at::Tensor& rates) {
    const ClientBatches batches(chunk, ctx.data, t.epochs, t.batch_size);
    LocalSgdOptions options = t.customize ? t.customize(chunk, params) : LocalSgdOptions{};
    options.create_graph = options.create_graph || t.create_graph;
    const LocalSgdResult local = local_sgd(ctx.model, batches, params, rates, options);
    TensorTree rows = sub(params, local.params);
    rows.set(kLoss, local.loss);
    if (t.after) {
      for (const auto& [name, extra] : t.after(chunk, params, local.params, batches.client_steps()))
        rows.set(kExtra + name, extra);
    }
    return rows;
  }, start, lr);
  const TensorTree& all = out.value();
  TensorTree deltas;
  for (const auto& [name, rows] : all)
    if (name != kLoss && name.rfind(kExtra, 0) != 0) deltas.set(name, rows);
  return {Clients<TensorTree>(std::move(deltas)), Clients<at::Tensor>(all.at(kLoss)),
          Clients<TensorTree>(unprefixed(all, kExtra))};
}

RoundUpdate mean_client_update(const RoundContext& ctx, const TensorTree& params, const ClientTraining& training) {
  ClientUpdates local = train_clients(ctx, broadcast(Server<TensorTree>(params)), training);
  TensorTree mean = weighted_mean(local.deltas, ctx.example_counts()).value();
  return {std::move(local), std::move(mean)};
}

RoundMetrics round_metrics(const RoundContext& ctx, const RoundUpdate& update) {
  RoundMetrics metrics;
  metrics.server.set("train/loss", weighted_mean(update.local.losses, ctx.example_counts()).value().detach());
  metrics.server.set("train/update_norm", squared_norm(update.mean).sqrt().detach());
  metrics.clients.emplace_back("train_loss", Clients<at::Tensor>(update.local.losses.value().detach()));
  return metrics;
}

}  // namespace fax
