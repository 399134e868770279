#pragma once
// The simulated clock (README "Simulated time"): each client has a compute speed, a network and an
// availability pattern, drawn from distributions keyed by (seed, client) or read from trace files,
// so a client's round takes a simulated duration. Synchronous rounds then dispatch the cohort at
// the round's start time, drop late clients at a deadline or keep the first finishers of an
// over-selected cohort, and the run's time advances by the round's length. Nothing here depends on
// training results or wall time: the timeline is a pure function of the seed, the settings and the
// traces, so it is the same for any executor count and after a resume.
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fax/base/config.h>

namespace fax {

/// Simulated time in microseconds: integers, so ties and sums are exact.
using SimTime = int64_t;
constexpr SimTime kMicrosPerSecond = 1000000;
constexpr SimTime kForever = std::numeric_limits<SimTime>::max();
/// Seconds (finite, >= 0) to SimTime, refused beyond about 30,000 years.
SimTime to_sim_time(double seconds);
double to_seconds(SimTime t);

/// A client's systems.
struct ClientSystem {
  double s_per_example = 0;  ///< compute seconds per example slot of a local step
  double down_bps = 0;       ///< download bandwidth, bits per second
  double up_bps = 0;         ///< upload bandwidth
  double latency_s = 0;      ///< added once per round (the round trip)
};

/// A periodic availability pattern: available during [begin, end) of each period, intervals sorted
/// and disjoint (touching ones merged).
struct AvailabilityPattern {
  SimTime period = 0;
  std::vector<std::pair<SimTime, SimTime>> intervals;
};

/// A device trace: CSV with the header `client,s_per_example,down_bps,up_bps`, one row per client
/// 0, 1, 2, ... in order, values finite and > 0. Client c of the population takes row c mod rows.
/// `fingerprints`, if given, gets ", device trace PATH (N bytes, FNV-1a H)" appended.
std::vector<ClientSystem> read_device_trace(const std::string& path, std::string* fingerprints = nullptr);
/// An availability trace: CSV with the header `client,period_s,intervals`, rows as above,
/// intervals "begin-end;begin-end" in seconds within [0, period_s] (empty: never available).
std::vector<AvailabilityPattern> read_availability_trace(const std::string& path, std::string* fingerprints = nullptr);

/// The clock's keys: clients.speed.*, clients.network.*, clients.availability.*, clients.trace.*,
/// cohort.deadline_s, cohort.over_selection, cohort.retry_s.
std::vector<ConfigKey> clock_schema();

/// A synchronous round on the clock.
struct SyncRound {
  std::vector<int64_t> clients;     ///< the clients whose updates count, in dispatch order
  std::vector<SimTime> durations;   ///< theirs
  int64_t selected = 0;             ///< clients dispatched (available when the round started)
  int64_t late = 0;                 ///< finished after the deadline
  int64_t unused = 0;               ///< finished in time, after the first `keep` (over-selection)
  int64_t lost = 0;                 ///< became unavailable before finishing (drop_on_leave)
  SimTime length = 0;               ///< from the round's start until the server closes it
};

class SimulatedClock {
 public:
  struct Options {
    std::string speed = "constant";  ///< constant, lognormal or trace
    double s_per_example = 0.005;
    double speed_sigma = 0.5;
    double jitter = 0;               ///< lognormal sigma of a per-round factor on compute time
    std::string network = "constant";
    double down_bps = 2e7, up_bps = 5e6, network_sigma = 0.5, latency_s = 0.05;
    std::string availability = "always";  ///< always, probability or trace
    double probability = 0.8;
    double slot_s = 3600;
    bool drop_on_leave = false;
    double deadline_s = 0;           ///< 0: wait for every client
    double over_selection = 0;       ///< dispatch ceil(size (1 + this)) clients, keep the first size
    double retry_s = 60;             ///< a round that finds no client available lasts this long
    int64_t concurrency = 0;         ///< asynchronous training: clients in flight (0: synchronous)
    int64_t max_staleness = -1;      ///< asynchronous training: older updates are dropped (< 0: none)
  };

  SimulatedClock(Options options, uint64_t seed, std::vector<ClientSystem> device_trace = {},
                 std::vector<AvailabilityPattern> availability_trace = {}, std::string describe_traces = "");
  /// The clock `config` asks for (clients.speed.distribution other than none; trace files read),
  /// or null. Refuses clock settings without a clock, traces not asked for, and traces missing.
  static std::unique_ptr<SimulatedClock> from_config(const Config& config);

  const Options& options() const { return o_; }
  /// Client `client`'s systems: the same in every round.
  ClientSystem system(int64_t client) const;
  /// The round `round` of `client` computing `examples` example slots, downloading `down_bits` and
  /// uploading `up_bits`: latency + down_bits / down_bps + examples x s_per_example (x the round's
  /// jitter) + up_bits / up_bps.
  SimTime duration(int64_t client, int64_t round, int64_t examples, int64_t down_bits, int64_t up_bits) const;
  /// Whether `client` is available at time t.
  bool available(int64_t client, SimTime t) const;
  /// The first time in [t, limit) at which `client` is unavailable (t itself when it is at t), or
  /// `limit` when it stays.
  SimTime available_until(int64_t client, SimTime t, SimTime limit = kForever) const;

