#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <fax/base/cohort.h>
#include <fax/base/config.h>
#include <fax/io/run_log.h>
#include <fax/nn/model.h>
#include <fax/runtime/clock.h>
#include <fax/runtime/coordinator.h>
#include <fax/spmd/mesh.h>
#include <fax/train/algorithm.h>
#include <fax/train/dataset.h>

namespace fax {

/// fax's own experiment keys: seed, rounds, cohort.*, execution.*, logging.* and the names that
/// select a data set, a model and an algorithm (data.name, model.name, algorithm.name). The keys
/// of the chosen data set, model and algorithm are added by whoever assembles the experiment.
Schema experiment_schema();

/// The mesh an experiment asks for, with threads 0 resolved by automatic_threads and executors 0
/// to min(hardware threads / threads, logical shards).
MeshOptions mesh_options(const Config& config);

/// execution.threads 0: the intra-op threads that leave no core idle when each logical shard has
/// its executor, max(1, hardware threads / logical_shards). A function of the machine and the
/// shards, never of the executor count (results depend on the threads, not on the executors); an
/// experiment records the number it resolved to, so a resume and remote workers use it.
int automatic_threads(int64_t logical_shards);

/// Refuses asynchronous-training settings `algorithm` cannot run with (Algorithm::asynchronous):
/// an asynchronous algorithm needs the simulated clock, cohort.concurrency and uniform sampling; a
/// synchronous one refuses cohort.concurrency. The population's bound is the Experiment's.
void check_asynchronous(const Config& config, const Algorithm& algorithm);

/// How a round's clients are drawn (cohort.sampling).
enum class Sampling { uniform, poisson };
Sampling sampling(const Config& config);

/// The clients of round `round`, drawn by the server's stream for (seed, round) and weighted by
/// their training example counts: `size` distinct clients uniformly (in draw order), or with
/// Poisson sampling each client with probability size / population (ids ascending; any number).
Cohort sample_cohort(const FederatedDataset& data, int64_t size, uint64_t seed, int64_t round,
                     Sampling sampling = Sampling::uniform);
/// The draw behind sample_cohort: the whole population permuted (uniform: the cohort is its first
/// `size`; the simulated clock dispatches the first available ones), or the Poisson draw.
std::vector<int64_t> draw_clients(int64_t population, int64_t size, uint64_t seed, int64_t round, Sampling sampling);
/// `ids` weighted by their training example counts.
Cohort weighted_cohort(const FederatedDataset& data, std::vector<int64_t> ids);

/// What the progress callback gets after every round.
struct RoundReport {
  int64_t round = 0;   ///< rounds completed (1-based)
  int64_t rounds = 0;  ///< rounds in the run
  double elapsed_s = 0;
  double eta_s = 0;
  double clients_per_s = 0;
  Metrics metrics;     ///< this round's metrics (eval/* only on evaluation rounds)
};
using ProgressFn = std::function<void(const RoundReport&)>;

struct RunResult {
  ServerState state;
  Metrics last;        ///< the last round's metrics
  double seconds = 0;
  int64_t rounds_done = 0;  ///< rounds completed, counting those before a resume
  bool stopped = false;     ///< stop() or an interrupt ended it early (the state was checkpointed)
  /// Wall time in the rounds' and evaluations' tasks (model computation and its collectives);
  /// the rest of `seconds` is bookkeeping: sampling, the simulated clock, the run log.
  double task_seconds = 0;
};

/// Where a resumed run picks up: the rounds already done and the state checkpointed after them.
struct ResumePoint {
  int64_t round = 0;
  ServerState state;
  TensorTree client_states;  ///< as ClientStates::stacked() wrote it
  TensorTree clock;          ///< the simulated clock's: now_us (empty without a clock)
  /// Asynchronous training: the older model versions clients in flight started from, v<N>/<param>.
  TensorTree async;
};

/// The checkpoint tree of a run: params/..., extra/..., client_states/..., and with a simulated
/// clock clock/now_us, the simulated time after the round (what a resume needs); asynchronous
/// training adds async/v<N>/..., the versions `async` holds.
TensorTree checkpoint_tree(const ServerState& state, const ClientStates& clients,
                           std::optional<SimTime> now = std::nullopt, const TensorTree& async = {});
ResumePoint resume_point(int64_t round, const TensorTree& checkpoint);

/// Runs an experiment: `rounds` rounds of `algorithm` on `data` with `model`, over the mesh the
/// config asks for; evaluates on the test split every logging.eval_every rounds and after the last;
/// logs every round to `log` (if given) and checkpoints every logging.checkpoint_every rounds and
/// after the last. Every random draw is keyed by (seed, round, client), so a run resumed from a
/// checkpoint continues with the same bits as one that never stopped.
///
/// Rounds and evaluations run on local executor threads, or, given a coordinator, on remote
/// workers: each worker builds the same Experiment from the coordinator's config and runs
/// serve() for every task, with the same bits as a local run.
class Experiment {
 public:
  Experiment(const Config& config, Algorithm& algorithm, const Model& model, const FederatedDataset& data,
             Coordinator* remote = nullptr);

