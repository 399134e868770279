// A minimal data set plugin to copy: a CSV file of `client,label,feature,feature,...` rows (lines
// starting with '#' are comments), each client's rows in file order, the last `test_fraction` of
// each client's rows held out for the test split. Rename the class, `name` and the file, declare
// your settings, read your format in the constructor, and build with fax_add_plugin.

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <ATen/ATen.h>

#include <fax/fax.h>

namespace {

class CsvDataset final : public fax::FederatedDataset {
 public:
  // data.name in an experiment; the library must be called fax_<name>.so.
  static constexpr const char* name = "example_dataset";
  static constexpr const char* description = "template data set: client,label,features... rows of a CSV file";

  struct Options {
    std::string path;
    double test_fraction = 0.2;
  };

  // The keys under "data." in an experiment, bound to the members.
  static const fax::Settings<Options>& settings() {
    static const fax::Settings<Options> table =
        fax::Settings<Options>()
            .add("path", &Options::path, "the CSV file")
            .add("test_fraction", &Options::test_fraction, "share of each client's rows held out", fax::in(0, 0.9));
    return table;
  }

  // Made once per process from the experiment. Everything is read and checked here: a bad file
  // stops the run before it starts, with a fax::Error naming the file and line.
  explicit CsvDataset(const fax::Config& config) : o_(settings().read(config, "data")) {
    std::error_code ec;  // a folder or a pipe is not data (opening a pipe would wait for a writer)
    FAX_CHECK(std::filesystem::exists(o_.path, ec), "data.path: {}: no such file", o_.path);
    FAX_CHECK(std::filesystem::is_regular_file(o_.path, ec), "data.path: {}: not a regular file", o_.path);
    std::ifstream in(o_.path, std::ios::binary);
    FAX_CHECK(in, "data.path: {}: cannot open the file", o_.path);
    std::map<std::string, size_t> index;  // client name -> position in names_
    std::vector<std::vector<float>> features;
    std::vector<std::vector<int64_t>> labels;
    std::string line;
    for (int64_t number = 1; std::getline(in, line); ++number) {
      if (number == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // a UTF-8 byte order mark
      if (!line.empty() && line.back() == '\r') line.pop_back();                // Windows line ends
      if (line.empty() || line[0] == '#') continue;
      std::vector<std::string> fields(1);
      for (const char c : line) {
        if (c == ',') fields.emplace_back();
        else fields.back() += c;
      }
      const std::string where = fmt::format("{}:{}", o_.path, number);
      FAX_CHECK(fields.size() >= 3, "{}: a row needs a client, a label and features", where);
      if (width_ < 0) width_ = static_cast<int64_t>(fields.size()) - 2;
      FAX_CHECK(static_cast<int64_t>(fields.size()) - 2 == width_, "{}: {} features where the first row has {}", where,
                fields.size() - 2, width_);
      const auto [it, fresh] = index.emplace(fields[0], names_.size());
      if (fresh) {
        names_.push_back(fields[0]);
        features.emplace_back();
        labels.emplace_back();
      }
      labels[it->second].push_back(parse_label(fields[1], where));
      for (size_t f = 2; f < fields.size(); ++f) features[it->second].push_back(parse_number(fields[f], where));
    }
    FAX_CHECK(!names_.empty(), "{}: no rows", o_.path);
    std::vector<at::Tensor> train_x, train_y, test_x, test_y;
    int64_t pooled = 0;
    for (size_t c = 0; c < names_.size(); ++c) {
      const int64_t n = static_cast<int64_t>(labels[c].size());
      const int64_t held = static_cast<int64_t>(std::floor(o_.test_fraction * static_cast<double>(n)));
      FAX_CHECK(n - held >= 1, "{}: client {} has no training rows left", o_.path, names_[c]);
      const at::Tensor x = at::tensor(features[c], at::kFloat).view({n, width_});
      const at::Tensor y = at::tensor(labels[c], at::kLong);
      train_x.push_back(x.narrow(0, 0, n - held));
      train_y.push_back(y.narrow(0, 0, n - held));
      spans_.push_back({pooled, n - held});
      pooled += n - held;
      test_x.push_back(x.narrow(0, n - held, held));
      test_y.push_back(y.narrow(0, n - held, held));
      for (int64_t label : labels[c]) classes_ = std::max(classes_, label + 1);
    }
    // Every client's training rows in one pool, client after client: local training then gathers
    // its batches straight from it (pool(), client_rows()), without copying each client out first.
    pool_ = {at::cat(train_x), at::cat(train_y)};
    test_ = {at::cat(test_x), at::cat(test_y)};
  }

  std::string describe() const override {
    return fmt::format("example_dataset({}): {} clients, {} features, {} classes", o_.path, names_.size(), width_,
                       classes_);
  }
  int64_t num_clients() const override { return static_cast<int64_t>(spans_.size()); }
  int64_t num_examples(int64_t client) const override { return spans_.at(client).count; }
  // Views of the pool: no copy.
  fax::Examples client(int64_t client) const override {
    const Span& s = spans_.at(client);
    return {pool_.x.narrow(0, s.first, s.count), pool_.y.narrow(0, s.first, s.count)};
  }
  const fax::Examples* pool() const override { return &pool_; }
  at::Tensor client_rows(int64_t client) const override {
    const Span& s = spans_.at(client);
    return at::arange(s.first, s.first + s.count, at::kLong);
  }
  std::string client_name(int64_t client) const override { return names_.at(client); }
  const fax::Examples& test() const override { return test_; }
  std::vector<int64_t> input_shape() const override { return {width_}; }
  int64_t num_classes() const override { return classes_; }

 private:
  static float parse_number(const std::string& text, const std::string& where) {
    char* end = nullptr;
    const float v = std::strtof(text.c_str(), &end);
    FAX_CHECK(!text.empty() && end == text.c_str() + text.size() && std::isfinite(v), "{}: '{}' is not a finite number",
              where, text);
    return v;
  }
  static int64_t parse_label(const std::string& text, const std::string& where) {
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    FAX_CHECK(!text.empty() && end == text.c_str() + text.size() && v >= 0 && v < (1 << 20),
              "{}: label '{}' is not a class (0, 1, ...)", where, text);
    return v;
  }

  Options o_;
  int64_t width_ = -1;
  int64_t classes_ = 0;
  std::vector<std::string> names_;
  struct Span {
    int64_t first, count;  // a client's rows of pool_
  };
  std::vector<Span> spans_;
  fax::Examples pool_;
  fax::Examples test_;
};

}  // namespace

FAX_DATASET_PLUGIN(CsvDataset)
