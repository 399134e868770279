#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <iterator>

#include <fax/io/files.h>
#include <fax/io/run_log.h>

#include "helpers.h"

namespace fax {
namespace {

class RunLogTest : public test::SeededTest {
 protected:
  void SetUp() override {
    SeededTest::SetUp();
    dir = std::filesystem::temp_directory_path() /
          ("fax_run_log_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  std::filesystem::path dir;
};

TEST_F(RunLogTest, MetricsEnvConfigAndCheckpointsRoundTrip) {
  const std::string path = (dir / "run.h5").string();
  const TensorTree state{{"params/w", at::randn({3, 2})}, {"params/b", at::randn({2}, at::kDouble)},
                         {"extra/step", at::tensor({int64_t{7}})}};
  {
    RunLog log(path, "rounds: 3\n", {{"zeta", "last-alphabetically"}, {"alpha", "1"}});
    log.append(1, {{"train/loss", 2.0}});
    log.append(2, {{"train/loss", 1.5}, {"eval/accuracy", 0.5}});
    log.checkpoint(3, state);
    log.append(3, {{"train/loss", 1.0}});  // commits the round with its checkpoint
  }
  const RunLogReader reader(path);
  EXPECT_EQ(reader.config(), "rounds: 3\n");
  const StringPairs env = reader.env();
  ASSERT_EQ(env.size(), 3u);
  EXPECT_EQ(StringPairs(env.begin(), env.begin() + 2), (StringPairs{{"zeta", "last-alphabetically"}, {"alpha", "1"}}));
  EXPECT_EQ(env[2].first, "run_id");
  EXPECT_EQ(env[2].second.size(), 16u);
  EXPECT_EQ(reader.env("run_id"), env[2].second);
  EXPECT_EQ(reader.rounds(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(reader.metric_names(), (std::vector<std::string>{"eval/accuracy", "train/loss"}));
  EXPECT_EQ(reader.metric("train/loss"), (std::vector<double>{2.0, 1.5, 1.0}));
  const auto accuracy = reader.metric("eval/accuracy");
  ASSERT_EQ(accuracy.size(), 3u);
  EXPECT_TRUE(std::isnan(accuracy[0]));
  EXPECT_DOUBLE_EQ(accuracy[1], 0.5);
  EXPECT_TRUE(std::isnan(accuracy[2]));
  EXPECT_EQ(reader.checkpoint_rounds(), (std::vector<int64_t>{3}));
  const TensorTree back = reader.checkpoint(3);
  EXPECT_TRUE(bitwise_equal(back, state)) << "names, order, dtypes or bytes changed";
  EXPECT_THROW(reader.checkpoint(4), Error);
}

// keep = 2: the log links the two newest checkpoints; an older file goes with the commit that
// drops its link, not before (until then the log on disk still links it).
TEST_F(RunLogTest, KeepsTheNewestCheckpoints) {
  const std::string path = (dir / "run.h5").string();
  const auto files = [&] {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path + ".checkpoints")) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  };
  RunLog log(path, "", {});
  for (int64_t r = 1; r <= 4; ++r) {
    log.checkpoint(r, {{"params/w", at::full({2}, static_cast<double>(r))}}, 2);
    if (r == 3) {
      EXPECT_EQ(files().size(), 3u) << "round 1's file went before the log stopped linking it";
    }
    log.append(r, {});
  }
  const RunLogReader reader(path);
  EXPECT_EQ(reader.checkpoint_rounds(), (std::vector<int64_t>{3, 4}));
  const std::string id = reader.env("run_id");
  EXPECT_EQ(files(), (std::vector<std::string>{RunLogReader::checkpoint_name(3, id), RunLogReader::checkpoint_name(4, id)}));
  EXPECT_TRUE(at::equal(reader.checkpoint(4).at("params/w"), at::full({2}, 4.0)));
}

TEST_F(RunLogTest, PerClientRows) {
  const std::string path = (dir / "clients.h5").string();
  RunLog log(path, "", {});
  auto ids = [](std::vector<int64_t> v) { return at::tensor(v); };
  log.append_clients(ids({4, 9, 2}), {{"loss", at::tensor({0.5f, 0.25f, 1.0f})}});
  log.append_clients(ids({1, 3, 8}), {{"loss", at::tensor({0.1f, 0.2f, 0.3f})}});
  EXPECT_THROW(log.append_clients(ids({1, 2, 3}), {{"loss", at::zeros({2})}}), Error);
  log.commit();
  const RunLogReader reader(path);
  EXPECT_TRUE(at::equal(reader.dataset("/clients/id"), ids({4, 9, 2, 1, 3, 8}).view({2, 3})));
  EXPECT_TRUE(at::allclose(reader.dataset("/clients/loss"), at::tensor({0.5, 0.25, 1.0, 0.1, 0.2, 0.3}, at::kDouble).view({2, 3})));
}

// Poisson sampling draws cohorts of any size: rows are padded to the widest (ids -1, values NaN),
// and a resume cut back to an earlier round sizes the log to the rows it keeps.
TEST_F(RunLogTest, PerClientRowsOfCohortsOfVaryingSize) {
  const std::string path = (dir / "ragged.h5").string();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto ids = [](std::vector<int64_t> v) { return at::tensor(v, at::kLong); };
  {
    RunLog log(path, "", {});
    log.append_clients(ids({4, 9}), {{"loss", at::tensor({0.5, 0.25})}});
    log.append(1, {});
    log.append_clients(ids({}), {});  // a round without clients reports no metric
    log.append(2, {});
    log.append_clients(ids({1, 3, 8}), {{"loss", at::tensor({0.1, 0.2, 0.3})}, {"bits", at::tensor({8., 8., 8.})}});
    log.append(3, {});
  }
  const RunLogReader reader(path);
  EXPECT_TRUE(at::equal(reader.dataset("/clients/id"), ids({4, 9, -1, -1, -1, -1, 1, 3, 8}).view({3, 3})));
  const at::Tensor loss = reader.dataset("/clients/loss");
  const at::Tensor expected = at::tensor({0.5, 0.25, nan, nan, nan, nan, 0.1, 0.2, 0.3}).view({3, 3});
  EXPECT_TRUE(at::allclose(loss, expected, 0, 0, /*equal_nan=*/true)) << loss;
  EXPECT_TRUE(at::isnan(reader.dataset("/clients/bits").narrow(0, 0, 2)).all().item<bool>());
  {
    RunLog log = RunLog::resume(path, 2);
    log.append_clients(ids({7}), {{"loss", at::tensor({0.7})}});
    log.append(3, {});
  }
  EXPECT_TRUE(at::equal(RunLogReader(path).dataset("/clients/id"), ids({4, 9, -1, -1, 7, -1}).view({3, 2})));
}

TEST_F(RunLogTest, AnExistingLogIsReplacedByTheFirstAppendOnly) {
  const std::string path = (dir / "run.h5").string();
  const TensorTree state{{"params/w", at::ones({2})}};
  {
    RunLog old(path, "old\n", {});
    old.checkpoint(1, state);
    old.append(1, {{"train/loss", 1.0}});
  }
  const auto checkpoints = [&] {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path + ".checkpoints")) names.push_back(e.path().filename());
    return names;
  };
  const std::vector<std::string> old_checkpoints = checkpoints();
  {
    RunLog fresh(path, "new\n", {});
    EXPECT_EQ(RunLogReader(path).config(), "old\n") << "replaced before a round was done";
    fresh.checkpoint(1, state);
    EXPECT_EQ(RunLogReader(path).config(), "old\n");
    EXPECT_TRUE(bitwise_equal(RunLogReader(path).checkpoint(1), state)) << "the old log lost its checkpoint";
    fresh.append(1, {{"train/loss", 2.0}});
  }
  const RunLogReader reader(path);
  EXPECT_EQ(reader.config(), "new\n");
  EXPECT_EQ(reader.metric("train/loss"), std::vector<double>{2.0});
  const std::vector<std::string> now = checkpoints();
  ASSERT_EQ(now.size(), 1u) << "the replaced run's checkpoints were kept";
  EXPECT_NE(now, old_checkpoints);
  EXPECT_EQ(now.front(), RunLogReader::checkpoint_name(1, reader.env("run_id")));
}

TEST_F(RunLogTest, CheckpointsAreReadOnlyFromTheirOwnFolderAndRun) {
  const std::string path = (dir / "run.h5").string();
  const TensorTree state{{"params/w", at::ones({2})}};
  {
    RunLog log(path, "", {});
    log.checkpoint(1, state);
    log.append(1, {});
  }
  const std::string id = RunLogReader(path).env("run_id");
  const std::string file = path + ".checkpoints/" + RunLogReader::checkpoint_name(1, id);
  // Another run's checkpoint under this run's name.
  const std::string other = (dir / "other.h5").string();
  {
    RunLog log(other, "", {});
    log.checkpoint(1, {{"params/w", at::zeros({2})}});
    log.append(1, {});
  }
  std::filesystem::copy_file(other + ".checkpoints/" + RunLogReader::checkpoint_name(1, RunLogReader(other).env("run_id")),
                             file, std::filesystem::copy_options::overwrite_existing);
  const std::string refused = test::error_of([&] { RunLogReader(path).checkpoint(1); });
  EXPECT_NE(refused.find("not round 1 of this run (" + id + ")"), std::string::npos) << refused;
  // The log moved without its folder.
  std::filesystem::create_directories(dir / "moved");
  std::filesystem::copy_file(path, dir / "moved" / "run.h5");
  const std::string missing = test::error_of([&] { RunLogReader((dir / "moved" / "run.h5").string()).checkpoint(1); });
  EXPECT_NE(missing.find("the checkpoint of round 1 is missing"), std::string::npos) << missing;
}

TEST_F(RunLogTest, FilesAreReplacedWholeAndLockedAgainstASecondWriter) {
  const std::string path = (dir / "out.txt").string();
  write_file_atomically(path, std::string("first"));
  write_file_atomically(path, std::string("second"));
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "second");
  // A directory in the way: refused, nothing left behind.
  std::filesystem::create_directories(dir / "taken");
  EXPECT_THROW(write_file_atomically((dir / "taken").string(), std::string("x")), Error);
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  }
  // A temporary of a writer killed mid-write goes when the file is next locked.
  std::ofstream(dir / ".out.txt.tmp-1-dead") << "partial";
  {
    const FileLock lock(path, "test writer");
    EXPECT_FALSE(std::filesystem::exists(dir / ".out.txt.tmp-1-dead"));
    const std::string refused = test::error_of([&] { FileLock second(path, "second writer"); });
    EXPECT_NE(refused.find("is in use by test writer (pid"), std::string::npos) << refused;
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".lock")) << "the lock file outlived its lock";
  EXPECT_NO_THROW(FileLock(path, "after"));
  // Outputs that are inputs or not regular files.
  EXPECT_THROW(check_output_path(path, {path}, "the output"), Error);
  EXPECT_THROW(check_output_path((dir / "." / "out.txt").string(), {path}, "the output"), Error);
  EXPECT_THROW(check_output_path("/dev/null", {}, "the output"), Error);
  EXPECT_THROW(check_output_path(dir.string(), {}, "the output"), Error);
  EXPECT_NO_THROW(check_output_path((dir / "new.h5").string(), {path}, "the output"));
}

TEST_F(RunLogTest, UnusableFilesAreUserErrors) {
  EXPECT_THROW(RunLog((dir / "missing" / "run.h5").string(), "", {}), Error);
  const std::string not_hdf5 = (dir / "text.h5").string();
  std::ofstream(not_hdf5) << "hello";
  EXPECT_THROW(RunLogReader reader(not_hdf5), Error);
  EXPECT_THROW(RunLogReader reader((dir / "absent.h5").string()), Error);
}

}  // namespace
}  // namespace fax
