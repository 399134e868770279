#pragma once

// The aggregation pipeline: how a round combines its clients' updates into the server's mean
// (README "Aggregation"). Configured as `aggregation: [{clip: {norm: 1}}, {gaussian: {...}}]`, a
// list of stages in three roles, in this order:
//   client stages   transform each update before anything is combined (clip), then at most one
//                   compresses it (quantize, top_k, random_k; optionally with error feedback,
//                   whose residuals live in ClientStates);
//   an aggregator   replaces the mean with a robust statistic of the updates (median,
//                   trimmed_mean, krum); it sees every update, so it gathers them;
//   or a sum stage  sums them another way: secure_sum, integers modulo 2^b (fax/spmd/secure_sum.h);
//   server stages   act on the sum (gaussian: DP noise, with its privacy ledger).
// Without stages a round takes FedAvg's example-weighted mean. With gaussian each client counts
// once (a weight would scale its sensitivity) and the noised sum is divided by the cohort size, as
// in DP-FedAvg. `clients.byzantine` makes a share of the population (chosen from the seed) send
// corrupted updates, before every stage, for research on robust aggregation.
// Stages may keep server state across rounds (adaptive clipping's C): it lives in the algorithm's
// ServerState::extra under "aggregation/", so it is checkpointed and travels with the round, but
// the algorithm's round never sees it (aggregated_round splits it off; eval_params gets it).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <fax/base/config.h>
#include <fax/base/tensor_tree.h>

namespace fax {

struct ClientChunk;
class ClientStates;
class SecureSum;

/// A stage as `fax-run plugins` lists it.
struct AggregationStageInfo {
  std::string name;
  std::string role;  ///< "client", "aggregator" or "server"
  std::string description;
  std::vector<ConfigKey> keys;  ///< relative to aggregation.<name>
};
/// Every stage fax knows, in listing order.
const std::vector<AggregationStageInfo>& aggregation_stages();

/// The keys every experiment has: aggregation.stages and clients.byzantine.*.
std::vector<ConfigKey> aggregation_schema();

/// The keys of the stages `stages` names ("clip,gaussian", the value of aggregation.stages),
/// with their aggregation.<stage>. prefix. Refuses, naming `where`: an unknown stage, one named
/// twice, and lists that do not compose (a client stage after the aggregator, two aggregators,
/// gaussian without a clip before it or after a robust aggregator).
std::vector<ConfigKey> aggregation_keys(const std::string& stages, const std::string& where);

/// Whether the stages `stages` names gather every update to every executor (an aggregator), for
/// memory estimates.
bool aggregation_gathers(const std::string& stages);

/// The pipeline of a resolved experiment config.
class Aggregation {
 public:
  /// No stage and no byzantine client: FedAvg's example-weighted mean.
  Aggregation() = default;
  /// From aggregation.* and clients.byzantine.*; the byzantine clients are drawn from `seed`
  /// among `population` clients. With cohort.size (and cohort.sampling) in `config`, refuses
  /// stages that cannot use such cohorts (krum: too few updates, or Poisson sampling).
  Aggregation(const Config& config, int64_t population, uint64_t seed);

  /// Nothing to do: the plain example-weighted mean.
  bool plain() const { return stages_.empty() && byzantine_.empty(); }
  /// Each kept client counts once and the sum is divided by the cohort size (gaussian).
  bool uniform() const;
  /// Whether a server stage adds noise (gaussian with noise_multiplier > 0): a round that drew no
  /// client must still release it.
  bool adds_noise() const;
  /// A robust aggregator replaces the mean: every update is gathered to every executor.
  bool gathers() const;
  /// The stages, for messages: "clip, gaussian".
  std::string describe() const;

  /// The bits one client uploads for an update shaped like `params`: what the compression stage
  /// or secure_sum sends (as aggregation/bits_sent logs it), else the values at their width.
  int64_t upload_bits(const TensorTree& params) const;
  /// Whether the updates are summed by secure_sum (on its fixed-point grid).
  bool secure() const { return secure_ != nullptr; }
  /// Whether derivatives through the pipeline are its own (compression has none).
  bool differentiable() const;

  /// A chunk's updates [k, ...] as its clients send them: the byzantine clients' attack, then the
  /// client stages in order. `kept` [k] is 0 for a client dropped from the round; `states` holds
  /// error feedback's residuals. Per-client statistics for the round's metrics are added to
  /// `stats` (name -> [k], summed over the cohort and divided by its size: shares and means).
  /// `state`: the pipeline's server state this round (initial_state() at the first).
  TensorTree client_side(const ClientChunk& chunk, const TensorTree& rows, const at::Tensor& kept,
                         ClientStates& states, const TensorTree& state, TensorTree& stats) const;
  /// What a chunk's clients send to be summed, from their weighted updates [k, ...] (after
  /// client_side): the updates themselves, or secure_sum's integers (with what the simulation
  /// needs beside them); secure_sum's per-client statistics go to `stats`.
  TensorTree send(const ClientChunk& chunk, const TensorTree& weighted, TensorTree& stats) const;
  /// The sum of the updates, the leaves of `like`, from the sum over the cohort of what send()
  /// returned; secure_sum's overflow count is set in `metrics`.
  TensorTree receive(const TensorTree& sums, const TensorTree& like, TensorTree& metrics) const;
  /// The aggregator's statistic of the kept updates [n, ...] (gathers()).
  TensorTree aggregate(const TensorTree& rows, int64_t round) const;
  /// The server stages on the sum of the updates of a round with `cohort` clients drawn from
  /// `population`; server metrics (privacy/epsilon) are set in `metrics`.
  TensorTree server_side(const TensorTree& sum, uint64_t seed, int64_t round, int64_t cohort, int64_t population,
                         const TensorTree& state, TensorTree& metrics) const;
  /// The stages' server state before the first round (empty when no stage keeps any).
  TensorTree initial_state() const;
  /// Whether some stage keeps server state across rounds.
  bool stateful() const;
  /// Refuses, naming `where`, a server state (keys as initial_state's) holding values the stages
  /// cannot use.
  void check_state(const TensorTree& state, const std::string& where) const;
  /// The next round's state from this round's: `stat_sums` are the client statistics summed over
  /// the kept clients (unnormalised), `kept` their number, `cohort` the round's cohort size;
  /// metrics (aggregation/clip_norm) are set in `metrics`.
  TensorTree next_state(const TensorTree& state, const TensorTree& stat_sums, double kept, uint64_t seed,
                        int64_t round, int64_t cohort, TensorTree& metrics) const;
  /// The client state under which error feedback keeps a client's remainder of parameter `param`.
  static std::string error_state(const std::string& param);
  /// Whether `client` of the population is byzantine.
  bool byzantine(int64_t client) const;

  struct Stage;
  struct ClientRound;

 private:
  int64_t secure_bits(int64_t values) const;

  std::vector<std::shared_ptr<const Stage>> stages_;
  std::vector<std::string> roles_, names_;  // per stage
  const SecureSum* secure_ = nullptr;  // the sum stage's, in stages_
  std::vector<bool> byzantine_;  // by client id; empty: none
  std::string attack_;
  double attack_scale_ = 1.0;
};

}  // namespace fax
