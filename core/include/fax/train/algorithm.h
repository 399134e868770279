#pragma once

#include <string>
#include <utility>
#include <vector>

#include <fax/base/config.h>
#include <fax/base/tensor_tree.h>
#include <fax/nn/model.h>
#include <fax/spmd/client_states.h>
#include <fax/spmd/mesh.h>
#include <fax/spmd/placement.h>
#include <fax/train/aggregation.h>
#include <fax/train/dataset.h>

namespace fax {

/// What a federated algorithm carries from one round to the next, on the server.
struct ServerState {
  TensorTree params;  ///< the model's parameters
  TensorTree extra;   ///< anything else: optimizer moments, learned rates, ...
};

/// What to do with a client whose update is not finite (NaN or Inf): stop the run naming the round
/// and client, or drop the client from the round with a warning.
enum class NonFinite { stop, drop };

/// A server step of asynchronous training (Algorithm::asynchronous): its clients trained from
/// model versions older than the server's, and how much older. Cohort-ordered, like Cohort::ids.
struct AsyncRound {
  /// The versions the step's clients started from: the j-th (j = 0 .. V - 1) under "<j>/<param>".
  TensorTree versions;
  at::Tensor version;    ///< [N] int64: each client's j
  at::Tensor staleness;  ///< [N] int64: server steps since that version
};

/// What a round sees on one executor.
struct RoundContext {
  Program& program;                ///< this executor's clients, shards and random streams
  const Model& model;
  const FederatedDataset& data;
  int64_t round;
  /// State kept per client across rounds (read and write only this executor's clients).
  ClientStates& client_states;
  NonFinite nonfinite = NonFinite::stop;
  /// Local SGD steps a model's input layer in factored form (LocalSgdOptions::factor_input_layer).
  bool factor_input_layer = true;
  /// How the clients' updates are combined (mean_client_update); null: the plain weighted mean.
  const Aggregation* aggregation = nullptr;
  /// The pipeline's server state, which mean_client_update reads and advances (set by
  /// aggregated_round; null: the pipeline keeps none).
  TensorTree* aggregation_state = nullptr;
  /// Set once mean_client_update advanced that state: a second advance in the same round would
  /// move it twice and release its noised statistics twice, which the ledger does not charge.
  mutable bool state_advanced = false;
  /// Set by mean_client_update: the round went through the aggregation pipeline (an experiment
  /// with stages refuses an algorithm that combines its updates some other way).
  mutable bool aggregated = false;
  /// The cohort size the round was drawn for (cohort.size): with Poisson sampling the expected
  /// size, which a private sum is divided by and the ledger's sampling rate counts, whatever the
  /// draw gave (program.cohort_size(), maybe 0). 0: the realised size.
  int64_t drawn_cohort = 0;
  int64_t nominal_cohort() const { return drawn_cohort > 0 ? drawn_cohort : program.cohort_size(); }
  /// Set for an asynchronous algorithm: where each of the step's clients started (null otherwise).
  const AsyncRound* async = nullptr;
  /// The cohort weights of this executor's clients: their training example counts.
  Clients<at::Tensor> example_counts() const { return program.weights(); }
};

/// A round's metrics: server-placed scalars, and optionally one value per client.
struct RoundMetrics {
  TensorTree server;  ///< name -> 0-dim tensor, e.g. "train/loss"
  std::vector<std::pair<std::string, Clients<at::Tensor>>> clients;  ///< name -> [local clients]
};

/// A federated learning algorithm. fax-run creates one per run; `round` runs SPMD on every
/// executor at once, so it is const and must not keep per-round state in members.
class Algorithm {
 public:
  virtual ~Algorithm() = default;

  /// Reads the algorithm's settings ("algorithm.<key>", all declared by the plugin) and returns
  /// the state before round 0, given the model's initial parameters. Runs once per process,
  /// outside any program: on the coordinator, and on every remote worker before its first task.
  virtual ServerState init(const Config& config, const Model& model, TensorTree initial_params) = 0;

  /// One round on this executor's copy of the state, which it replaces. Clients are combined only
  /// through the federated primitives; tensors of `state` are not written in place (executors
  /// start from the same tensors).
  virtual RoundMetrics round(ServerState& state, RoundContext& ctx) const = 0;

  /// The parameters to evaluate on the test split.
  virtual TensorTree eval_params(const ServerState& state) const { return state.params; }

  /// Whether `round` adds differential-privacy noise of its own (dp_fedavg). Such a round runs even
  /// when Poisson sampling drew no client: a skipped release would tell that nobody took part.
  /// Any other algorithm's state stays as it is in a round without clients.
  virtual bool adds_noise() const { return false; }

  /// The examples a client holding `examples` computes on in one round, counting every slot of
  /// every local step (steps x batch): the simulated clock's compute time is this times the
  /// client's seconds per example. Default: one pass over its data (FedSGD's full-batch gradient).
  virtual int64_t local_examples(int64_t examples) const { return examples; }

  /// Whether the algorithm trains asynchronously (FedBuff, FedAsync): a round is then one server
  /// step over the cohort.size updates that arrived first on the simulated clock, each client
  /// trained from the model version current when it was dispatched (RoundContext::async).
  virtual bool asynchronous() const { return false; }

  /// Refuses, naming `where` (a run log's checkpoint), a state `round` cannot use although its
  /// leaves, shapes and dtypes are those init() made (a resume checks those first): a clip norm
  /// that is not positive, a learned rate that is not finite. `extra` keeps the leaves, shapes and
  /// dtypes init() gave it in every round; a state that grows later is refused on resume.
  virtual void check_state(const ServerState& /*state*/, const std::string& /*where*/) const {}
};

/// The state before round 0: the algorithm's, with the aggregation pipeline's server state
/// (Aggregation::initial_state) under "aggregation/" in `extra`.
ServerState with_aggregation_state(ServerState state, const Aggregation& aggregation);
/// Refuses, naming `where` (a run log's checkpoint), a state whose pipeline part (keys as
/// with_aggregation_state's) holds values the stages cannot use (a clip norm that is not finite
/// and positive), or whose own part the algorithm refuses (Algorithm::check_state).
void check_server_state(const Algorithm& algorithm, const ServerState& state, const Aggregation& aggregation,
                        const std::string& where);
/// algorithm.round with the pipeline's server state split off `state.extra` (the algorithm sees
/// and replaces only its own) into ctx.aggregation_state, and joined back once advanced.
RoundMetrics aggregated_round(const Algorithm& algorithm, ServerState& state, RoundContext& ctx);

}  // namespace fax
