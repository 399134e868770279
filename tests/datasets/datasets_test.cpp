#include <sys/stat.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <fax/datasets/idx.h>
#include <fax/datasets/partition.h>
#include <fax/datasets/readers.h>
#include <fax/datasets/registry.h>
#include <fax/io/config_yaml.h>

#include "../core/helpers.h"

namespace fax {
namespace {
namespace fs = std::filesystem;

class DatasetsTest : public test::SeededTest {
 protected:
  void SetUp() override {
    SeededTest::SetUp();
    dir = fs::temp_directory_path() / ("fax_datasets_test_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }

  // Writes an IDX file of unsigned bytes: header for `shape`, then `payload` bytes.
  std::string write_idx(const std::string& name, std::vector<uint32_t> shape, int64_t payload, bool gzip) {
    std::string bytes = {0, 0, 0x08, static_cast<char>(shape.size())};
    for (uint32_t d : shape) {
      for (int s = 24; s >= 0; s -= 8) bytes.push_back(static_cast<char>((d >> s) & 0xff));
    }
    for (int64_t i = 0; i < payload; ++i) bytes.push_back(static_cast<char>(i % 251));
    const std::string path = (dir / name).string();
    if (gzip) {
      gzFile f = gzopen(path.c_str(), "wb");
      gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
      gzclose(f);
    } else {
      std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    return path;
  }

  static std::string tff(const std::string& name) {
    const char* d = std::getenv("FAX_TEST_TFF_DIR");
    return d != nullptr ? std::string(d) + "/" + name : std::string();
  }

  fs::path dir;
};

TEST_F(DatasetsTest, IdxReadsCompressedAndPlainFiles) {
  for (bool gzip : {true, false}) {
    const at::Tensor t = read_idx(write_idx(gzip ? "a.gz" : "a", {3, 2, 2}, 12, gzip));
    EXPECT_EQ(t.sizes(), (at::IntArrayRef{3, 2, 2}));
    EXPECT_EQ(t.scalar_type(), at::kByte);
    EXPECT_EQ(t.flatten()[11].item<int64_t>(), 11);
  }
}

TEST_F(DatasetsTest, IdxErrorsNameTheFileAndTheProblem) {
  const std::string truncated = write_idx("t.gz", {10, 4}, 25, true);
  EXPECT_EQ(test::error_of([&] { read_idx(truncated); }),
            truncated + ": truncated: the header promises 40 bytes of data, the file holds 25");
  const std::string missing = (dir / "missing.gz").string();
  EXPECT_EQ(test::error_of([&] { read_idx(missing); }), missing + ": no such file");
  const std::string text = (dir / "text").string();
  std::ofstream(text) << "hello world";
  EXPECT_EQ(test::error_of([&] { read_idx(text); }), text + ": not an IDX file (bad magic number)");
  // A gzip header followed by garbage.
  const std::string corrupt = (dir / "corrupt.gz").string();
  std::ofstream(corrupt, std::ios::binary) << std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage-garbage", 25);
  const std::string message = test::error_of([&] { read_idx(corrupt); });
  EXPECT_EQ(message.rfind(corrupt + ": ", 0), 0u) << message;
  // Found by fuzz_idx: dimensions whose product overflows int64, and a huge header over a tiny file.
  const std::string overflow = write_idx("overflow", {0x7fffffff, 0x7fffffff, 0x7fffffff}, 4, false);
  EXPECT_EQ(test::error_of([&] { read_idx(overflow); }),
            overflow + ": IDX dimension 1 has size 2147483647: more than 17179869184 elements");
  const std::string promise = write_idx("promise", {1u << 16, 1u << 16}, 4, false);
  EXPECT_EQ(test::error_of([&] { read_idx(promise); }),
            promise + ": truncated: the header promises 4294967296 bytes of data, the file holds 4");
}

TEST_F(DatasetsTest, PartitionsAreDeterministicCompleteAndSkewed) {
  const at::Tensor labels = at::randint(0, 10, {5000}, at::kLong);
  auto classes_per_client = [&](const std::vector<at::Tensor>& parts) {
    double total = 0;
    for (const auto& p : parts) total += std::get<0>(at::_unique(labels.index_select(0, p))).numel();
    return total / static_cast<double>(parts.size());
  };
  for (const std::string kind : {"iid", "dirichlet", "shards"}) {
    PartitionOptions o;
    o.kind = kind;
    o.clients = 50;
    o.alpha = 0.1;
    o.min_examples = 5;
    const auto parts = partition(labels, 10, o);
    ASSERT_EQ(parts.size(), 50u);
    const at::Tensor all = std::get<0>(at::cat(parts).sort());
    EXPECT_TRUE(at::equal(all, at::arange(5000, at::kLong))) << kind << ": not every example exactly once";
    for (const auto& p : parts) EXPECT_GE(p.numel(), 5) << kind;
    const auto again = partition(labels, 10, o);
    for (size_t c = 0; c < parts.size(); ++c) EXPECT_TRUE(at::equal(parts[c], again[c])) << kind << ": not deterministic";
    o.seed = 1;
    EXPECT_FALSE(at::equal(partition(labels, 10, o)[0], parts[0])) << kind << ": the seed is ignored";
    const double spread = classes_per_client(parts);
    if (kind == "iid") {
      EXPECT_GT(spread, 9.5);
    } else if (kind == "dirichlet") {
      EXPECT_LT(spread, 6.0);
    } else {
      EXPECT_LE(spread, 3.0);
    }
  }
  PartitionOptions impossible;
  impossible.clients = 100;
  impossible.min_examples = 100;
  EXPECT_THROW(partition(labels, 10, impossible), Error);
  PartitionOptions unknown;
  unknown.kind = "random";
  EXPECT_EQ(test::error_of([&] { partition(labels, 10, unknown); }),
            "unknown partition 'random' (iid, dirichlet, label_dirichlet, shards, label_quantity, "
            "quantity_skew)");
}

// #C = k (Li et al. 2022): every client holds exactly k labels, its own i mod 10 among them; each
// label's examples are split evenly (sizes differ by at most one) among its holders; every example
// is used once (with 20 clients every label has a holder).
TEST_F(DatasetsTest, LabelQuantityGivesEachClientExactlyKLabels) {
  const at::Tensor labels = at::randint(0, 10, {5000}, at::kLong);
  for (int64_t k : {1, 2, 3}) {
    PartitionOptions o;
    o.kind = "label_quantity";
    o.clients = 20;
    o.labels_per_client = k;
    const auto parts = partition(labels, 10, o);
    ASSERT_EQ(parts.size(), 20u);
    EXPECT_TRUE(at::equal(std::get<0>(at::cat(parts).sort()), at::arange(5000, at::kLong))) << "k " << k;
    std::vector<std::vector<int64_t>> share(10);  // per label: each holder's count
    for (size_t i = 0; i < parts.size(); ++i) {
      const at::Tensor mine = labels.index_select(0, parts[i]);
      const at::Tensor held = std::get<0>(at::_unique(mine));
      ASSERT_EQ(held.numel(), k) << "client " << i;
      EXPECT_TRUE((held == static_cast<int64_t>(i % 10)).any().item<bool>()) << "client " << i << " lacks its own label";
      for (int64_t j = 0; j < k; ++j) {
        const int64_t label = held[j].item<int64_t>();
        share[label].push_back(mine.eq(label).sum().item<int64_t>());
      }
    }
    for (int64_t c = 0; c < 10; ++c) {
      ASSERT_FALSE(share[c].empty());
      const auto [lo, hi] = std::minmax_element(share[c].begin(), share[c].end());
      EXPECT_LE(*hi - *lo, 1) << "label " << c << " is not split evenly";
    }
  }
  PartitionOptions too_many;
  too_many.kind = "label_quantity";
  too_many.labels_per_client = 11;
  EXPECT_EQ(test::error_of([&] { partition(labels, 10, too_many); }),
            "label_quantity partition: data.labels_per_client must be 1 to the 10 classes (got 11)");
}

// label_dirichlet (the benchmark's p_k ~ Dir_N(alpha)): a partition of every example, the same for a
// seed; every client holds min_examples; clients' sizes differ (by a fifth at least at alpha 0.5,
// the cap of 1/N of the set keeps them from differing more); the labels concentrate as alpha
// shrinks: each client's largest label share, averaged over clients and seeds, above 1/2 for
// alpha 0.1 and near the uniform 1/10 for alpha 100.
TEST_F(DatasetsTest, LabelDirichletSplitsEachLabelAmongTheClients) {
  const at::Tensor labels = at::randint(0, 10, {20000}, at::kLong);
  PartitionOptions o;
  o.kind = "label_dirichlet";
  o.clients = 10;
  o.min_examples = 10;
  std::map<double, double> top_share;
  for (double alpha : {0.1, 0.5, 100.0}) {
    o.alpha = alpha;
    const int seeds = 10;
    for (int seed = 0; seed < seeds; ++seed) {
      o.seed = static_cast<uint64_t>(seed);
      const auto parts = partition(labels, 10, o);
      ASSERT_TRUE(at::equal(std::get<0>(at::cat(parts).sort()), at::arange(20000, at::kLong)));
      const auto again = partition(labels, 10, o);
      for (size_t j = 0; j < parts.size(); ++j) ASSERT_TRUE(at::equal(parts[j], again[j]));
      int64_t smallest = 20000, largest = 0;
      for (const auto& p : parts) {
        EXPECT_GE(p.numel(), 10);
        smallest = std::min(smallest, p.numel());
        largest = std::max(largest, p.numel());
        const at::Tensor counts = at::bincount(labels.index_select(0, p), {}, 10).to(at::kDouble);
        top_share[alpha] += (counts.max() / counts.sum()).item<double>() / (seeds * 10.0);
      }
      if (alpha == 0.5) {
        EXPECT_GT(largest, smallest + smallest / 5) << "seed " << seed;
      }
    }
  }
  EXPECT_GT(top_share[0.1], 0.5);
  EXPECT_LT(top_share[100.0], 0.15);
  EXPECT_GT(top_share[0.1], top_share[0.5]);
  EXPECT_GT(top_share[0.5], top_share[100.0]);
}

// Quantity skew: a partition of every example; client sizes spread as Dirichlet(beta) says: the
// coefficient of variation of sizes, averaged over seeds, near its expectation sqrt((n - 1) /
// (n beta + 1)) for n clients, and the label mix of every client near the whole set's.
TEST_F(DatasetsTest, QuantitySkewSpreadsClientSizesAsDirichletBeta) {
  const at::Tensor labels = at::randint(0, 10, {20000}, at::kLong);
  for (double beta : {0.5, 5.0}) {
    PartitionOptions o;
    o.kind = "quantity_skew";
    o.clients = 10;
    o.beta = beta;
    o.min_examples = 10;
    double cv = 0;
    const int seeds = 40;
    for (int seed = 0; seed < seeds; ++seed) {
      o.seed = static_cast<uint64_t>(seed);
      const auto parts = partition(labels, 10, o);
      ASSERT_TRUE(at::equal(std::get<0>(at::cat(parts).sort()), at::arange(20000, at::kLong)));
      std::vector<double> sizes;
      for (const auto& p : parts) {
        EXPECT_GE(p.numel(), 10);
        sizes.push_back(static_cast<double>(p.numel()));
      }
      const at::Tensor s = at::tensor(sizes, at::kDouble);
      cv += (s.std(/*unbiased=*/false) / s.mean()).item<double>() / seeds;
    }
    const double expected = std::sqrt(9.0 / (10.0 * beta + 1.0));
    EXPECT_NEAR(cv, expected, 0.25 * expected) << "beta " << beta;
  }
  PartitionOptions hopeless;
  hopeless.kind = "quantity_skew";
  hopeless.clients = 1000;
  hopeless.beta = 0.01;
  hopeless.min_examples = 15;
  EXPECT_NE(test::error_of([&] { partition(labels, 10, hopeless); }).find("never gave every client 15"), std::string::npos);
}

// Writes `records` CIFAR binary records to `name`: `label_bytes` label bytes (record r: label byte
// j is (r + j) mod `modulus`), then 3072 pixels, each channel c of record r at the value 10 r + c.
void write_cifar(const fs::path& name, int64_t records, int64_t label_bytes, int64_t modulus) {
  std::string bytes;
  for (int64_t r = 0; r < records; ++r) {
    for (int64_t j = 0; j < label_bytes; ++j) bytes.push_back(static_cast<char>((r + j) % modulus));
    for (int64_t c = 0; c < 3; ++c) bytes.append(1024, static_cast<char>(10 * r + c));
  }
  std::ofstream(name, std::ios::binary) << bytes;
}

TEST_F(DatasetsTest, Cifar10BinaryFilesReadBackExactly) {
  const fs::path folder = dir / "cifar-10-batches-bin";  // data.path may name the folder above it
  fs::create_directories(folder);
  for (int b = 1; b <= 5; ++b) write_cifar(folder / fmt::format("data_batch_{}.bin", b), 8, 1, 10);
  write_cifar(folder / "test_batch.bin", 6, 1, 10);
  PartitionOptions iid;
  iid.clients = 4;
  const auto data = load_cifar10(dir.string(), iid);
  EXPECT_EQ(data->num_clients(), 4);
  EXPECT_EQ(data->input_shape(), (std::vector<int64_t>{3, 32, 32}));
  EXPECT_EQ(data->num_classes(), 10);
  EXPECT_EQ(data->test().size(), 6);
  int64_t total = 0;
  std::set<int64_t> labels;
  for (int64_t i = 0; i < 4; ++i) {
    const Examples ex = data->client(i);
    total += ex.size();
    for (int64_t j = 0; j < ex.size(); ++j) labels.insert(ex.y[j].item<int64_t>());
  }
  EXPECT_EQ(total, 40);
  EXPECT_EQ(labels, (std::set<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  // Test record 5, channel 2: pixel 52, standardised with the blue channel's statistics.
  const Examples& test = data->test();
  EXPECT_EQ(test.y[5].item<int64_t>(), 5);
  EXPECT_NEAR(test.x[5][2][31][31].item<float>(), (52 / 255.0 - 0.4465) / 0.2616, 1e-5);
  EXPECT_NEAR(test.x[5][0][0][0].item<float>(), (50 / 255.0 - 0.4914) / 0.2470, 1e-5);

  // A truncated batch, a label past the classes, a missing file: one line naming the file.
  std::ofstream(folder / "data_batch_3.bin", std::ios::binary | std::ios::app) << "xyz";
  EXPECT_EQ(test::error_of([&] { load_cifar10(dir.string(), iid); }),
            fmt::format("{}: truncated or not a CIFAR binary file: 24587 bytes is not a whole number of 3073-byte "
                        "records", (folder / "data_batch_3.bin").string()));
  write_cifar(folder / "data_batch_3.bin", 12, 1, 12);
  EXPECT_EQ(test::error_of([&] { load_cifar10(dir.string(), iid); }),
            fmt::format("{}: label 11 is out of range (the data set has 10 classes)", (folder / "data_batch_3.bin").string()));
  fs::remove(folder / "data_batch_3.bin");
  EXPECT_EQ(test::error_of([&] { load_cifar10(folder.string(), iid); }),
            fmt::format("{}: no such file", (folder / "data_batch_3.bin").string()));
  EXPECT_EQ(test::error_of([&] { load_cifar10((dir / "nowhere").string(), iid); }),
            fmt::format("data.path: {}: no such folder", (dir / "nowhere").string()));
}

TEST_F(DatasetsTest, Cifar100FineAndCoarseLabels) {
  write_cifar(dir / "train.bin", 20, 2, 100);
  write_cifar(dir / "test.bin", 5, 2, 100);
  PartitionOptions iid;
  iid.clients = 3;
  const auto fine = load_cifar100(dir.string(), false, iid);
  const auto coarse = load_cifar100(dir.string(), true, iid);
  EXPECT_EQ(fine->num_classes(), 100);
  EXPECT_EQ(coarse->num_classes(), 20);
  // Record r: coarse label r, fine label r + 1.
  EXPECT_TRUE(at::equal(fine->test().y, at::arange(1, 6, at::kLong)));
  EXPECT_TRUE(at::equal(coarse->test().y, at::arange(0, 5, at::kLong)));
  write_cifar(dir / "test.bin", 25, 2, 100);  // coarse labels up to 24
  EXPECT_EQ(test::error_of([&] { load_cifar100(dir.string(), true, iid); }),
            fmt::format("{}: label 24 is out of range (the data set has 20 classes)", (dir / "test.bin").string()));
}

// LEAF's JSON files as LEAF writes them: `users`, `num_samples`, `user_data` of {x, y}.
void write_text(const fs::path& name, const std::string& text) {
  fs::create_directories(name.parent_path());
  std::ofstream(name, std::ios::binary) << text;
}

// A FEMNIST-like user: `n` images of 784 pixels, pixel j of image i at (i + j) / 1000, label i + k.
std::string femnist_user(const std::string& name, int n, int k) {
  std::string x, y;
  for (int i = 0; i < n; ++i) {
    x += i ? ", [" : "[";
    for (int j = 0; j < 784; ++j) x += fmt::format("{}{}", j ? "," : "", (i + j) / 1000.0);
    x += "]";
    y += fmt::format("{}{}", i ? ", " : "", i + k);
  }
  return fmt::format("\"{}\": {{\"x\": [{}], \"y\": [{}]}}", name, x, y);
}

TEST_F(DatasetsTest, LeafFemnistReadsBackExactly) {
  // Two training files (users in "users" order, not user_data's), hierarchies LEAF adds, one test file.
  write_text(dir / "train/b.json", "{\"users\": [\"u2\"], \"num_samples\": [2], \"hierarchies\": [[1, {\"a\": null}]], "
                                   "\"user_data\": {" + femnist_user("u2", 2, 5) + "}}");
  write_text(dir / "train/a.json", "{\"users\": [\"u1\", \"u0\"], \"num_samples\": [1, 3], \"user_data\": {" +
                                       femnist_user("u0", 3, 0) + ", " + femnist_user("u1", 1, 61) + "}}");
  write_text(dir / "test/all.json", "{\"users\": [\"u0\"], \"num_samples\": [2], \"user_data\": {" +
                                        femnist_user("u0", 2, 7) + "}}");
  LeafOptions o;
  o.path = dir.string();
  const auto data = load_leaf(o);
  ASSERT_EQ(data->num_clients(), 3);
  EXPECT_EQ(data->client_name(0), "u1");
  EXPECT_EQ(data->client_name(1), "u0");
  EXPECT_EQ(data->client_name(2), "u2");
  EXPECT_EQ(data->num_examples(0), 1);
  EXPECT_EQ(data->num_examples(1), 3);
  EXPECT_EQ(data->input_shape(), (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(data->num_classes(), 62);
  EXPECT_TRUE(at::equal(data->client(1).y, at::arange(0, 3, at::kLong)));
  EXPECT_TRUE(at::equal(data->client(2).y, at::arange(5, 7, at::kLong)));
  EXPECT_EQ(data->client(1).x[2][0][1][3].item<float>(), static_cast<float>((2 + 31) / 1000.0));
  EXPECT_EQ(data->test().size(), 2);
  EXPECT_TRUE(at::equal(data->test().y, at::arange(7, 9, at::kLong)));
  EXPECT_NE(data->describe().find("numeric features (FEMNIST, Synthetic)"), std::string::npos) << data->describe();
  o.classes = 10;
  EXPECT_EQ(test::error_of([&] { load_leaf(o); }),
            fmt::format("{}: user \"u1\": label 61 is out of range (data.classes is 10)", (dir / "train/a.json").string()));
}

TEST_F(DatasetsTest, LeafShakespeareIsNextCharacterPrediction) {
  // LEAF's 80-character vocabulary: '\n' is 0, ' ' is 1, 'a' is 53; '~' is outside it.
  write_text(dir / "train/s.json", "{\"users\": [\"KING\"], \"num_samples\": [2], \"user_data\": {\"KING\": "
                                   "{\"x\": [\"ab \", \"b~\\n\"], \"y\": [\"c\", \"a\"]}}}");
  write_text(dir / "test/s.json", "{\"users\": [\"KING\"], \"num_samples\": [1], \"user_data\": {\"KING\": "
                                  "{\"x\": [\"aaa\"], \"y\": [\"}\"]}}}");
  LeafOptions o;
  o.path = dir.string();
  const auto data = load_leaf(o);
  EXPECT_EQ(data->num_classes(), 81);
  EXPECT_EQ(data->input_shape(), (std::vector<int64_t>{3}));
  const Examples ex = data->client(0);
  EXPECT_EQ(ex.x.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(ex.x, at::tensor({53, 54, 1, 54, 80, 0}, at::kLong).view({2, 3})));
  EXPECT_TRUE(at::equal(ex.y, at::tensor({54, 1, 55, 80, 0, 53}, at::kLong).view({2, 3})));
  EXPECT_TRUE(at::equal(data->test().y, at::tensor({53, 53, 79}, at::kLong).view({1, 3})));
  EXPECT_NE(data->describe().find("1 characters outside LEAF's vocabulary"), std::string::npos) << data->describe();
  // Rows of another length than the first, and a label of two characters.
  write_text(dir / "test/s.json", "{\"users\": [\"K\"], \"num_samples\": [1], \"user_data\": {\"K\": "
                                  "{\"x\": [\"aaaa\"], \"y\": [\"a\"]}}}");
  EXPECT_EQ(test::error_of([&] { load_leaf(o); }),
            fmt::format("{}: user \"K\", x[0]: 4 characters where the data set's first row has 3",
                        (dir / "test/s.json").string()));
  write_text(dir / "test/s.json", "{\"users\": [\"K\"], \"num_samples\": [1], \"user_data\": {\"K\": "
                                  "{\"x\": [\"aaa\"], \"y\": [\"ab\"]}}}");
  EXPECT_EQ(test::error_of([&] { load_leaf(o); }),
            fmt::format("{}: user \"K\", y[0]: \"ab\" is not one character", (dir / "test/s.json").string()));
}

TEST_F(DatasetsTest, LeafSent140TweetsBecomeWordIds) {
  // Rows [id, date, query, user, text] (the id a number or a string); words split as LEAF does; a
  // vocabulary of the 3 most frequent training words: "good" (3), "!" (2), then "bad" before "day"
  // (1 each, byte order).
  const auto row = [](const std::string& text) { return "[1, \"Mon\", \"NO_QUERY\", \"me\", \"" + text + "\"]"; };
  write_text(dir / "train/t.json", "{\"users\": [\"me\", \"you\"], \"num_samples\": [2, 1], \"user_data\": {"
                                   "\"me\": {\"x\": [" + row("good good!") + ", " + row("bad day") + "], \"y\": [1, 0]}, "
                                   "\"you\": {\"x\": [" + row("good!") + "], \"y\": [1]}}}");
  write_text(dir / "test/t.json", "{\"users\": [\"me\"], \"num_samples\": [1], \"user_data\": {"
                                  "\"me\": {\"x\": [" + row("what a good day") + "], \"y\": [0]}}}");
  LeafOptions o;
  o.path = dir.string();
  o.vocab = 3;
  o.sequence_length = 3;
  const auto data = load_leaf(o);
  EXPECT_EQ(data->num_classes(), 2);
  EXPECT_EQ(data->input_shape(), (std::vector<int64_t>{3}));
  // good 2, ! 3, bad 4, day and what and a: 1 (other), padding 0; a tweet past 3 words is cut.
  EXPECT_TRUE(at::equal(data->client(0).x, at::tensor({2, 2, 3, 4, 1, 0}, at::kLong).view({2, 3})));
  EXPECT_TRUE(at::equal(data->client(1).x, at::tensor({2, 3, 0}, at::kLong).view({1, 3})));
  EXPECT_TRUE(at::equal(data->client(0).y, at::tensor({1, 0}, at::kLong)));
  EXPECT_TRUE(at::equal(data->test().x, at::tensor({1, 1, 2}, at::kLong).view({1, 3})));
  EXPECT_NE(data->describe().find("a vocabulary of 5 ids"), std::string::npos) << data->describe();
}

TEST_F(DatasetsTest, LeafBadInputIsOneLineNamingTheFileAndKey) {
  LeafOptions o;
  o.path = (dir / "nowhere").string();
  EXPECT_EQ(test::error_of([&] { load_leaf(o); }), fmt::format("data.path: {}: no such folder", o.path));
  o.path = dir.string();
  EXPECT_EQ(test::error_of([&] { load_leaf(o); }),
            fmt::format("data.path: {} has no train/ folder (LEAF's split step writes train/ and test/)", o.path));
  const std::string train = (dir / "train/a.json").string();
  const std::string good_test = "{\"users\": [\"t\"], \"num_samples\": [1], \"user_data\": {\"t\": {\"x\": [[1]], \"y\": [0]}}}";
  write_text(dir / "test/a.json", good_test);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"users\": []", "not valid JSON: line 1, column 13: syntax error while parsing object - unexpected end of "
                         "input; expected '}'"},
      {"[1, 2]", "a list where LEAF's schema has an object"},
      {"{\"users\": [], \"num_samples\": []}", "not a LEAF file: no \"user_data\" key at the top level"},
      {"{\"users\": {}, \"num_samples\": [], \"user_data\": {}}", "\"users\" is an object; LEAF's schema has a list of user names"},
      {"{\"users\": [\"a\"], \"num_samples\": [1], \"user_data\": {\"a\": {\"x\": [], \"y\": []}}}", "user \"a\" has no samples"},
      {"{\"users\": [\"a\"], \"num_samples\": [2], \"user_data\": {\"a\": {\"x\": [[1], [2]], \"y\": [0]}}}",
       "user \"a\" has 2 x rows but 1 y labels"},
      {"{\"users\": [\"a\"], \"num_samples\": [1], \"user_data\": {\"a\": {\"x\": [[1]], \"y\": [-1]}}}",
       "user \"a\", y[0]: label -1 is out of range"},
      {"{\"users\": [\"a\"], \"num_samples\": [1], \"user_data\": {\"a\": {\"x\": [[1]], \"y\": [0.5]}}}",
       "user \"a\", y[0]: label 0.5 is not a whole number"},
      {"{\"users\": [\"a\"], \"num_samples\": [3], \"user_data\": {\"a\": {\"x\": [[1]], \"y\": [0]}}}",
       "user \"a\" has 1 samples, \"num_samples\" says 3"},
      {"{\"users\": [\"a\", \"b\"], \"num_samples\": [1, 1], \"user_data\": {\"a\": {\"x\": [[1]], \"y\": [0]}}}",
       "\"users\" names 2 users but \"user_data\" holds 1"},
      {"{\"users\": [\"a\"], \"num_samples\": [1], \"user_data\": {\"a\": {\"x\": [[1, 2]], \"y\": [0]}}}",
       "test/a.json: user \"t\", x[0]: 1 numbers where the data set's first row has 2"},
      {"{\"users\": [\"a\"], \"num_samples\": [1], \"user_data\": {\"a\": {\"x\": [\"1.jpg\"], \"y\": [0]}}}",
       "user \"a\": x holds strings but y numbers (LEAF's CelebA, whose x are image file names, is not supported; "
       "fax reads FEMNIST, Shakespeare, Sent140 and Synthetic)"},
      {"{\"users\": [\"a\"], \"num_samples\": [1], \"user_data\": {\"a\": {\"x\": [[[1]]], \"y\": [0]}}}",
       "user \"a\", x[0]: a list where LEAF's schema has numbers"},
      {"{\"users\": [\"a\"], \"num_samples\": [1], \"user_data\": {\"a\": {\"x\": [[1e39]], \"y\": [0]}}}",
       "user \"a\", x[0]: feature 1e+39 is not a finite float"},
      {"{\"users\": [\"a\"], \"num_samples\": [1], \"user_data\": {\"a\": {\"x\": [[1]], \"y\": [1e20]}}}",
       "user \"a\", y[0]: label 1e+20 is out of range"},
      // A name with a line break stays on one line.
      {"{\"users\": [\"a\\nb\"], \"num_samples\": [1], \"user_data\": {\"a\\nb\": {\"x\": [], \"y\": []}}}",
       "user \"a\\nb\" has no samples"},
  };
  for (const auto& [text, message] : cases) {
    write_text(dir / "train/a.json", text);
    const std::string error = test::error_of([&] { load_leaf(o); });
    EXPECT_NE(error.find(message), std::string::npos) << text << "\n" << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    if (message.rfind("test/", 0) != 0) {
      EXPECT_EQ(error.rfind(train, 0), 0u) << error;
    }
  }
  // A .json entry that cannot be read (a dangling link) is an error; a pipe or folder named .json
  // is not data, and the size estimate does not open it (which would block).
  write_text(dir / "train/a.json", good_test);
  fs::create_symlink(dir / "nowhere.json", dir / "train/b.json");
  EXPECT_EQ(test::error_of([&] { load_leaf(o); }),
            fmt::format("{}: cannot read: No such file or directory", (dir / "train/b.json").string()));
  fs::remove(dir / "train/b.json");
  ASSERT_EQ(::mkfifo((dir / "train/0.json").c_str(), 0600), 0);
  fs::create_directories(dir / "train/c.json");
  EXPECT_EQ(load_leaf(o)->num_clients(), 1);
  Config config = parse_config(fmt::format("data: {{path: {}}}", dir.string()), "test");
  Schema schema;
  schema.add_all(find_dataset("leaf").keys, "data");
  config.resolve(schema);
  EXPECT_GT(find_dataset("leaf").estimate_bytes(config), 0);
  fs::remove(dir / "train/0.json");
  fs::remove(dir / "train/c.json");
  // A user in two training files.
  write_text(dir / "train/a.json", good_test);
  write_text(dir / "train/b.json", good_test);
  EXPECT_EQ(test::error_of([&] { load_leaf(o); }),
            fmt::format("{}: user \"t\" is also in {}", (dir / "train/b.json").string(), train));
}

TEST_F(DatasetsTest, FashionMnistFromTheDebianPackage) {
  const std::string path = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(path)) GTEST_SKIP() << path << " is missing: install dataset-fashion-mnist (scripts/install-deps.sh)";
  PartitionOptions o;
  o.kind = "dirichlet";
  o.clients = 600;
  o.alpha = 0.5;
  o.min_examples = 10;
  const auto data = load_fashion_mnist(path, o);
  EXPECT_EQ(data->num_clients(), 600);
  EXPECT_EQ(data->input_shape(), (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(data->num_classes(), 10);
  int64_t total = 0;
  for (int64_t c = 0; c < 600; ++c) total += data->num_examples(c);
  EXPECT_EQ(total, 60000);
  EXPECT_EQ(data->test().x.sizes(), (at::IntArrayRef{10000, 1, 28, 28}));
  EXPECT_NEAR(data->test().x.mean().item<double>(), 0.0, 0.05);
  EXPECT_NEAR(data->test().x.std().item<double>(), 1.0, 0.05);
  const Examples c7 = data->client(7);
  EXPECT_EQ(c7.size(), data->num_examples(7));
  EXPECT_EQ(c7.y.scalar_type(), at::kLong);
  EXPECT_EQ(test::error_of([&] { load_fashion_mnist((dir / "nowhere").string(), o); }).find((dir / "nowhere").string() + ": no such directory"), 0u);
}

TEST_F(DatasetsTest, FashionMnistRejectsTruncatedFiles) {
  // A directory whose training images stop early.
  write_idx("train-images-idx3-ubyte.gz", {100, 28, 28}, 1000, true);
  write_idx("train-labels-idx1-ubyte.gz", {100}, 100, true);
  const std::string message = test::error_of([&] { load_fashion_mnist(dir.string(), PartitionOptions{}); });
  EXPECT_NE(message.find("train-images-idx3-ubyte.gz: truncated"), std::string::npos) << message;
}

TEST_F(DatasetsTest, TffHdf5WrittenByH5pyReadsWithItsClients) {
  const std::string train = tff("emnist_train.h5");
  ASSERT_FALSE(train.empty()) << "FAX_TEST_TFF_DIR is not set: run through ctest (fixture datasets.tff_fixture)";
  TffHdf5Options o;
  o.path = train;
  o.test_path = tff("emnist_test.h5");
  const auto data = load_tff_hdf5(o);
  ASSERT_EQ(data->num_clients(), 3);
  EXPECT_EQ(data->num_examples(0), 5);  // clients in name order: f0000_12, f0001_04, f0002_33
  EXPECT_EQ(data->num_examples(1), 3);
  EXPECT_EQ(data->num_examples(2), 7);
  EXPECT_EQ(data->input_shape(), (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(data->client(2).x.scalar_type(), at::kFloat);
  EXPECT_EQ(data->client(2).y.scalar_type(), at::kLong);
  EXPECT_EQ(data->test().size(), 6);
  // Without a test file, each client holds out a share of its own examples.
  o.test_path.clear();
  o.test_fraction = 0.3;
  const auto held = load_tff_hdf5(o);
  EXPECT_EQ(held->num_examples(2), 5);
  EXPECT_EQ(held->test().size(), 1 + 1 + 2);
  o.x = "image";
  const std::string message = test::error_of([&] { load_tff_hdf5(o); });
  EXPECT_NE(message.find("client 'f0000_12' has no feature 'image' (members: label, pixels)"), std::string::npos) << message;
  o.path = (dir / "absent.h5").string();
  EXPECT_EQ(test::error_of([&] { load_tff_hdf5(o); }), o.path + ": missing, unreadable or not an HDF5 file");
  o.path = tff("hollow.h5");
  o.x = "pixels";
  EXPECT_EQ(test::error_of([&] { load_tff_hdf5(o); }),
            o.path + ":/examples/c0/pixels: corrupt: the shape claims 17179869184 bytes, the file stores 0");
  o.path = tff("ragged.h5");
  EXPECT_EQ(test::error_of([&] { load_tff_hdf5(o); }),
            o.path + ": client 'b' has inputs of shape [1, 14, 14], the first training client [1, 28, 28]");
}

TEST_F(DatasetsTest, TextFromAFolderATabFileAndTffStrings) {
  fs::create_directories(dir / "corpus");
  std::ofstream(dir / "corpus" / "b.txt") << std::string(100, 'b') + "abc";
  std::ofstream(dir / "corpus" / "a.txt") << "the quick brown fox jumps over the lazy dog, again and again and again";
  std::ofstream(dir / "corpus" / "tiny.txt") << "hi";
  TextOptions o;
  o.path = (dir / "corpus").string();
  o.sequence_length = 8;
  o.test_fraction = 0.25;
  const TextDataset folder(o);
  EXPECT_EQ(folder.client_names(), (std::vector<std::string>{"a.txt", "b.txt"})) << "tiny.txt has no full window";
  EXPECT_FALSE(folder.byte_level());
  const Examples a = folder.client(0);
  // 71 characters -> 7 windows of 9; 25% (1) held out.
  EXPECT_EQ(a.x.sizes(), (at::IntArrayRef{6, 8}));
  EXPECT_TRUE(at::equal(a.x[0].narrow(0, 1, 7), a.y[0].narrow(0, 0, 7))) << "labels are the inputs shifted by one";
  EXPECT_EQ(folder.encode("t")[0], folder.client(0).x[0][0].item<int64_t>());
  EXPECT_EQ(folder.input_shape(), (std::vector<int64_t>{8}));

  o.max_vocab = 5;
  const TextDataset bytes(o);
  EXPECT_TRUE(bytes.byte_level());
  EXPECT_EQ(bytes.num_classes(), 256);
  EXPECT_EQ(bytes.client(0).x[0][0].item<int64_t>(), 't');

  std::ofstream(dir / "lines.tsv") << "alice\thello there, how are you\nbob\tfine thanks\nalice\tand you?\n";
  o.path = (dir / "lines.tsv").string();
  o.max_vocab = 256;
  o.sequence_length = 4;
  const TextDataset lines(o);
  EXPECT_EQ(lines.client_names(), (std::vector<std::string>{"alice", "bob"}));
  std::ofstream(dir / "bad.tsv") << "alice\thello\nno tab here\n";
  o.path = (dir / "bad.tsv").string();
  EXPECT_EQ(test::error_of([&] { TextDataset t(o); }), o.path + ":2: expected 'client<TAB>text' lines");

  const std::string shakespeare = tff("shakespeare.h5");
  ASSERT_FALSE(shakespeare.empty());
  o.path = shakespeare;
  o.sequence_length = 10;
  const TextDataset plays(o);
  EXPECT_EQ(plays.client_names(), (std::vector<std::string>{"ROMEO_AND_JULIET_ROMEO", "THE_TRAGEDY_OF_KING_LEAR_KENT"}));
}

TEST_F(DatasetsTest, SyntheticTokensAreDeterministicAndInVocabulary) {
  SyntheticTokensOptions o;
  o.clients = 4;
  o.sequences = 10;
  o.sequence_length = 12;
  o.vocab = 20;
  const auto a = make_synthetic_tokens(o);
  const auto b = make_synthetic_tokens(o);
  EXPECT_EQ(a->num_clients(), 4);
  EXPECT_EQ(a->num_examples(0), 9);
  EXPECT_EQ(a->test().size(), 4);
  EXPECT_TRUE(at::equal(a->client(3).x, b->client(3).x));
  EXPECT_LT(a->client(3).x.max().item<int64_t>(), 20);
  EXPECT_TRUE(at::equal(a->client(1).x[0].narrow(0, 1, 11), a->client(1).y[0].narrow(0, 0, 11)));
}

TEST_F(DatasetsTest, RegistryDocumentsEveryKey) {
  for (const auto& entry : dataset_registry()) {
    EXPECT_FALSE(entry.description.empty());
    for (const auto& key : entry.keys) EXPECT_FALSE(key.doc.empty()) << entry.name << "." << key.name;
  }
  EXPECT_EQ(test::error_of([] { find_dataset("imagenet"); }),
            "unknown data set 'imagenet' (available: synthetic, fmnist, cifar10, cifar100, leaf, tff_hdf5, text, synthetic_tokens)");
}

}  // namespace
}  // namespace fax
