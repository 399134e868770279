#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <fax/base/settings.h>
#include <fax/train/algorithm.h>
#include <fax/train/local_training.h>

namespace fax {

/// The client half of FedAvg-style algorithms.
struct ClientTraining {
  int64_t epochs = 1;
  int64_t batch_size = 10;  ///< 0: the whole local data set
  double momentum = 0.0;      ///< LocalSgdOptions::momentum
  double weight_decay = 0.0;  ///< LocalSgdOptions::weight_decay
  /// The client learning rate, a server value (0-dim); broadcast to the clients so that gradients
  /// with respect to it are summed over every executor's clients (hypergradients).
  Server<at::Tensor> lr;
  /// Differentiate through the local steps (needed for gradients in lr or in the start point).
  bool create_graph = false;
  /// Per chunk, extra options for local_sgd (a penalty on the parameters: FedProx's proximal term,
  /// SCAFFOLD's correction), given the chunk and its clients' start rows.
  std::function<LocalSgdOptions(const ClientChunk&, const TensorTree& start)> customize;
  /// Per chunk, after training: sees the chunk, its start rows, trained rows and step counts
  /// ([k]) and may return extra per-client rows, gathered into ClientUpdates::extras (SCAFFOLD
  /// updates its control variates here and returns their change).
  std::function<TensorTree(const ClientChunk&, const TensorTree& start, const TensorTree& trained, const at::Tensor& steps)>
      after;
};

/// Algorithm::local_examples of an algorithm whose clients train this way: epochs x
/// ceil(n / B) steps of min(B, n) slots (B 0: the whole data set, one step an epoch).
int64_t local_examples(const ClientTraining& training, int64_t examples);

struct ClientUpdates {
  Clients<TensorTree> deltas;  ///< start - trained, one row per client
  Clients<at::Tensor> losses;  ///< mean training loss over the examples each client saw
  Clients<TensorTree> extras;  ///< what ClientTraining::after returned (empty without it)
  /// Example counts, 0 for a client dropped for a non-finite update (whose delta and loss are 0).
  Clients<at::Tensor> weights;
  /// 1 for a client that took part, 0 for a dropped one.
  Clients<at::Tensor> kept;
};

/// The settings of the client half, shared by FedAvg-style plugins (keys client_lr, local_epochs,
/// batch_size, client_momentum, weight_decay; include them in a plugin's table with
/// Settings::include).
struct ClientTrainingOptions {
  double client_lr = 0.1;
  int64_t local_epochs = 1;
  int64_t batch_size = 10;  ///< 0: the whole local data set
  double client_momentum = 0.0;
  double weight_decay = 0.0;
};
const Settings<ClientTrainingOptions>& client_training_settings();
/// The client half these options describe (lr as a 0-dim float64 server value).
ClientTraining client_training(const ClientTrainingOptions& options);

/// Each client's mean loss over its whole local data set at `params` (clients-placed), [clients];
/// differentiable in params, so its weighted mean is the federated loss whose gradient is FedSGD's.
/// The examples as they are: no augmentation.
Clients<at::Tensor> full_batch_losses(const RoundContext& ctx, const Clients<TensorTree>& params);

/// Local SGD for this executor's clients from `start` (clients-placed), in batched chunks. A client
/// whose update is not finite stops the run with fax::Error naming the round and client, or with
/// RoundContext::nonfinite = drop is dropped (weight 0) with a warning.
ClientUpdates train_clients(const RoundContext& ctx, const Clients<TensorTree>& start, const ClientTraining& training);

/// A FedAvg-style round's client half: the clients' updates and their example-weighted mean.
struct RoundUpdate {
  Clients<at::Tensor> losses;   ///< as in ClientUpdates
  Clients<at::Tensor> weights;  ///< as in ClientUpdates
  Clients<at::Tensor> kept;     ///< as in ClientUpdates
  TensorTree mean;  ///< sum(n_i delta_i) / sum(n_i): the server's pseudo-gradient
  TensorTree metrics;  ///< the aggregation pipeline's server metrics (0-dim), for round_metrics
  /// The client stages' statistics of this executor's clients (name -> [local clients], 0 for a
  /// dropped client), logged per client by round_metrics.
  TensorTree client_metrics;
};

/// broadcast(params) -> the client half -> weighted mean of the deltas by example count (dropped
/// clients weigh nothing; a round whose every client was dropped is an error), or what the
/// experiment's aggregation pipeline (RoundContext::aggregation, fax/train/aggregation.h) makes
/// of the updates. Streamed through
/// map_sum_clients: memory follows execution.vectorize, not the cohort; the same bits as
/// weighted_mean over train_clients. Without ClientTraining::after (it keeps no per-client rows).
RoundUpdate mean_client_update(const RoundContext& ctx, const TensorTree& params, const ClientTraining& training);
/// The same for clients that start from rows of their own (`start`, clients-placed: asynchronous
/// training's clients start from the model version they were dispatched with; `params`, the
/// server's, gives the leaves and their order), each client's update scaled, after the client
/// stages, by its `factor` in [0, 1] (a staleness weight). The mean still divides by the unscaled
/// weights, so a stale update moves the model less.
RoundUpdate mean_client_update(const RoundContext& ctx, const Clients<TensorTree>& start, const TensorTree& params,
                               const ClientTraining& training, const Clients<at::Tensor>& factors);

/// How an asynchronous algorithm weighs an update by its staleness tau (server steps since its
/// client's model version), after Xie et al. 2019: constant 1; polynomial (1 + tau)^-a (FedBuff's
/// 1 / sqrt(1 + tau) at a = 0.5); hinge 1 up to b steps, then 1 / (a (tau - b) + 1). Keys
/// staleness, staleness_a, staleness_b (include them with Settings::include).
struct StalenessOptions {
  std::string staleness = "polynomial";
  double staleness_a = 0.5;
  double staleness_b = 4;
};
const Settings<StalenessOptions>& staleness_settings();
/// s(tau), in (0, 1].
double staleness_weight(const StalenessOptions& options, int64_t tau);
/// s(tau) of this executor's clients (RoundContext::async), [local clients].
Clients<at::Tensor> staleness_factors(const RoundContext& ctx, const StalenessOptions& options);
/// Where this executor's clients start in an asynchronous step: each its row of
/// RoundContext::async's versions, taken from their broadcast.
Clients<TensorTree> async_start(const RoundContext& ctx);

/// The metrics FedAvg-style plugins report: train/loss (example-weighted mean of the clients'
/// training losses), train/update_norm (|mean update|), train/dropped_clients and the per-client
/// train_loss; and the aggregation pipeline's metrics.
RoundMetrics round_metrics(const RoundContext& ctx, const RoundUpdate& update);

}  // namespace fax