  /// A synchronous round of round number `round` starting at `start`: dispatches the first
  /// `dispatch` candidates available at `start` (in the candidates' order), drops those that leave
  /// before they finish (drop_on_leave) or finish after the deadline, and keeps the first `keep` of
  /// the rest by finish time (ties: dispatch order). The round ends when `keep` clients have
  /// finished; short of that, when every dispatched client has finished or left, or at the
  /// deadline. `duration(client)` is the client's duration.
  SyncRound sync_round(const std::vector<int64_t>& candidates, int64_t dispatch, int64_t keep, SimTime start,
                       const std::function<SimTime(int64_t)>& duration) const;

  /// For the run log's environment and the experiment's identity: the settings and trace files.
  std::string describe() const;

 private:
  Options o_;
  uint64_t seed_;
  std::vector<ClientSystem> device_;
  std::vector<AvailabilityPattern> availability_;
  std::string traces_;
  SimTime slot_;  // probability availability's slot

  bool slot_up(int64_t client, int64_t slot) const;
};

/// One update an asynchronous server step uses: who, which dispatch, from which model version.
struct AsyncUpdate {
  int64_t client = 0;
  int64_t dispatch = 0;       ///< the run's dispatch count when it started (0-based)
  int64_t start_version = 0;  ///< the server steps completed when it started
  int64_t staleness = 0;      ///< steps completed since then, when the step uses it
  SimTime start = 0;
  SimTime finish = 0;
};

/// A server step of asynchronous buffered aggregation (FedBuff, Nguyen et al. 2022).
struct AsyncStep {
  SimTime time = 0;                  ///< when the K-th update arrived
  std::vector<AsyncUpdate> updates;  ///< the K buffered updates, in arrival order
  int64_t stale_dropped = 0;         ///< updates dropped since the last step for max_staleness
  int64_t lost = 0;                  ///< clients that left before finishing since the last step
  double concurrency = 0;            ///< clients in flight since the last step, time-weighted
};

/// The timeline of asynchronous training on the clock: `concurrency` clients train at once, each
/// from the model version current when it starts; arrivals are buffered, and every `buffer` of them
/// make a server step; a freed slot is refilled at once (after the step, so from the new version)
/// with a client drawn from the seed's stream among those available and not already in flight or
/// buffered (so a client is in a step at most once): 64 draws, then, when most of the population
/// is busy, the first free one from a drawn client on; when none is found the slot waits for the
/// next event (or, with nobody in flight, cohort.retry_s). An update staler than `max_staleness` steps
/// (>= 0) is dropped. Like sync_round, a pure function of the seed, the settings and the traces:
/// a resume replays it to the step it continues from.
class AsyncSchedule {
 public:
  struct Options {
    int64_t concurrency = 1;
    int64_t buffer = 1;
    int64_t max_staleness = -1;  ///< < 0: no limit
  };
  /// `duration(client, dispatch)`: the client's time for that dispatch. `pick(dispatch, attempt)`:
  /// a candidate client for a dispatch (default: uniform over the population from the seed).
  AsyncSchedule(const SimulatedClock& clock, Options options, int64_t population, uint64_t seed,
                std::function<SimTime(int64_t client, int64_t dispatch)> duration,
                std::function<int64_t(int64_t dispatch, int64_t attempt)> pick = {});

  /// Runs the timeline to its next server step.
  AsyncStep next();
  /// Server steps completed.
  int64_t version() const { return version_; }
  SimTime now() const { return now_; }
  /// Clients dispatched so far.
  int64_t dispatches() const { return dispatches_; }
  /// The model versions older than version() that a client in flight started from, but for clients
  /// that will leave or whose update is already too stale: what a checkpoint must keep to continue.
  std::vector<int64_t> live_versions() const;

 private:
  void refill();
  // A client free (not in flight or buffered) and available now for the next dispatch, or -1.
  int64_t pick_free();

  const SimulatedClock& clock_;
  Options o_;
  int64_t population_;
  uint64_t seed_;
  std::function<SimTime(int64_t, int64_t)> duration_;
  std::function<int64_t(int64_t, int64_t)> pick_;
  SimTime now_ = 0;
  int64_t version_ = 0;
  int64_t dispatches_ = 0;
  int64_t attempt_ = 0;  // draws made for the next dispatch so far
  struct Flight {
    AsyncUpdate update;  // finish: when it arrives, or leaves when `lost`
    bool lost = false;
  };
  std::vector<Flight> in_flight_;     // a heap, earliest (finish, dispatch) first
  std::vector<AsyncUpdate> buffer_;
  std::unordered_set<int64_t> busy_;  // clients in flight or buffered
};

}  // namespace fax
