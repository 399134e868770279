#include <fax/train/client_update.h>

#include <cmath>
#include <optional>
#include <string>

#include <ATen/ATen.h>

#include <fax/nn/layers.h>

namespace fax {
namespace {
// The loss, the kept flag and the extras ride along with the deltas in one clients value, under
// reserved names: all begin with "__".
constexpr const char* kLoss = "__loss";
constexpr const char* kKept = "__kept";
constexpr const char* kWeight = "__weight";
const std::string kExtra = "__extra/";
// The input layer's factors (LocalSgdOptions::defer_input_layer), screened like the deltas.
const std::string kFactorX = "__factors/x";
const std::string kFactorU = "__factors/u";

// Applies the non-finite policy to a chunk's results: stop, or zero the rows of dropped clients.
at::Tensor screen(const RoundContext& ctx, const ClientChunk& chunk, TensorTree& rows, at::Tensor& loss) {
  const at::Tensor finite = at::isfinite(loss) & finite_rows(rows);
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

const Settings<ClientTrainingOptions>& client_training_settings() {
  using O = ClientTrainingOptions;
  static const Settings<O> table = Settings<O>()
      .add("client_lr", &O::client_lr, "client SGD learning rate", positive())
      .add("local_epochs", &O::local_epochs, "passes over each client's data per round (E)", at_least(1))
      .add("batch_size", &O::batch_size, "client minibatch size (B); 0: the whole local data set", at_least(0))
      .add("client_momentum", &O::client_momentum, "client SGD momentum (torch.optim.SGD's; reset every round)",
           in(0, 1))
      .add("weight_decay", &O::weight_decay, "client L2 weight decay (added to the gradient)", at_least(0));
  return table;
}

int64_t local_examples(const ClientTraining& training, int64_t examples) {
  if (examples == 0) return 0;
  const int64_t batch = training.batch_size == 0 ? examples : std::min(training.batch_size, examples);
  return training.epochs * ((examples + batch - 1) / batch) * batch;
}

ClientTraining client_training(const ClientTrainingOptions& options) {
  ClientTraining t;
  t.epochs = options.local_epochs;
  t.batch_size = options.batch_size;
  t.momentum = options.client_momentum;
  t.weight_decay = options.weight_decay;
  t.lr = Server<at::Tensor>(at::scalar_tensor(options.client_lr, at::kDouble));
  return t;
}

Clients<at::Tensor> full_batch_losses(const RoundContext& ctx, const Clients<TensorTree>& params) {
  return map_clients([&](const ClientChunk& chunk, const TensorTree& rows) {
    if (chunk.size == 0) {
      // No losses, computed from the parameters all the same: a derivative reaches them, so this
      // executor takes part in the backward pass's collectives too.
      at::Tensor none = rows.tensors().front();
      while (none.dim() > 1) none = none.sum(-1);
      return none;
    }
    const Batch b = ClientBatches(chunk, ctx.data, 1, 0, /*augment=*/false).batch(0);
    const at::Tensor losses = per_example(ctx.model.loss(ctx.model.forward(rows, b.x), b.y), 2);
    return (losses * b.mask).sum(1) / b.mask.sum(1);
  }, params);
}

std::string describe_client(const FederatedDataset& data, int64_t client) {
  const std::string name = data.client_name(client);
  return name.empty() ? fmt::format("client {}", client) : fmt::format("client {} ({})", client, name);
}

namespace {

// One chunk of the client half: local SGD from `params`, the deltas, then the non-finite screen;
// the loss, the kept flag, the extras and, with `defer`, the input layer's factors (instead of its
// delta) ride along as reserved leaves.
TensorTree train_chunk(const RoundContext& ctx, const ClientTraining& t, const ClientChunk& chunk,
                       const TensorTree& params, const at::Tensor& rates, bool defer) {
  const ClientBatches batches(chunk, ctx.data, t.epochs, t.batch_size);
  LocalSgdOptions options = t.customize ? t.customize(chunk, params) : LocalSgdOptions{};
  options.create_graph = options.create_graph || t.create_graph;
  options.momentum = t.momentum;
  options.weight_decay = t.weight_decay;
  options.factor_input_layer = options.factor_input_layer && ctx.factor_input_layer;
  options.defer_input_layer = defer;
  const LocalSgdResult local = local_sgd(ctx.model, batches, params, rates, options);
  TensorTree rows;
  for (const auto& [name, p] : params)
    if (local.params.contains(name)) rows.set(name, p - local.params.at(name));
  if (local.input_factors) {
    rows.set(kFactorX, local.input_factors->x);
    rows.set(kFactorU, local.input_factors->u);
  }
  at::Tensor loss = local.loss;
  const at::Tensor kept = screen(ctx, chunk, rows, loss);
  rows.set(kLoss, loss);
  rows.set(kKept, kept);
  if (t.after) {
    for (const auto& [name, extra] : t.after(chunk, params, local.params, batches.client_steps()))
      rows.set(kExtra + name, extra);
  }
  return rows;
}

// The model leaves of `rows` (no reserved leaf), but `skip`.
TensorTree deltas_of(const TensorTree& rows, const std::string& skip = "") {
  TensorTree deltas;
  for (const auto& [name, t] : rows)
    if (name.rfind("__", 0) != 0 && name != skip) deltas.set(name, t);
  return deltas;
}

// A chunk's sum over clients of the input layer's weighted deltas w_i (W_0 - W_i): from the
// factors, sum_i w_i X_i^T U_i = X^T (w U) over all the chunk's rows, one product; else the
// weighted rows added in order.
at::Tensor input_layer_sum(const TensorTree& trained, const std::string& weight, const at::Tensor& weights) {
  if (!trained.contains(kFactorX)) return detail::add_rows({}, TensorTree{{weight, trained.at(weight)}}, weights).at(weight);
  const at::Tensor& x = trained.at(kFactorX);
  const at::Tensor& u = trained.at(kFactorU);
  const at::Tensor weighted_u = u * weights.view({-1, 1, 1}).to(u.scalar_type());
  return batched_matmul(x.reshape({-1, x.size(2)}).t(), weighted_u.reshape({-1, u.size(2)}));
}

}  // namespace

ClientUpdates train_clients(const RoundContext& ctx, const Clients<TensorTree>& start, const ClientTraining& t) {
  const auto lr = broadcast(t.lr);
  const auto out = map_clients([&](const ClientChunk& chunk, const TensorTree& params, const at::Tensor& rates) {
    return train_chunk(ctx, t, chunk, params, rates, false);
  }, start, lr);
  const TensorTree& all = out.value();
  const at::Tensor& kept = all.at(kKept);
  return {Clients<TensorTree>(deltas_of(all)), Clients<at::Tensor>(all.at(kLoss)),
          Clients<TensorTree>(unprefixed(all, kExtra)),
          Clients<at::Tensor>(ctx.example_counts().value().to(kept.scalar_type()) * kept), Clients<at::Tensor>(kept)};
}

namespace {

// The round's statistics of the client stages (Aggregation::client_side) ride along under this
// prefix, summed, then divided by the number of clients kept.
const std::string kStat = "__stat/";
// The pipeline's server state inside ServerState::extra.
const std::string kAggregationState = "aggregation/";

// The aggregation's server metrics from the summed statistics.
TensorTree stat_metrics(const TensorTree& sums, const at::Tensor& kept) {
  TensorTree metrics;
  // None kept (a round without clients): NaN, no statistic.
  for (const auto& [name, t] : unprefixed(sums, kStat)) metrics.set(name, (t / kept).detach());
  return metrics;
}

// The pipeline's next server state from the summed statistics, once this round's stages used it.
void advance_state(const RoundContext& ctx, const Aggregation& aggregation, const TensorTree& sums,
                   const at::Tensor& kept, TensorTree& metrics) {
  if (ctx.aggregation_state == nullptr) return;
  FAX_CHECK(!ctx.state_advanced || !aggregation.stateful(),
            "round {}: mean_client_update ran twice in one round with aggregation {}, whose server state (and its "
            "privacy ledger) advances once a round", ctx.round + 1, aggregation.describe());
  ctx.state_advanced = true;
  *ctx.aggregation_state = aggregation.next_state(*ctx.aggregation_state, detach(unprefixed(sums, kStat)),
                                                  kept.item<double>(), ctx.program.seed(), ctx.round,
                                                  ctx.nominal_cohort(), metrics);
}

const TensorTree& pipeline_state(const RoundContext& ctx, const Aggregation& aggregation) {
  static const TensorTree none;
  if (ctx.aggregation_state != nullptr) return *ctx.aggregation_state;
  FAX_CHECK(!aggregation.stateful(),
            "aggregation {}: the pipeline keeps server state across rounds (adaptive clipping), which this round "
            "was not given: run the algorithm through fax::aggregated_round", aggregation.describe());
  return none;
}

// mean_client_update with a robust aggregator: every kept update, after the client stages, is
// gathered to every executor, which all compute the same statistic.
RoundUpdate gathered_update(const RoundContext& ctx, const Clients<TensorTree>& start, const TensorTree& params,
                            const ClientTraining& training, const Aggregation& aggregation,
                            const Clients<at::Tensor>& factors) {
  FAX_CHECK(!training.create_graph,
            "aggregation {}: a robust aggregator has no derivative to take; federated AD through the round (e.g. "
            "hypergrad_fedavg) needs a sum-based pipeline", aggregation.describe());
  const ClientUpdates local = train_clients(ctx, start, training);
  const TensorTree& state = pipeline_state(ctx, aggregation);
  const auto sent = map_clients([&](const ClientChunk& chunk, const TensorTree& deltas, const at::Tensor& kept,
                                    const at::Tensor& factor) {
    TensorTree stats;
    TensorTree rows = scale_rows(aggregation.client_side(chunk, deltas, kept, ctx.client_states, state, stats), factor);
    for (const auto& [name, t] : stats) rows.set(kStat + name, t * kept.to(t.scalar_type()));
    return rows;
  }, local.deltas, local.kept, factors);
  const at::Tensor kept = collect(local.kept).value();
  const at::Tensor which = kept.nonzero().view({-1});
  FAX_CHECK(which.numel() > 0, "round {}: every client's update was not finite", ctx.round + 1);
  TensorTree gathered;
  for (const auto& [name, p] : params)
    gathered.set(name, collect(Clients<at::Tensor>(sent.value().at(name))).value().index_select(0, which));
  RoundUpdate update{local.losses, local.weights, local.kept, aggregation.aggregate(gathered, ctx.round), {}, {}};
  update.client_metrics = unprefixed(sent.value(), kStat);
  const TensorTree stats = prefixed(update.client_metrics, kStat);
  if (!stats.empty()) {
    const TensorTree sums = sum(Clients<TensorTree>(stats)).value();
    update.metrics = stat_metrics(sums, kept.sum());
    advance_state(ctx, aggregation, sums, kept.sum(), update.metrics);
  }
  return update;
}

}  // namespace

RoundUpdate mean_client_update(const RoundContext& ctx, const TensorTree& params, const ClientTraining& training) {
  const auto start = broadcast(Server<TensorTree>(params));
  return mean_client_update(ctx, start, params, training, Clients<at::Tensor>(at::ones({ctx.program.local_size()})));
}

RoundUpdate mean_client_update(const RoundContext& ctx, const Clients<TensorTree>& start, const TensorTree& params,
                               const ClientTraining& training, const Clients<at::Tensor>& factors) {
  FAX_CHECK(!training.after, "mean_client_update keeps no per-client rows: use train_clients for ClientTraining::after");
  static const Aggregation plain_mean;
  const Aggregation& aggregation = ctx.aggregation != nullptr ? *ctx.aggregation : plain_mean;
  ctx.aggregated = true;
  FAX_CHECK(!training.create_graph || aggregation.differentiable(),
            "aggregation {}: compression has no derivative to take; federated AD through the round (e.g. "
            "hypergrad_fedavg) needs a pipeline without quantize, top_k or random_k", aggregation.describe());
  if (aggregation.gathers()) return gathered_update(ctx, start, params, training, aggregation, factors);
  const bool plain = aggregation.plain();
  const TensorTree& state = pipeline_state(ctx, aggregation);
  const auto lr = broadcast(training.lr);
  // Streamed: each chunk's weighted deltas join the running sum, so memory follows the chunk size.
  // A model's input layer weight is summed per chunk (from local SGD's factors when it has them),
  // every other leaf row by row with weighted_mean's products and adds. Client stages need every
  // update whole, so with them the input layer is an ordinary leaf.
  const std::optional<InputLayer> input = plain ? ctx.model.input_layer() : std::nullopt;
  const std::string input_weight = input ? input->weight : "";
  // secure_sum's range is in units of updates: a weight is a client's example count over the
  // cohort's mean count (public once the counts are summed), so the sum is of n updates' size.
  const double secure_scale =
      aggregation.secure() && !aggregation.uniform()
          ? static_cast<double>(ctx.program.cohort_size()) / sum(ctx.example_counts()).value().item<double>()
          : 1.0;
  const MappedSum out = map_sum_clients(
      [&](const ClientChunk& chunk, const TensorTree& rows, const at::Tensor& rates, const at::Tensor& counts,
          const at::Tensor& factor) {
        const TensorTree trained = train_chunk(ctx, training, chunk, rows, rates, input.has_value());
        const at::Tensor& kept = trained.at(kKept);
        const at::Tensor examples = counts.to(kept.scalar_type()) * kept;
        const at::Tensor weights = aggregation.uniform() ? kept : secure_scale == 1.0 ? examples : examples * secure_scale;
        // The factors scale the updates, not the divisor: a stale update moves the model less.
        const at::Tensor scaled = weights * factor.to(weights.scalar_type());
        TensorTree stats;
        const TensorTree deltas = plain ? deltas_of(trained, input_weight)
                                        : aggregation.client_side(chunk, deltas_of(trained), kept,
                                                                  ctx.client_states, state, stats);
        ChunkRows result;
        if (aggregation.secure()) {
          result.sum = aggregation.send(chunk, scale_rows(deltas, scaled), stats);
        } else {  // sent as they are: weighted as they join the sum
          result.weighted = deltas;
          result.weights = scaled;
        }
        if (input) result.summed.set(input_weight, input_layer_sum(trained, input_weight, scaled));
        result.sum.set(kWeight, weights);
        if (!stats.empty()) result.sum.set(kKept, kept);
        for (const auto& [name, t] : stats) {
          result.sum.set(kStat + name, t * kept.to(t.scalar_type()));
          result.keep.set(kStat + name, t * kept.to(t.scalar_type()));
        }
        result.keep.set(kLoss, trained.at(kLoss));
        result.keep.set(kKept, kept);
        result.keep.set(kWeight, examples);
        return result;
      },
      start, lr, ctx.example_counts(), factors);
  TensorTree sums = out.sum.value();
  const at::Tensor total = sums.at(kWeight);
  // Every executor sees the same total, so they all stop together. A round without clients
  // (Poisson sampling) runs only to release a private sum's noise, and has none.
  const bool nobody = ctx.program.cohort_size() == 0;
  FAX_CHECK(nobody || total.item<double>() > 0, "round {}: every client's update was not finite", ctx.round + 1);
  const TensorTree& keep = out.keep.value();
  RoundUpdate update{Clients<at::Tensor>(keep.at(kLoss)), Clients<at::Tensor>(keep.at(kWeight)),
                     Clients<at::Tensor>(keep.at(kKept)), {}, {}, unprefixed(keep, kStat)};
  if (sums.contains(kKept)) update.metrics = stat_metrics(sums, sums.at(kKept));
  const TensorTree summed = aggregation.receive(sums, params, update.metrics);  // in the model's order
  if (aggregation.uniform()) {
    // Each kept client counted once; the noised sum over the cohort size drawn for, which does not
    // depend on who was kept or sampled (a data-dependent denominator would leak).
    const int64_t n = ctx.nominal_cohort();
    update.mean = scale(aggregation.server_side(summed, ctx.program.seed(), ctx.round, n, ctx.data.num_clients(),
                                                state, update.metrics), 1.0 / static_cast<double>(n));
  } else {
    // Nobody's mean moves nothing (not 0 / 0).
    for (const auto& [name, t] : summed) update.mean.set(name, nobody ? at::zeros_like(t) : t / total);
  }
  if (sums.contains(kKept)) advance_state(ctx, aggregation, sums, sums.at(kKept), update.metrics);
  return update;
}

const Settings<StalenessOptions>& staleness_settings() {
  using O = StalenessOptions;
  static const Settings<O> table = Settings<O>()
      .add("staleness", &O::staleness,
           "how an update is weighed by its staleness tau: constant 1, polynomial (1 + tau)^-a, hinge 1 up to b "
           "then 1 / (a (tau - b) + 1)", one_of({"constant", "polynomial", "hinge"}))
      .add("staleness_a", &O::staleness_a, "a: the polynomial's exponent, the hinge's slope", in(0, 100))
      .add("staleness_b", &O::staleness_b, "b: the hinge's staleness before weights fall", at_least(0));
  return table;
}

double staleness_weight(const StalenessOptions& o, int64_t tau) {
  const double t = static_cast<double>(tau);
  if (o.staleness == "polynomial") return std::pow(1 + t, -o.staleness_a);
  if (o.staleness == "hinge") return t <= o.staleness_b ? 1.0 : 1 / (o.staleness_a * (t - o.staleness_b) + 1);
  return 1.0;
}

namespace {
const AsyncRound& async_round(const RoundContext& ctx) {
  FAX_CHECK(ctx.async != nullptr, "round {}: an asynchronous algorithm runs only on the simulated clock's "
            "asynchronous schedule (cohort.concurrency > 0)", ctx.round + 1);
  return *ctx.async;
}
}  // namespace

Clients<at::Tensor> staleness_factors(const RoundContext& ctx, const StalenessOptions& options) {
  const at::Tensor tau = ctx.program.local_rows(async_round(ctx).staleness).value();
  std::vector<double> factors;
  for (int64_t i = 0; i < tau.numel(); ++i) factors.push_back(staleness_weight(options, tau[i].item<int64_t>()));
  return Clients<at::Tensor>(at::tensor(factors, at::kDouble).view({-1}));
}

Clients<TensorTree> async_start(const RoundContext& ctx) {
  const AsyncRound& async = async_round(ctx);
  const std::vector<std::string> leaves = unprefixed(async.versions, "0/").names();
  const int64_t count = leaves.empty() ? 0 : static_cast<int64_t>(async.versions.size() / leaves.size());
  // One copy: each client's row taken from its version's broadcast (a view), stacked.
  return map_clients([&](const ClientChunk& chunk, const TensorTree& versions, const at::Tensor& row) {
    const at::Tensor j = row.to(at::kLong).contiguous();
    const int64_t* v = j.data_ptr<int64_t>();
    for (int64_t i = 0; i < chunk.size; ++i)
      FAX_CHECK(v[i] >= 0 && v[i] < count, "round {}: client {} starts from version {} of the step's {}", ctx.round + 1,
                chunk.client_id(i), v[i], count);
    TensorTree rows;
    for (const std::string& leaf : leaves) {
      std::vector<at::Tensor> parts;
      for (int64_t i = 0; i < chunk.size; ++i) parts.push_back(versions.at(fmt::format("{}/{}", v[i], leaf))[i]);
      rows.set(leaf, chunk.size > 0 ? at::stack(parts) : versions.at("0/" + leaf));
    }
    return rows;
  }, broadcast(Server<TensorTree>(async.versions)), ctx.program.local_rows(async.version));
}

RoundMetrics round_metrics(const RoundContext& ctx, const RoundUpdate& update) {
  RoundMetrics metrics;
  metrics.server.set("train/loss", weighted_mean(update.losses, update.weights).value().detach());
  metrics.server.set("train/update_norm", squared_norm(update.mean).sqrt().detach());
  metrics.server.set("train/dropped_clients",
                     static_cast<double>(ctx.program.cohort_size()) - sum(update.kept).value().detach());
  metrics.clients.emplace_back("train_loss", Clients<at::Tensor>(update.losses.value().detach()));
  for (const auto& [name, t] : update.metrics) metrics.server.set(name, t.detach());
  // Per client under the statistic's own name: aggregation/bits_sent -> /clients/bits_sent.
  for (const auto& [name, t] : update.client_metrics)
    metrics.clients.emplace_back(name.substr(name.rfind('/') + 1), Clients<at::Tensor>(t.detach()));
  return metrics;
}

namespace {
// An algorithm's own state must stay clear of the pipeline's.
void check_algorithm_keys(const TensorTree& extra) {
  for (const auto& [name, t] : extra)
    FAX_CHECK(name.rfind(kAggregationState, 0) != 0,
              "the algorithm's state has '{}', under '{}', which the aggregation pipeline keeps", name,
              kAggregationState);
}
}  // namespace

ServerState with_aggregation_state(ServerState state, const Aggregation& aggregation) {
  check_algorithm_keys(state.extra);
  state.extra = join({state.extra, prefixed(aggregation.initial_state(), kAggregationState)});
  return state;
}

void check_server_state(const Algorithm& algorithm, const ServerState& state, const Aggregation& aggregation,
                        const std::string& where) {
  aggregation.check_state(unprefixed(state.extra, kAggregationState), where);
  algorithm.check_state({state.params, without_prefix(state.extra, kAggregationState)}, where);
}

RoundMetrics aggregated_round(const Algorithm& algorithm, ServerState& state, RoundContext& ctx) {
  TensorTree pipeline = unprefixed(state.extra, kAggregationState);
  state.extra = without_prefix(state.extra, kAggregationState);
  ctx.aggregation_state = &pipeline;
  RoundMetrics metrics = algorithm.round(state, ctx);
  ctx.aggregation_state = nullptr;
  check_algorithm_keys(state.extra);
  state.extra = join({state.extra, prefixed(pipeline, kAggregationState)});
  return metrics;
}

}  // namespace fax