  /// `resume`: continue after its round from its state instead of starting at round 0. `stop` is
  /// asked after every round; when it says yes the state is checkpointed and the run ends. A round
  /// interrupted mid-way (request_interrupt, fax/base/interrupt.h) is abandoned: the state of the last
  /// completed round is checkpointed and the run ends the same way, within a local step.
  RunResult run(RunLog* log, const ProgressFn& progress, const ResumePoint* resume = nullptr,
                const std::function<bool()>& stop = {});
  /// Refuses, naming `where` (the log's checkpoint), a resume point this experiment cannot continue
  /// from: a state whose leaves, shapes or dtypes are not those init() makes, or whose aggregation
  /// state the stages or the algorithm cannot use (check_server_state). run() checks it too; a caller checks
  /// first to refuse before it touches the log.
  void check_resume(const ResumePoint& resume, const std::string& where);

  /// Mean cross-entropy and accuracy of `params` on the test split ("eval/loss", "eval/accuracy"),
  /// computed over the mesh.
  Metrics evaluate(const TensorTree& params);

  /// Environment entries for /env: versions, host, seed, mesh.
  StringPairs environment() const;

  /// The algorithm's state before round 0: Algorithm::init on the model's seeded initial
  /// parameters. run() calls it; a remote worker calls it once before serving tasks, because
  /// init is where the algorithm reads its settings.
  ServerState init();

  /// A remote worker's part of a task the coordinator's Experiment sent: the program of a round
  /// or an evaluation on this executor's clients, with the client states the input carries.
  TensorTree serve(Program& program, TaskKind kind, const TensorTree& input);

  /// The executors, logical shards, threads and chunking this experiment runs with (executors:
  /// local threads, or with a coordinator its workers when the run starts).
  const MeshOptions& mesh_options() const { return mesh_options_; }
  ClientStates& client_states() { return client_states_; }
  /// The simulated clock the config asks for (read on first use, with its trace files), or null.
  const SimulatedClock* clock() const;

 private:
  // check_resume against `fresh`, the state init() made.
  void check_resume(const ResumePoint& resume, const ServerState& fresh, const std::string& where) const;
  Server<TensorTree> program(Program& p, TaskKind kind, const TensorTree& input);
  TensorTree run_task(TaskKind kind, RoundInfo info, const Cohort& cohort, int64_t logical_shards,
                      const TensorTree& input);
  // Round `round` on the clock, starting at `start`, for a model of `down_bits` whose clients
  // upload `up_bits`.
  SyncRound clock_round(int64_t round, SimTime start, int64_t down_bits, int64_t up_bits) const;
  // Asynchronous training's timeline replayed to the state after `steps` server steps.
  std::unique_ptr<AsyncSchedule> async_schedule(int64_t steps, int64_t down_bits, int64_t up_bits) const;

  const Config& config_;
  Algorithm& algorithm_;
  const Model& model_;
  const FederatedDataset& data_;
  Coordinator* remote_;
  MeshOptions mesh_options_;
  std::unique_ptr<Mesh> mesh_;  // local executors, started on first use
  ClientStates client_states_;
  Aggregation aggregation_;
  Sampling sampling_;
  bool asynchronous_;
  mutable std::optional<std::unique_ptr<SimulatedClock>> clock_;  // built by clock()
  double task_seconds_ = 0;  // in run_task, since the experiment was made
};

}  // namespace fax
