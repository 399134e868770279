// The simulated clock: hand-computed timelines of synchronous rounds, client systems drawn from the
// seed or read from traces, availability, and the trace files' validation.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include <fax/io/config_yaml.h>
#include <fax/runtime/clock.h>
#include <fax/runtime/experiment.h>
#include <fax/train/client_update.h>

#include "helpers.h"

namespace fax {
namespace {

constexpr SimTime kS = kMicrosPerSecond;

// Four clients taking 3, 5, 2 and 4 s (a device trace of seconds per example, one example each,
// nothing to send): the toy of the issue.
SimulatedClock toy(SimulatedClock::Options o = {}, std::vector<AvailabilityPattern> availability = {}) {
  o.speed = o.network = "trace";
  o.latency_s = 0;
  if (!availability.empty()) o.availability = "trace";
  std::vector<ClientSystem> device;
  for (double s : {3.0, 5.0, 2.0, 4.0}) device.push_back({s, 1e9, 1e9, 0});
  return SimulatedClock(o, 0, device, std::move(availability));
}

SyncRound toy_round(const SimulatedClock& clock, int64_t dispatch, int64_t keep, SimTime start = 0) {
  return clock.sync_round({0, 1, 2, 3}, dispatch, keep, start,
                          [&](int64_t c) { return clock.duration(c, 0, /*examples=*/1, 0, 0); });
}

TEST(Clock, WaitingForEveryClientTakesTheSlowest) {
  const SyncRound r = toy_round(toy(), 4, 4);
  EXPECT_EQ(r.clients, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(r.durations, (std::vector<SimTime>{3 * kS, 5 * kS, 2 * kS, 4 * kS}));
  EXPECT_EQ(r.length, 5 * kS);
  EXPECT_EQ(r.selected, 4);
  EXPECT_EQ(r.late, 0);
  EXPECT_EQ(r.lost, 0);
}

TEST(Clock, ADeadlineDropsTheLateAndEndsTheRound) {
  SimulatedClock::Options o;
  o.deadline_s = 3.5;
  const SyncRound r = toy_round(toy(o), 4, 4);
  EXPECT_EQ(r.clients, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(r.late, 2);
  EXPECT_EQ(r.length, 3 * kS + kS / 2);
  // Everyone on time: the round ends with the last of them, before the deadline.
  o.deadline_s = 10;
  EXPECT_EQ(toy_round(toy(o), 4, 4).length, 5 * kS);
}

TEST(Clock, OverSelectionKeepsTheFirstFinishersInDispatchOrder) {
  const SyncRound r = toy_round(toy(), 4, 2);
  EXPECT_EQ(r.clients, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(r.durations, (std::vector<SimTime>{3 * kS, 2 * kS}));
  EXPECT_EQ(r.unused, 2);
  EXPECT_EQ(r.late, 0);
  EXPECT_EQ(r.length, 3 * kS);
  // Dispatching 3 of the 4: client 3 is never asked.
  const SyncRound three = toy_round(toy(), 3, 2);
  EXPECT_EQ(three.selected, 3);
  EXPECT_EQ(three.clients, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(three.unused, 1);
  // With a deadline as well: client 0 (3 s) is late at 2.5 s, so 2 of the 2 wanted are not there;
  // the round waits for the deadline.
  SimulatedClock::Options o;
  o.deadline_s = 2.5;
  const SyncRound both = toy_round(toy(o), 4, 2);
  EXPECT_EQ(both.clients, (std::vector<int64_t>{2}));
  EXPECT_EQ(both.late, 3);
  EXPECT_EQ(both.unused, 0);
  EXPECT_EQ(both.length, 2 * kS + kS / 2);
}

TEST(Clock, FinishTiesGoToTheEarlierDispatch) {
  SimulatedClock::Options o;
  o.speed = o.network = "trace";
  o.latency_s = 0;
  const SimulatedClock clock(o, 0, {{3, 1e9, 1e9, 0}, {3, 1e9, 1e9, 0}, {3, 1e9, 1e9, 0}});
  const SyncRound r = clock.sync_round({2, 0, 1}, 3, 2, 0, [&](int64_t c) { return clock.duration(c, 0, 1, 0, 0); });
  EXPECT_EQ(r.clients, (std::vector<int64_t>{2, 0}));
}

TEST(Clock, ADurationIsLatencyDownloadComputeAndUpload) {
  SimulatedClock::Options o;
  o.speed = "constant";
  o.s_per_example = 0.01;
  o.down_bps = 2e7;
  o.up_bps = 5e6;
  o.latency_s = 0.05;
  const SimulatedClock clock(o, 7);
  // 0.05 + 8e6 / 2e7 + 100 x 0.01 + 8e6 / 5e6 = 0.05 + 0.4 + 1 + 1.6
  EXPECT_EQ(clock.duration(3, 0, 100, 8'000'000, 8'000'000), 3'050'000);
  EXPECT_EQ(clock.duration(4, 9, 100, 8'000'000, 8'000'000), 3'050'000);
}

TEST(Clock, LognormalSpeedsArePerClientAndFromTheSeed) {
  SimulatedClock::Options o;
  o.speed = "lognormal";
  o.s_per_example = 0.01;
  o.speed_sigma = 0.8;
  const SimulatedClock a(o, 1), b(o, 1), other(o, 2);
  std::vector<double> speeds;
  int differ = 0;
  for (int64_t c = 0; c < 20000; ++c) {
    EXPECT_EQ(a.system(c).s_per_example, b.system(c).s_per_example);
    differ += a.system(c).s_per_example != other.system(c).s_per_example;
    speeds.push_back(std::log(a.system(c).s_per_example / 0.01));
  }
  EXPECT_EQ(differ, 20000);
  // log speeds ~ N(0, 0.8^2): mean within 4 standard errors, sd within 3%.
  double mean = 0, sq = 0;
  for (double x : speeds) mean += x / speeds.size();
  for (double x : speeds) sq += (x - mean) * (x - mean) / speeds.size();
  EXPECT_NEAR(mean, 0.0, 4 * 0.8 / std::sqrt(20000.0));
  EXPECT_NEAR(std::sqrt(sq), 0.8, 0.03 * 0.8);
  // The same client in every round, unless jitter draws a factor per round.
  EXPECT_EQ(a.duration(5, 0, 10, 0, 0), a.duration(5, 1, 10, 0, 0));
  o.jitter = 0.3;
  const SimulatedClock jittered(o, 1);
  EXPECT_NE(jittered.duration(5, 0, 10, 0, 0), jittered.duration(5, 1, 10, 0, 0));
  EXPECT_EQ(jittered.duration(5, 1, 10, 0, 0), SimulatedClock(o, 1).duration(5, 1, 10, 0, 0));
}

TEST(Clock, ProbabilityAvailabilityHoldsForASlot) {
  SimulatedClock::Options o;
  o.availability = "probability";
  o.probability = 0.3;
  o.slot_s = 10;
  const SimulatedClock clock(o, 3);
  int64_t up = 0;
  for (int64_t c = 0; c < 10000; ++c) {
    const SimTime t = 25 * kS;  // slot 2
    const SimTime until = clock.available_until(c, t);
    EXPECT_EQ(until > t, clock.available(c, t));
    if (until == t) continue;
    ++up;
    // Available to the end of a slot, unavailable from there.
    EXPECT_EQ(until % (10 * kS), 0);
    EXPECT_GT(until, t);
    EXPECT_TRUE(clock.available(c, until - 1));
    EXPECT_FALSE(clock.available(c, until));
    EXPECT_TRUE(clock.available(c, 20 * kS));  // the same slot
    // Looked up to a limit only.
    EXPECT_EQ(clock.available_until(c, t, 29 * kS), 29 * kS);
  }
  EXPECT_NEAR(static_cast<double>(up) / 10000, 0.3, 4 * std::sqrt(0.3 * 0.7 / 10000));
}

TEST(Clock, TraceAvailabilityRepeatsEveryPeriodAndWraps) {
  AvailabilityPattern p{100 * kS, {{0, 5 * kS}, {10 * kS, 30 * kS}, {90 * kS, 100 * kS}}};
  const SimulatedClock clock = toy({}, {p});
  EXPECT_EQ(clock.available_until(0, 15 * kS), 30 * kS);
  EXPECT_EQ(clock.available_until(0, 215 * kS), 230 * kS);
  EXPECT_EQ(clock.available_until(0, 50 * kS), 50 * kS);
  EXPECT_EQ(clock.available_until(0, 30 * kS), 30 * kS);  // an interval's end is not in it
  EXPECT_EQ(clock.available_until(0, 95 * kS), 105 * kS);  // into the next period's [0, 5)
  EXPECT_EQ(clock.available_until(0, 95 * kS, 100 * kS), 100 * kS);
  EXPECT_TRUE(clock.available(0, 295 * kS));
  EXPECT_FALSE(clock.available(0, 250 * kS));
  const SimulatedClock always = toy({}, {AvailabilityPattern{100 * kS, {{0, 100 * kS}}}});
  EXPECT_EQ(always.available_until(2, 12345 * kS), kForever);
  const SimulatedClock never = toy({}, {AvailabilityPattern{100 * kS, {}}});
  EXPECT_FALSE(never.available(1, 0));
}

TEST(Clock, UnavailableClientsAreSkippedAndLeaversLost) {
  // Client 1 is available only during [0, 4) of every 100 s; the others always.
  const AvailabilityPattern all{100 * kS, {{0, 100 * kS}}}, early{100 * kS, {{0, 4 * kS}}};
  SimulatedClock::Options o;
  // Starting at 10 s, client 1 is away: the next candidate is dispatched in its place.
  const SyncRound skipped = toy(o, {all, early, all, all}).sync_round(
      {0, 1, 2, 3}, 3, 3, 10 * kS, [](int64_t c) { return (std::vector<SimTime>{3, 5, 2, 4})[c] * kS; });
  EXPECT_EQ(skipped.clients, (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(skipped.selected, 3);
  // Starting at 0 it is dispatched, and leaves at 4 s before finishing at 5 s: lost with
  // drop_on_leave (the server hears of it when it leaves), kept without.
  o.drop_on_leave = true;
  const SimulatedClock leaving = toy(o, {all, early, all, all});
  const SyncRound lost = toy_round(leaving, 4, 4);
  EXPECT_EQ(lost.clients, (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(lost.lost, 1);
  EXPECT_EQ(lost.length, 4 * kS);
  o.drop_on_leave = false;
  EXPECT_EQ(toy_round(toy(o, {all, early, all, all}), 4, 4).clients.size(), 4u);
  // Nobody available: the round lasts retry_s.
  o.retry_s = 30;
  const SyncRound nobody = toy_round(toy(o, {early}), 4, 4, 50 * kS);
  EXPECT_EQ(nobody.selected, 0);
  EXPECT_TRUE(nobody.clients.empty());
  EXPECT_EQ(nobody.length, 30 * kS);
}

// The asynchronous toy: clients taking 3, 5, 2 and 4 s, 2 in flight, a buffer of 2,
// candidates picked in turn (dispatch d tries d, d + 1, ... mod 4). By hand:
//   t0: dispatch c0 (v0, ends 3), c1 (v0, ends 5)
//   t3: c0 arrives; dispatch c2 (v0, ends 5)
//   t5: c1 arrives: step 1 (c0, c1); dispatch c3 (v1, ends 9). c2 arrives; dispatch c0 (v1, ends 8)
//   t8: c0 arrives: step 2 (c2 staleness 1, c0 0); dispatch c1 (v2, ends 13)
//   t9: c3 arrives; dispatch c2 (v2, ends 11)
//   t11: c2 arrives: step 3 (c3 staleness 1, c2 0); dispatch c3 (v3); in flight from v2: c1.
TEST(Clock, AsynchronousBufferedStepsByHand) {
  const SimulatedClock clock = toy();
  AsyncSchedule schedule(clock, {2, 2, -1}, 4, 0, [&](int64_t c, int64_t d) { return clock.duration(c, d, 1, 0, 0); },
                         [](int64_t dispatch, int64_t attempt) { return (dispatch + attempt) % 4; });
  std::vector<SimTime> times;
  std::vector<std::vector<int64_t>> ids, staleness, versions;
  for (int i = 0; i < 3; ++i) {
    const AsyncStep step = schedule.next();
    times.push_back(step.time);
    ids.emplace_back();
    staleness.emplace_back();
    versions.emplace_back();
    for (const AsyncUpdate& u : step.updates) {
      ids.back().push_back(u.client);
      staleness.back().push_back(u.staleness);
      versions.back().push_back(u.start_version);
    }
    if (i == 0) {
      EXPECT_DOUBLE_EQ(step.concurrency, 2.0);
    }
  }
  EXPECT_EQ(times, (std::vector<SimTime>{5 * kS, 8 * kS, 11 * kS}));
  EXPECT_EQ(ids, (std::vector<std::vector<int64_t>>{{0, 1}, {2, 0}, {3, 2}}));
  EXPECT_EQ(staleness, (std::vector<std::vector<int64_t>>{{0, 0}, {1, 0}, {1, 0}}));
  EXPECT_EQ(versions, (std::vector<std::vector<int64_t>>{{0, 0}, {0, 1}, {1, 2}}));
  EXPECT_EQ(schedule.version(), 3);
  EXPECT_EQ(schedule.live_versions(), (std::vector<int64_t>{2}));
}

TEST(Clock, AsynchronousStalenessLimitDropsAndTheSeedDecides) {
  const SimulatedClock clock = toy();
  const auto duration = [&](int64_t c, int64_t d) { return clock.duration(c, d, 1, 0, 0); };
  const auto in_turn = [](int64_t dispatch, int64_t attempt) { return (dispatch + attempt) % 4; };
  // max_staleness 0: c2's update of step 2 (staleness 1) is dropped; the step waits for another.
  AsyncSchedule strict(clock, {2, 2, 0}, 4, 0, duration, in_turn);
  strict.next();
  const AsyncStep second = strict.next();
  EXPECT_EQ(second.stale_dropped, 1);
  for (const AsyncUpdate& u : second.updates) EXPECT_EQ(u.staleness, 0);
  // Drawn from the seed: the same steps for the same seed, others for another.
  const auto steps = [&](uint64_t seed) {
    AsyncSchedule s(clock, {2, 1, -1}, 4, seed, duration);
    std::vector<int64_t> order;
    for (int i = 0; i < 12; ++i) order.push_back(s.next().updates[0].client);
    return order;
  };
  EXPECT_EQ(steps(1), steps(1));
  EXPECT_NE(steps(1), steps(2));
}

// A buffer of 99 of 100 clients: the few free ones are found at once (draws, then a scan), so
// 5 in flight with every client taking 2 s make the step in 20 waves of 2 s, every slot busy.
TEST(Clock, AsynchronousRefillFindsTheLastFreeClients) {
  SimulatedClock::Options o;
  o.speed = "constant";
  o.s_per_example = 2;
  o.latency_s = 0;
  const SimulatedClock clock(o, 0);
  AsyncSchedule schedule(clock, {5, 99, -1}, 100, 0, [&](int64_t c, int64_t d) { return clock.duration(c, d, 1, 0, 0); });
  const AsyncStep step = schedule.next();
  std::vector<int64_t> ids;
  for (const AsyncUpdate& u : step.updates) ids.push_back(u.client);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()) - ids.begin(), 99);
  EXPECT_EQ(step.time, 40 * kS);
  EXPECT_DOUBLE_EQ(step.concurrency, 5.0);
  // One in flight: 99 dispatches one after another, no wait for cohort.retry_s.
  AsyncSchedule one(clock, {1, 99, -1}, 100, 0, [&](int64_t c, int64_t d) { return clock.duration(c, d, 1, 0, 0); });
  EXPECT_EQ(one.next().time, 99 * 2 * kS);
}

// Nobody available for ages: the wait is refused before the simulated time overflows.
TEST(Clock, AsynchronousWaitingRefusesToOverflowTime) {
  SimulatedClock::Options o;
  o.speed = "constant";
  o.availability = "probability";
  o.probability = 1e-9;
  o.slot_s = 1e9;
  o.retry_s = 1e9;
  const SimulatedClock clock(o, 0);
  AsyncSchedule schedule(clock, {1, 1, -1}, 3, 0, [&](int64_t c, int64_t d) { return clock.duration(c, d, 1, 0, 0); });
  const std::string error = test::error_of([&] { schedule.next(); });
  EXPECT_NE(error.find("the simulated time passes 292,000 years"), std::string::npos) << error;
}

TEST(Clock, LocalExamplesCountEveryStepsSlots) {
  ClientTraining t;
  t.epochs = 2;
  t.batch_size = 10;
  EXPECT_EQ(local_examples(t, 25), 2 * 3 * 10);
  EXPECT_EQ(local_examples(t, 5), 2 * 5);
  EXPECT_EQ(local_examples(t, 0), 0);
  t.batch_size = 0;
  EXPECT_EQ(local_examples(t, 25), 2 * 25);
}

class ClockTraces : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() /
          ("fax_clock_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir;
};

TEST_F(ClockTraces, ReadsDeviceAndAvailabilityRows) {
  const auto device = read_device_trace(
      write("d.csv", "client,s_per_example,down_bps,up_bps\r\n0,0.0162,5648000,5648000\r\n# a comment\n\n1,0.5,1e6,2e6\n"));
  ASSERT_EQ(device.size(), 2u);
  EXPECT_EQ(device[0].s_per_example, 0.0162);
  EXPECT_EQ(device[1].up_bps, 2e6);
  std::string fingerprint;
  const auto availability =
      read_availability_trace(write("a.csv", "client,period_s,intervals\n0,86400,0-3600;3600-7200;43200-50400\n1,60,\n"),
                              &fingerprint);
  ASSERT_EQ(availability.size(), 2u);
  // Touching intervals are one.
  EXPECT_EQ(availability[0].intervals,
            (std::vector<std::pair<SimTime, SimTime>>{{0, 7200 * kS}, {43200 * kS, 50400 * kS}}));
  EXPECT_TRUE(availability[1].intervals.empty());
  EXPECT_NE(fingerprint.find("availability trace"), std::string::npos);
  EXPECT_NE(fingerprint.find("FNV-1a"), std::string::npos);
}

TEST_F(ClockTraces, RefusesMalformedFilesNamingTheLine) {
  const auto device_error = [&](const std::string& text) {
    return test::error_of([&] { read_device_trace(write("d.csv", text)); });
  };
  const std::string h = "client,s_per_example,down_bps,up_bps\n";
  const std::string d = (dir / "d.csv").string();
  EXPECT_EQ(device_error("client,speed\n0,1\n"), d + ":1: the header must be 'client,s_per_example,down_bps,up_bps'");
  EXPECT_EQ(device_error(h), d + ": no rows after the header 'client,s_per_example,down_bps,up_bps'");
  EXPECT_EQ(device_error(h + "0,1,2\n"), d + ":2: 3 fields; a row has 4 (client,s_per_example,down_bps,up_bps)");
  EXPECT_EQ(device_error(h + "0,fast,2,3\n"), d + ":2: s_per_example 'fast' is not a finite number");
  EXPECT_EQ(device_error(h + "0,nan,2,3\n"), d + ":2: s_per_example 'nan' is not a finite number");
  EXPECT_EQ(device_error(h + "0,0,2,3\n"), d + ":2: s_per_example, down_bps and up_bps must be in [1e-12, 1e+12]");
  EXPECT_EQ(device_error(h + "0,1,1e300,3\n"), d + ":2: s_per_example, down_bps and up_bps must be in [1e-12, 1e+12]");
  EXPECT_EQ(device_error(h + "0.0,1,2,3\n"),
            d + ":2: client '0.0' where client 0 was expected (rows count 0, 1, 2, ... in order)");
  EXPECT_EQ(device_error(h + "0,1,2,3\n2,1,2,3\n"),
            d + ":3: client '2' where client 1 was expected (rows count 0, 1, 2, ... in order)");
  const auto availability_error = [&](const std::string& row) {
    return test::error_of([&] { read_availability_trace(write("a.csv", "client,period_s,intervals\n" + row)); });
  };
  const std::string a = (dir / "a.csv").string();
  EXPECT_EQ(availability_error("0,0,\n"), a + ":2: period_s 0 is not in (0, 1e9)");
  EXPECT_EQ(availability_error("0,100,10-200\n"), a + ":2: interval '10-200' is not within [0, 100] with begin < end");
  EXPECT_EQ(availability_error("0,100,20-10\n"), a + ":2: interval '20-10' is not within [0, 100] with begin < end");
  EXPECT_EQ(availability_error("0,100,10-30;20-40\n"),
            a + ":2: interval '20-40' overlaps or precedes the one before it (intervals are sorted and disjoint)");
  EXPECT_EQ(availability_error("0,100,10\n"), a + ":2: interval '10' is not begin-end (seconds)");
  EXPECT_EQ(availability_error("0,100,0.0000001-0.0000002\n"),
            a + ":2: interval '0.0000001-0.0000002' is shorter than a microsecond (the clock's unit)");
  // An exponent's sign is not the dash.
  EXPECT_EQ(read_availability_trace(write("e.csv", "client,period_s,intervals\n0,100,1e-5-5e1\n"))[0].intervals,
            (std::vector<std::pair<SimTime, SimTime>>{{10, 50 * kS}}));
  EXPECT_NE(test::error_of([&] { read_device_trace((dir / "missing.csv").string()); }).find("missing.csv"),
            std::string::npos);
  EXPECT_EQ(test::error_of([&] { read_device_trace(dir.string()); }),
            dir.string() + ": is a directory; device trace must be a regular file");
}

TEST_F(ClockTraces, TheConfigTurnsTheClockOnAndRefusesSettingsWithoutIt) {
  const auto clock_of = [&](const std::string& yaml) {
    Config c = parse_config(yaml, "e.yaml");
    c.resolve(experiment_schema());
    return SimulatedClock::from_config(c);
  };
  EXPECT_EQ(clock_of("rounds: 1\n"), nullptr);
  EXPECT_EQ(test::error_of([&] { clock_of("cohort:\n  deadline_s: 5\n"); }),
            "e.yaml:2:15: cohort.deadline_s needs the simulated clock; set clients.speed.distribution");
  const std::string device = write("d.csv", "client,s_per_example,down_bps,up_bps\n0,0.5,1e6,1e6\n");
  EXPECT_EQ(test::error_of([&] { clock_of("clients:\n  speed: {distribution: constant}\n  trace: {device: " + device + "}\n"); }),
            "e.yaml:3:19: clients.trace.device is set but neither clients.speed.distribution nor "
            "clients.network.distribution is trace");
  EXPECT_EQ(test::error_of([&] { clock_of("clients:\n  speed: {distribution: trace}\n"); }),
            "e.yaml:2:25: clients.speed.distribution is trace: set clients.trace.device (a CSV file)");
  // Any clock setting without the clock would be ignored: refused.
  EXPECT_EQ(test::error_of([&] { clock_of("clients:\n  availability: {drop_on_leave: true}\n"); }),
            "e.yaml:2:33: clients.availability.drop_on_leave needs the simulated clock; set clients.speed.distribution");
  EXPECT_EQ(test::error_of([&] { clock_of("cohort:\n  deadline_s: 1e-7\nclients:\n  speed: {distribution: constant}\n"); }),
            "e.yaml:2:15: cohort.deadline_s (1e-07 s) is shorter than a microsecond, the clock's unit");
  const auto traced = clock_of("clients:\n  speed: {distribution: trace}\n  trace: {device: " + device + "}\n");
  ASSERT_NE(traced, nullptr);
  EXPECT_EQ(traced->system(7).s_per_example, 0.5);
  EXPECT_NE(traced->describe().find("device trace " + device), std::string::npos);
  EXPECT_EQ(test::error_of([&] {
              clock_of("cohort: {sampling: poisson, over_selection: 0.5}\nclients:\n  speed: {distribution: constant}\n");
            }),
            "e.yaml:1:45: cohort.over_selection needs cohort.sampling uniform (a Poisson cohort has no size to keep)");
}

}  // namespace
}  // namespace fax
