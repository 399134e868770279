#include <fax/runtime/clock.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>

#include <fax/base/error.h>
#include <fax/base/fingerprint.h>
#include <fax/base/rng.h>
#include <fax/io/files.h>

namespace fax {
namespace {

// Durations, deadlines and slots: at most about 30 years, so sums of many stay far from overflow.
constexpr double kMaxSeconds = 1e9;
// A device trace's values (seconds per example, bits per second): anything outside is a typo.
constexpr double kMinTraceValue = 1e-12, kMaxTraceValue = 1e12;
// Domains of the clock's draws (mixed into the seed), apart from every stream of training.
constexpr uint64_t kSpeedDomain = 0x5eed'c10c'0001ull;
constexpr uint64_t kNetworkDomain = 0x5eed'c10c'0002ull;
constexpr uint64_t kJitterDomain = 0x5eed'c10c'0003ull;
constexpr uint64_t kAvailabilityDomain = 0x5eed'c10c'0004ull;
constexpr uint64_t kDispatchDomain = 0x5eed'c10c'0005ull;
// An asynchronous refill tries this many candidates before its slot waits for the next event.
constexpr int64_t kMaxPickAttempts = 64;
// An asynchronous run waits at most this many retry_s periods for anyone to become available.
constexpr int64_t kMaxIdleWaits = 1 << 20;
// A trace file is read whole; 1 GiB holds tens of millions of rows.
constexpr size_t kMaxTraceBytes = size_t{1} << 30;
// drop_on_leave looks at most this many probability slots ahead: a client available in that many
// slots in a row (probability p^(2^20)) is taken to stay.
constexpr int64_t kMaxSlotsAhead = 1 << 20;

// Uniform in (0, 1) from a 64-bit hash.
double uniform(uint64_t h) { return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53; }

// A standard normal from the key (Box-Muller on two hashes of it).
double normal(uint64_t seed, int64_t index, int64_t client) {
  const double u1 = uniform(client_stream_seed(seed, index, client));
  const double u2 = uniform(client_stream_seed(seed ^ 0x9e3779b97f4a7c15ull, index, client));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// A lognormal factor of median 1: exp(sigma z).
double lognormal(double sigma, uint64_t seed, int64_t index, int64_t client) {
  return sigma == 0 ? 1.0 : std::exp(sigma * normal(seed, index, client));
}

double parse_number(std::string_view text, const std::string& where, const char* what) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  FAX_CHECK(ec == std::errc() && end == text.data() + text.size() && std::isfinite(value),
            "{}: {} '{}' is not a finite number", where, what, text);
  return value;
}

std::vector<std::string_view> split(std::string_view text, char by) {
  std::vector<std::string_view> parts;
  size_t begin = 0;
  while (true) {
    const size_t end = text.find(by, begin);
    parts.push_back(text.substr(begin, end == std::string_view::npos ? std::string_view::npos : end - begin));
    if (end == std::string_view::npos) return parts;
    begin = end + 1;
  }
}

// The data rows of a trace CSV, each split in `header`'s fields, with the line number for messages.
// The first line is the header; blank lines and lines starting with '#' are skipped; the first field
// must count 0, 1, 2, ...
std::vector<std::pair<int, std::vector<std::string_view>>> csv_rows(const std::string& text, const std::string& path,
                                                                    std::string_view header) {
  std::vector<std::pair<int, std::vector<std::string_view>>> rows;
  const size_t fields = split(header, ',').size();
  int line = 0;
  for (std::string_view row : split(text, '\n')) {
    ++line;
    if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
    if (line == 1) {
      FAX_CHECK(row == header, "{}:1: the header must be '{}'", path, header);
      continue;
    }
    if (row.empty() || row.front() == '#') continue;
    auto parts = split(row, ',');
    FAX_CHECK(parts.size() == fields, "{}:{}: {} fields; a row has {} ({})", path, line, parts.size(), fields, header);
    const std::string where = fmt::format("{}:{}", path, line);
    int64_t client = -1;
    const auto [end, ec] = std::from_chars(parts[0].data(), parts[0].data() + parts[0].size(), client);
    FAX_CHECK(ec == std::errc() && end == parts[0].data() + parts[0].size() && client == static_cast<int64_t>(rows.size()),
              "{}: client '{}' where client {} was expected (rows count 0, 1, 2, ... in order)", where, parts[0],
              rows.size());
    rows.emplace_back(line, std::move(parts));
  }
  FAX_CHECK(!rows.empty(), "{}: no rows after the header '{}'", path, header);
  return rows;
}

// A trace file's contents, and its fingerprint appended to `fingerprints` (for the identity).
std::string read_trace(const std::string& path, const char* what, std::string* fingerprints) {
  std::string text = read_regular_file(path, kMaxTraceBytes, what);
  if (fingerprints != nullptr)
    *fingerprints += fmt::format(", {} {} {}", what, path, describe_fingerprint(static_cast<int64_t>(text.size()), fnv1a(text)));
  return text;
}

}  // namespace

SimTime to_sim_time(double seconds) {
  FAX_CHECK(std::isfinite(seconds) && seconds >= 0 && seconds < 1e18 / kMicrosPerSecond,
            "a simulated duration of {} s is not in [0, 1e12) s", seconds);
  return std::llround(seconds * kMicrosPerSecond);
}

double to_seconds(SimTime t) { return static_cast<double>(t) / kMicrosPerSecond; }

std::vector<ClientSystem> read_device_trace(const std::string& path, std::string* fingerprints) {
  const std::string text = read_trace(path, "device trace", fingerprints);
  std::vector<ClientSystem> systems;
  for (const auto& [line, f] : csv_rows(text, path, "client,s_per_example,down_bps,up_bps")) {
    const std::string where = fmt::format("{}:{}", path, line);
    ClientSystem s;
    s.s_per_example = parse_number(f[1], where, "s_per_example");
    s.down_bps = parse_number(f[2], where, "down_bps");
    s.up_bps = parse_number(f[3], where, "up_bps");
    for (const double v : {s.s_per_example, s.down_bps, s.up_bps})
      FAX_CHECK(v >= kMinTraceValue && v <= kMaxTraceValue, "{}: s_per_example, down_bps and up_bps must be in [{:g}, {:g}]",
                where, kMinTraceValue, kMaxTraceValue);
    systems.push_back(s);
  }
  return systems;
}

std::vector<AvailabilityPattern> read_availability_trace(const std::string& path, std::string* fingerprints) {
  const std::string text = read_trace(path, "availability trace", fingerprints);
  std::vector<AvailabilityPattern> patterns;
  for (const auto& [line, f] : csv_rows(text, path, "client,period_s,intervals")) {
    const std::string where = fmt::format("{}:{}", path, line);
    const double period_s = parse_number(f[1], where, "period_s");
    FAX_CHECK(period_s > 0 && period_s < 1e9, "{}: period_s {} is not in (0, 1e9)", where, period_s);
    AvailabilityPattern p;
    p.period = to_sim_time(period_s);
    FAX_CHECK(p.period > 0, "{}: period_s {} is shorter than a microsecond", where, period_s);
    if (!f[2].empty()) {
      for (std::string_view interval : split(f[2], ';')) {
        // The dash between the numbers: not a leading sign, nor an exponent's (1e-5-50).
        size_t dash = interval.find('-', 1);
        while (dash != std::string_view::npos && (interval[dash - 1] == 'e' || interval[dash - 1] == 'E'))
          dash = interval.find('-', dash + 1);
        FAX_CHECK(dash != std::string_view::npos, "{}: interval '{}' is not begin-end (seconds)", where, interval);
        const double begin = parse_number(interval.substr(0, dash), where, "interval begin");
        const double end = parse_number(interval.substr(dash + 1), where, "interval end");
        FAX_CHECK(0 <= begin && begin < end && end <= period_s, "{}: interval '{}' is not within [0, {}] with begin < end",
                  where, interval, period_s);
        const SimTime b = to_sim_time(begin), e = std::min(to_sim_time(end), p.period);
        FAX_CHECK(b < e, "{}: interval '{}' is shorter than a microsecond (the clock's unit)", where, interval);
        FAX_CHECK(p.intervals.empty() || b >= p.intervals.back().second,
                  "{}: interval '{}' overlaps or precedes the one before it (intervals are sorted and disjoint)", where,
                  interval);
        if (!p.intervals.empty() && b == p.intervals.back().second) {
          p.intervals.back().second = e;
        } else {
          p.intervals.emplace_back(b, e);
        }
      }
    }
    patterns.push_back(std::move(p));
  }
  return patterns;
}

std::vector<ConfigKey> clock_schema() {
  std::vector<ConfigKey> keys;
  keys.push_back(string_key("clients.speed.distribution", "none",
                            "the simulated clock: none (off); constant, lognormal (per client, from the seed) or trace "
                            "(clients.trace.device) compute speeds",
                            {"none", "constant", "lognormal", "trace"}));
  keys.push_back(positive_float_key("clients.speed.s_per_example",
                                    "0.005", "compute seconds per example slot of a local step (lognormal: the median)"));
  keys.push_back(float_key("clients.speed.sigma", "0.5", "lognormal: sigma of log(s_per_example) across clients", 0, 5));
  keys.push_back(float_key("clients.speed.jitter", "0",
                           "sigma of a lognormal factor on each client's compute time, drawn anew every round", 0, 5));
  keys.push_back(string_key("clients.network.distribution", "constant",
                            "constant, lognormal (one factor per client on both bandwidths) or trace (clients.trace.device)",
                            {"constant", "lognormal", "trace"}));
  keys.push_back(positive_float_key("clients.network.down_bps", "2e7", "download bandwidth, bits/s (lognormal: median)"));
  keys.push_back(positive_float_key("clients.network.up_bps", "5e6", "upload bandwidth, bits/s (lognormal: median)"));
  keys.push_back(float_key("clients.network.sigma", "0.5", "lognormal: sigma of log(bandwidth) across clients", 0, 5));
  keys.push_back(float_key("clients.network.latency_s", "0.05", "seconds added to every client's round", 0, kMaxSeconds));
  keys.push_back(string_key("clients.availability.kind", "always",
                            "always; probability (each client available in each slot_s with that probability, from "
                            "the seed); trace (clients.trace.availability)",
                            {"always", "probability", "trace"}));
  keys.push_back(float_key("clients.availability.probability", "0.8", "probability: the chance a client is available in a slot",
                           0, 1, /*min_exclusive=*/true));
  keys.push_back(float_key("clients.availability.slot_s", "3600", "probability: seconds per availability slot", 0,
                           kMaxSeconds, /*min_exclusive=*/true));
  keys.push_back(bool_key("clients.availability.drop_on_leave", "false",
                          "a client that becomes unavailable before it finishes is lost to the round"));
  keys.push_back(string_key("clients.trace.device", "",
                            "CSV client,s_per_example,down_bps,up_bps (row = client id mod rows)"));
  keys.push_back(string_key("clients.trace.availability", "",
                            "CSV client,period_s,intervals; intervals 'begin-end;...' seconds within each period"));
  keys.push_back(float_key("cohort.deadline_s", "0",
                           "simulated seconds a round waits; later clients are dropped and counted (0: wait for all)", 0,
                           kMaxSeconds));
  keys.push_back(float_key("cohort.over_selection", "0",
                           "dispatch ceil(size (1 + this)) clients and keep the first cohort.size to finish", 0, 10));
  keys.push_back(float_key("cohort.retry_s", "60", "simulated seconds a round lasts when no client is available", 0,
                           kMaxSeconds, /*min_exclusive=*/true));
  keys.push_back(int_key("cohort.concurrency", "0",
                         "asynchronous training (fedbuff, fedasync): clients training at once; a server step takes "
                         "the first cohort.size updates to arrive (0: synchronous rounds)", 0));
  keys.push_back(int_key("cohort.max_staleness", "-1",
                         "asynchronous training: an update more than this many server steps old is dropped and "
                         "counted (-1: none)", -1));
  return keys;
}

SimulatedClock::SimulatedClock(Options options, uint64_t seed, std::vector<ClientSystem> device_trace,
                               std::vector<AvailabilityPattern> availability_trace, std::string describe_traces)
    : o_(std::move(options)),
      seed_(seed),
      device_(std::move(device_trace)),
      availability_(std::move(availability_trace)),
      traces_(std::move(describe_traces)),
      slot_(std::max<SimTime>(1, to_sim_time(o_.slot_s))) {
  FAX_CHECK((o_.speed == "trace" || o_.network == "trace") == !device_.empty(),
            "the simulated clock has a device trace exactly when speed or network come from one");
  FAX_CHECK((o_.availability == "trace") == !availability_.empty(),
            "the simulated clock has an availability trace exactly when availability comes from one");
}

std::unique_ptr<SimulatedClock> SimulatedClock::from_config(const Config& config) {
  const std::string speed = config.get_string("clients.speed.distribution");
  if (speed == "none") {
    // A clock setting away from its default would be ignored: refused. Compared by value, not by
    // origin, since a resumed run's config has every key written out.
    Schema schema;
    for (ConfigKey& key : clock_schema()) schema.add(std::move(key));
    Config defaults = Config::from_written({});
    defaults.resolve(schema);
    for (const ConfigKey& key : schema.keys()) {
      const std::string& k = key.name;
      const bool same = key.type == KeyType::Float  ? config.get_float(k) == defaults.get_float(k)
                        : key.type == KeyType::Bool ? config.get_bool(k) == defaults.get_bool(k)
                        : key.type == KeyType::Int  ? config.get_int(k) == defaults.get_int(k)
                                                    : config.get_string(k) == defaults.get_string(k);
      FAX_CHECK(same, "{}: {} needs the simulated clock; set clients.speed.distribution", config.origin(k).str(), k);
    }
    return nullptr;
  }
  Options o;
  o.speed = speed;
  o.s_per_example = config.get_float("clients.speed.s_per_example");
  o.speed_sigma = config.get_float("clients.speed.sigma");
  o.jitter = config.get_float("clients.speed.jitter");
  o.network = config.get_string("clients.network.distribution");
  o.down_bps = config.get_float("clients.network.down_bps");
  o.up_bps = config.get_float("clients.network.up_bps");
  o.network_sigma = config.get_float("clients.network.sigma");
  o.latency_s = config.get_float("clients.network.latency_s");
  o.availability = config.get_string("clients.availability.kind");
  o.probability = config.get_float("clients.availability.probability");
  o.slot_s = config.get_float("clients.availability.slot_s");
  o.drop_on_leave = config.get_bool("clients.availability.drop_on_leave");
  o.deadline_s = config.get_float("cohort.deadline_s");
  o.over_selection = config.get_float("cohort.over_selection");
  o.retry_s = config.get_float("cohort.retry_s");
  o.concurrency = config.get_int("cohort.concurrency");
  o.max_staleness = config.get_int("cohort.max_staleness");
  FAX_CHECK(o.concurrency > 0 || o.max_staleness < 0,
            "{}: cohort.max_staleness applies to asynchronous training; set cohort.concurrency",
            config.origin("cohort.max_staleness").str());
  for (const char* key : {"cohort.deadline_s", "cohort.over_selection"}) {
    FAX_CHECK(o.concurrency == 0 || config.get_float(key) == 0,
              "{}: {} applies to synchronous rounds; asynchronous training (cohort.concurrency {}) has none",
              config.origin(key).str(), key, o.concurrency);
  }
  for (const char* key : {"cohort.deadline_s", "cohort.retry_s", "clients.availability.slot_s"}) {
    const double seconds = config.get_float(key);
    FAX_CHECK(seconds == 0 || to_sim_time(seconds) > 0, "{}: {} ({} s) is shorter than a microsecond, the clock's unit",
              config.origin(key).str(), key, seconds);
  }
  FAX_CHECK(o.over_selection == 0 || config.get_string("cohort.sampling") == "uniform",
            "{}: cohort.over_selection needs cohort.sampling uniform (a Poisson cohort has no size to keep)",
            config.origin("cohort.over_selection").str());

  // A trace file is read when something asks for it, and refused when nothing does.
  // `asker`: the setting that asks for the trace (for the message when it is missing), if any.
  const auto trace = [&](const char* key, const char* asker, const char* why) {
    const std::string path = config.get_string(key);
    FAX_CHECK(asker != nullptr || path.empty(), "{}: {} is set but {}", config.origin(key).str(), key, why);
    FAX_CHECK(asker == nullptr || !path.empty(), "{}: {} is trace: set {} (a CSV file)", config.origin(asker).str(),
              asker, key);
    return path;
  };
  const char* device_asker = o.speed == "trace"     ? "clients.speed.distribution"
                             : o.network == "trace" ? "clients.network.distribution"
                                                    : nullptr;
  const std::string device_path = trace("clients.trace.device", device_asker,
                                        "neither clients.speed.distribution nor clients.network.distribution is trace");
  const std::string availability_path =
      trace("clients.trace.availability", o.availability == "trace" ? "clients.availability.kind" : nullptr,
            "clients.availability.kind is not trace");
  std::string traces;
  std::vector<ClientSystem> device;
  std::vector<AvailabilityPattern> availability;
  if (!device_path.empty()) device = read_device_trace(device_path, &traces);
  if (!availability_path.empty()) availability = read_availability_trace(availability_path, &traces);
  return std::make_unique<SimulatedClock>(std::move(o), static_cast<uint64_t>(config.get_int("seed")),
                                          std::move(device), std::move(availability), std::move(traces));
}

ClientSystem SimulatedClock::system(int64_t client) const {
  ClientSystem s;
  const ClientSystem* row = device_.empty() ? nullptr : &device_[static_cast<size_t>(client) % device_.size()];
  if (o_.speed == "trace") {
    s.s_per_example = row->s_per_example;
  } else {
    s.s_per_example = o_.s_per_example * (o_.speed == "lognormal" ? lognormal(o_.speed_sigma, seed_ ^ kSpeedDomain, -1, client) : 1.0);
  }
  if (o_.network == "trace") {
    s.down_bps = row->down_bps;
    s.up_bps = row->up_bps;
  } else {
    const double factor = o_.network == "lognormal" ? lognormal(o_.network_sigma, seed_ ^ kNetworkDomain, -1, client) : 1.0;
    s.down_bps = o_.down_bps * factor;
    s.up_bps = o_.up_bps * factor;
  }
  s.latency_s = o_.latency_s;
  return s;
}

SimTime SimulatedClock::duration(int64_t client, int64_t round, int64_t examples, int64_t down_bits,
                                 int64_t up_bits) const {
  const ClientSystem s = system(client);
  const double compute = static_cast<double>(examples) * s.s_per_example *
                         lognormal(o_.jitter, seed_ ^ kJitterDomain, round, client);
  const double seconds =
      s.latency_s + static_cast<double>(down_bits) / s.down_bps + compute + static_cast<double>(up_bits) / s.up_bps;
  FAX_CHECK(seconds <= kMaxSeconds, "{} {}: client {} would take {:g} simulated seconds (over 1e9: its "
            "clients.speed / clients.network settings or trace row are out of any realistic range)",
            o_.concurrency > 0 ? "dispatch" : "round", round + 1, client, seconds);
  return to_sim_time(seconds);
}

bool SimulatedClock::slot_up(int64_t client, int64_t slot) const {
  return uniform(client_stream_seed(seed_ ^ kAvailabilityDomain, slot, client)) < o_.probability;
}

bool SimulatedClock::available(int64_t client, SimTime t) const {
  if (o_.availability == "always") return true;
  if (o_.availability == "probability") return slot_up(client, t / slot_);
  return available_until(client, t, t + 1) > t;
}

SimTime SimulatedClock::available_until(int64_t client, SimTime t, SimTime limit) const {
  if (o_.availability == "always") return limit;
  if (o_.availability == "probability") {
    int64_t s = t / slot_;
    if (!slot_up(client, s)) return t;
    for (int64_t ahead = 0; ahead < kMaxSlotsAhead; ++ahead) {
      const SimTime next = (s + 1) * slot_;
      if (next >= limit) return limit;
      if (!slot_up(client, ++s)) return next;
    }
    return limit;
  }
  const AvailabilityPattern& p = availability_[static_cast<size_t>(client) % availability_.size()];
  const SimTime base = t - t % p.period, phase = t % p.period;
  // The interval holding the phase: the last one beginning at or before it.
  auto it = std::upper_bound(p.intervals.begin(), p.intervals.end(), phase,
                             [](SimTime x, const auto& interval) { return x < interval.first; });
  if (it == p.intervals.begin() || std::prev(it)->second <= phase) return t;
  const SimTime end = std::prev(it)->second;
  // An interval running to the period's end continues into the next period's first one.
  if (end == p.period && p.intervals.front().first == 0) {
    if (p.intervals.size() == 1) return limit;
    return std::min(limit, base + p.period + p.intervals.front().second);
  }
  return std::min(limit, base + end);
}

SyncRound SimulatedClock::sync_round(const std::vector<int64_t>& candidates, int64_t dispatch, int64_t keep,
                                     SimTime start, const std::function<SimTime(int64_t)>& duration) const {
  SyncRound round;
  const SimTime deadline = o_.deadline_s > 0 ? to_sim_time(o_.deadline_s) : kForever;
  struct Done {
    SimTime at;
    size_t position;
    int64_t client;
  };
  std::vector<Done> on_time;
  SimTime last_end = 0;  // when the server has heard of every dispatched client
  for (int64_t client : candidates) {
    if (round.selected == dispatch) break;
    if (!available(client, start)) continue;
    ++round.selected;
    const SimTime took = duration(client);
    // When it leaves, if before it finishes (looked up to its finish only).
    const SimTime left = o_.drop_on_leave ? available_until(client, start, start + took) - start : took;
    const SimTime ended = std::min(took, left);
    last_end = std::max(last_end, ended);
    if (ended > deadline) {
      ++round.late;
    } else if (left < took) {
      ++round.lost;
    } else {
      on_time.push_back({took, on_time.size(), client});
    }
  }
  if (round.selected == 0) {
    round.length = to_sim_time(o_.retry_s);
    return round;
  }
  // The first `keep` to finish count; the server closes when the last of them reports.
  std::stable_sort(on_time.begin(), on_time.end(), [](const Done& a, const Done& b) { return a.at < b.at; });
  if (static_cast<int64_t>(on_time.size()) > keep) {
    round.unused = static_cast<int64_t>(on_time.size()) - keep;
    on_time.resize(static_cast<size_t>(keep));
    round.length = on_time.back().at;
  } else if (static_cast<int64_t>(on_time.size()) == keep && keep > 0) {
    round.length = on_time.back().at;
  } else {
    round.length = std::min(last_end, deadline);
  }
  std::sort(on_time.begin(), on_time.end(), [](const Done& a, const Done& b) { return a.position < b.position; });
  for (const Done& d : on_time) {
    round.clients.push_back(d.client);
    round.durations.push_back(d.at);
  }
  return round;
}

AsyncSchedule::AsyncSchedule(const SimulatedClock& clock, Options options, int64_t population, uint64_t seed,
                             std::function<SimTime(int64_t, int64_t)> duration,
                             std::function<int64_t(int64_t, int64_t)> pick)
    : clock_(clock),
      o_(options),
      population_(population),
      seed_(seed),
      duration_(std::move(duration)),
      pick_(std::move(pick)) {
  FAX_CHECK(o_.concurrency >= 1 && o_.buffer >= 1 && o_.concurrency <= population_,
            "asynchronous training needs 1 <= concurrency ({}) <= population ({}) and a buffer ({}) >= 1",
            o_.concurrency, population_, o_.buffer);
  if (!pick_) {
    pick_ = [this](int64_t dispatch, int64_t attempt) {
      return static_cast<int64_t>(client_stream_seed(seed_ ^ kDispatchDomain, dispatch, attempt) %
                                  static_cast<uint64_t>(population_));
    };
  }
  refill();
}

namespace {
template <typename Flight>
bool arrives_later(const Flight& a, const Flight& b) {
  return a.update.finish != b.update.finish ? a.update.finish > b.update.finish : a.update.dispatch > b.update.dispatch;
}
}  // namespace

int64_t AsyncSchedule::pick_free() {
  const auto free = [&](int64_t c) { return busy_.count(c) == 0 && clock_.available(c, now_); };
  // The attempts go on where the last refill of this dispatch stopped: each try is a new draw.
  for (int64_t tries = 0; tries < kMaxPickAttempts; ++tries) {
    const int64_t c = pick_(dispatches_, attempt_++);
    if (free(c)) return c;
  }
  // When most clients are busy (a buffer near the population), draws rarely find the few free
  // ones: look at every client, from a drawn one on.
  if (static_cast<int64_t>(busy_.size()) * 2 < population_) return -1;
  const int64_t from = pick_(dispatches_, attempt_++);
  for (int64_t i = 0; i < population_; ++i) {
    const int64_t c = (from + i) % population_;
    if (free(c)) return c;
  }
  return -1;
}

void AsyncSchedule::refill() {
  while (static_cast<int64_t>(in_flight_.size()) < o_.concurrency) {
    const int64_t client = pick_free();
    if (client < 0) return;  // the slot waits for the next event
    attempt_ = 0;
    const SimTime d = duration_(client, dispatches_);
    FAX_CHECK(now_ <= kForever - d, "dispatch {}: the simulated time passes 292,000 years", dispatches_ + 1);
    const SimTime finish = now_ + d;
    const SimTime left = clock_.options().drop_on_leave ? clock_.available_until(client, now_, finish) : finish;
    in_flight_.push_back({{client, dispatches_, version_, 0, now_, std::min(finish, left)}, left < finish});
    std::push_heap(in_flight_.begin(), in_flight_.end(), arrives_later<Flight>);
    busy_.insert(client);
    ++dispatches_;
  }
}

AsyncStep AsyncSchedule::next() {
  AsyncStep step;
  const SimTime since = now_;
  const auto in_flight_at_start = static_cast<double>(in_flight_.size());
  double busy_time = 0;  // sum over in-flight clients of their time in flight since `since`
  const SimTime retry = to_sim_time(clock_.options().retry_s);
  for (int64_t idle = 0; static_cast<int64_t>(buffer_.size()) < o_.buffer;) {
    if (in_flight_.empty()) {
      FAX_CHECK(++idle < kMaxIdleWaits, "no client became available in {:g} simulated seconds (cohort.retry_s x {})",
                static_cast<double>(idle) * clock_.options().retry_s, kMaxIdleWaits);
      FAX_CHECK(now_ <= kForever - retry, "waiting for an available client, the simulated time passes 292,000 years");
      now_ += retry;
      refill();
      continue;
    }
    std::pop_heap(in_flight_.begin(), in_flight_.end(), arrives_later<Flight>);
    const Flight f = in_flight_.back();
    in_flight_.pop_back();
    busy_time += static_cast<double>(in_flight_.size() + 1) * static_cast<double>(f.update.finish - now_);
    now_ = f.update.finish;
    const int64_t staleness = version_ - f.update.start_version;
    if (f.lost || (o_.max_staleness >= 0 && staleness > o_.max_staleness)) {
      ++(f.lost ? step.lost : step.stale_dropped);
      busy_.erase(f.update.client);
    } else {
      buffer_.push_back(f.update);
    }
    if (static_cast<int64_t>(buffer_.size()) < o_.buffer) refill();
  }
  for (AsyncUpdate& u : buffer_) {
    u.staleness = version_ - u.start_version;
    busy_.erase(u.client);
  }
  step.updates = std::move(buffer_);
  buffer_.clear();
  step.time = now_;
  step.concurrency = now_ > since ? busy_time / static_cast<double>(now_ - since) : in_flight_at_start;
  ++version_;
  refill();
  return step;
}

std::vector<int64_t> AsyncSchedule::live_versions() const {
  std::vector<int64_t> versions;
  for (const Flight& f : in_flight_) {
    // A client that will leave, or whose update is already too stale, never needs its version.
    const bool dropped = f.lost || (o_.max_staleness >= 0 && version_ - f.update.start_version > o_.max_staleness);
    if (f.update.start_version < version_ && !dropped) versions.push_back(f.update.start_version);
  }
  std::sort(versions.begin(), versions.end());
  versions.erase(std::unique(versions.begin(), versions.end()), versions.end());
  return versions;
}

std::string SimulatedClock::describe() const {
  std::string s = fmt::format("speed {}", o_.speed);
  if (o_.speed != "trace") s += fmt::format(" {} s/example", o_.s_per_example);
  if (o_.speed == "lognormal") s += fmt::format(" sigma {}", o_.speed_sigma);
  if (o_.jitter > 0) s += fmt::format(", jitter {}", o_.jitter);
  s += fmt::format(", network {}", o_.network);
  if (o_.network != "trace") s += fmt::format(" down {} up {} bit/s", o_.down_bps, o_.up_bps);
  if (o_.network == "lognormal") s += fmt::format(" sigma {}", o_.network_sigma);
  s += fmt::format(", latency {} s, availability {}", o_.latency_s, o_.availability);
  if (o_.availability == "probability") s += fmt::format(" {} per {} s slot", o_.probability, o_.slot_s);
  if (o_.drop_on_leave) s += " (drop on leave)";
  if (o_.deadline_s > 0) s += fmt::format(", deadline {} s", o_.deadline_s);
  if (o_.over_selection > 0) s += fmt::format(", over-selection {}", o_.over_selection);
  if (o_.concurrency > 0) s += fmt::format(", asynchronous: {} in flight", o_.concurrency);
  if (o_.max_staleness >= 0) s += fmt::format(", max staleness {}", o_.max_staleness);
  return s + traces_;
}

}  // namespace fax
