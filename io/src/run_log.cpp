#include <fax/io/run_log.h>

#include <algorithm>
#include <charconv>
#include <optional>
#include <random>
#include <filesystem>
#include <functional>
#include <cmath>
#include <limits>
#include <sstream>

#include <ATen/ATen.h>

#include "hdf5_util.h"

namespace fax {
namespace {
using namespace h5::detail;
namespace fs = std::filesystem;

std::string checkpoint_dir(const std::string& path) { return RunLogReader::checkpoint_folder(path); }

// The checkpoint folder as a link from the log names it: relative to the log's own directory, so
// the log and its checkpoints can move together.
std::string checkpoint_link(const std::string& path, int64_t round, const std::string& run_id) {
  return fs::path(path).filename().string() + ".checkpoints/" + RunLogReader::checkpoint_name(round, run_id);
}

std::string checkpoint_file(const std::string& path, int64_t round, const std::string& run_id) {
  return checkpoint_dir(path) + "/" + RunLogReader::checkpoint_name(round, run_id);
}

std::string new_run_id() {
  std::random_device device;
  return fmt::format("{:08x}{:08x}", device(), device());
}

std::string env_value(const StringPairs& env, const std::string& key) {
  for (const auto& [k, v] : env)
    if (k == key) return v;
  return "";
}

}  // namespace

struct RunLog::Impl {
  std::string config;
  StringPairs env;
  std::string run_id;  // "" for a log written before run ids
  std::vector<int64_t> rounds;
  std::vector<std::pair<std::string, std::vector<double>>> metrics;
  std::vector<at::Tensor> client_ids;  // one row per append_clients
  std::vector<std::pair<std::string, std::vector<at::Tensor>>> client_values;
  std::vector<int64_t> checkpoints;
  bool deferred = false;        // an existing file waits for the first append to replace it
  bool collect_garbage = true;  // the next commit removes checkpoint files nothing links to
  // The runs whose checkpoint files the garbage collection may remove: this one, and the run of
  // a log this one replaces. Files of other runs (a shared or linked folder) are left alone.
  std::vector<std::string> collectable_runs;
};

namespace {

// What follows round-<8 digits> in a checkpoint file's name, before ".h5" ("-<run id>", or "" in
// logs before run ids); nullopt when `name` is not named like a checkpoint file.
std::optional<std::string> checkpoint_suffix(const std::string& name) {
  if (name.size() < 17 || name.rfind("round-", 0) != 0 || name.find_first_not_of("0123456789", 6) != 14 ||
      name.compare(name.size() - 3, 3, ".h5") != 0)
    return std::nullopt;
  return name.substr(14, name.size() - 17);
}

// Whether `name` is a checkpoint file of the run `run_id` ("" for logs before run ids), or a
// temporary file of one that its writer did not finish.
bool checkpoint_of(const std::string& name, const std::string& run_id) {
  std::string base = name;
  if (!base.empty() && base.front() == '.') {
    const size_t tmp = base.find(".tmp-");
    if (tmp == std::string::npos) return false;
    base = base.substr(1, tmp - 1);
  }
  return checkpoint_suffix(base) == (run_id.empty() ? "" : "-" + run_id);
}

}  // namespace

RunLog::RunLog(const std::string& path, const std::string& config_yaml, const StringPairs& env)
    : impl_(std::make_unique<Impl>()), path_(path) {
  impl_->config = config_yaml;
  impl_->env = env;
  impl_->run_id = new_run_id();
  impl_->env.emplace_back("run_id", impl_->run_id);
  impl_->collectable_runs.push_back(impl_->run_id);
  std::error_code ec;
  impl_->deferred = fs::exists(path, ec);
  if (impl_->deferred) {
    // The log this run replaces: its checkpoints go once the replacement is on disk.
    try {
      impl_->collectable_runs.push_back(RunLogReader(path).env("run_id"));
    } catch (const Error&) {
      // Not a readable log: nothing of it is collected.
    }
  }
  if (!impl_->deferred) commit();
}

RunLog::~RunLog() = default;
bool RunLog::deferred() const { return impl_->deferred; }
RunLog::RunLog(RunLog&&) noexcept = default;
RunLog& RunLog::operator=(RunLog&&) noexcept = default;

RunLog RunLog::resume(const std::string& path, int64_t after_round) {
  const RunLogReader reader(path);
  RunLog log;
  log.impl_ = std::make_unique<Impl>();
  log.path_ = path;
  Impl& m = *log.impl_;
  m.config = reader.config();
  m.env = reader.env();
  m.run_id = reader.env("run_id");
  m.collectable_runs.push_back(m.run_id);
  const std::vector<int64_t> rounds = reader.rounds();
  size_t keep = 0;
  while (keep < rounds.size() && rounds[keep] <= after_round) ++keep;
  m.rounds.assign(rounds.begin(), rounds.begin() + keep);
  for (const auto& name : reader.metric_names()) {
    std::vector<double> values = reader.metric(name);
    values.resize(keep);
    m.metrics.emplace_back(name, std::move(values));
  }
  if (reader.has("/clients/id")) {
    // Per-client rows are one per round, like the metrics.
    const at::Tensor ids = reader.dataset("/clients/id");
    FAX_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong && ids.size(0) >= static_cast<int64_t>(keep),
              "{}: /clients/id is not an int64 [rounds, cohort] dataset with a row for each of {} rounds", path, keep);
    // Rows without their padding (ids -1), which the commit sizes to the rows it keeps.
    std::vector<int64_t> widths;
    for (size_t r = 0; r < keep; ++r) {
      const at::Tensor row = ids[static_cast<int64_t>(r)];
      widths.push_back((row >= 0).sum().item<int64_t>());
      FAX_CHECK((row.narrow(0, widths.back(), row.numel() - widths.back()) == -1).all().item<bool>(),
                "{}: /clients/id row {} holds ids below 0 other than its trailing padding (-1)", path, r + 1);
      m.client_ids.push_back(row.narrow(0, 0, widths.back()));
    }
    for (const auto& name : reader.datasets_below("/clients")) {
      if (name == "id") continue;
      const at::Tensor values = reader.dataset("/clients/" + name);
      FAX_CHECK(values.sizes() == ids.sizes(), "{}: /clients/{} does not have the shape of /clients/id", path, name);
      std::vector<at::Tensor> rows;
      for (size_t r = 0; r < m.client_ids.size(); ++r)
        rows.push_back(values[static_cast<int64_t>(r)].narrow(0, 0, widths[r]).to(at::kDouble));
      m.client_values.emplace_back(name, std::move(rows));
    }
  }
  for (int64_t r : reader.checkpoint_rounds())
    if (r <= after_round) m.checkpoints.push_back(r);
  // Checkpoint files after the resume point, or that no log links to, are leftovers of the crash;
  // the commit removes them.
  log.commit();
  return log;
}

namespace {
// Per-client rows as one [rounds, widest] dataset: cohorts of varying size (Poisson sampling) are
// padded at the end with `fill` (ids -1, values NaN).
at::Tensor padded_rows(const std::vector<at::Tensor>& rows, double fill) {
  int64_t widest = 0;
  for (const at::Tensor& row : rows) widest = std::max(widest, row.numel());
  at::Tensor out = at::full({static_cast<int64_t>(rows.size()), widest}, fill, rows.front().options());
  for (size_t r = 0; r < rows.size(); ++r) out[static_cast<int64_t>(r)].narrow(0, 0, rows[r].numel()).copy_(rows[r]);
  return out;
}
}  // namespace

void RunLog::commit() {
  Impl& m = *impl_;
  write_atomically(path_, [&](hid_t file) {
    write_string(file, "/config", m.config, path_);
    Handle group_props(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
    H5Pset_attr_creation_order(group_props.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
    Handle group(checked(H5Gcreate2(file, "/env", H5P_DEFAULT, group_props.get(), H5P_DEFAULT), path_, "create /env"),
                 H5Gclose);
    for (const auto& [key, value] : m.env) write_string_attribute(group.get(), key, value, path_);
    write_tensor(file, "/metrics/round", at::tensor(m.rounds, at::kLong), path_);
    for (const auto& [name, values] : m.metrics) {
      write_tensor(file, "/metrics/" + name, at::tensor(values, at::kDouble), path_);
    }
    if (!m.client_ids.empty()) {
      write_tensor(file, "/clients/id", padded_rows(m.client_ids, -1), path_);
      for (const auto& [name, rows] : m.client_values)
        write_tensor(file, "/clients/" + name, padded_rows(rows, std::numeric_limits<double>::quiet_NaN()), path_);
    }
    for (int64_t r : m.checkpoints) {
      checked(H5Lcreate_external(checkpoint_link(path_, r, m.run_id).c_str(), "/", file,
                                 fmt::format("/checkpoints/{}", r).c_str(), intermediate_groups().get(), H5P_DEFAULT),
              path_, "link the checkpoint of round " + std::to_string(r));
    }
  });
  m.deferred = false;
  if (!m.collect_garbage) return;
  m.collect_garbage = false;
  // Only now that the new log is on disk: until then the old log may still link these files.
  // Only checkpoint files (and their unfinished temporaries) of this run and of the run it
  // replaced are candidates; anything else in the folder is not fax's to delete.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(checkpoint_dir(path_), ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours = std::any_of(m.collectable_runs.begin(), m.collectable_runs.end(),
                                  [&](const std::string& run) { return checkpoint_of(name, run); });
    const bool linked = std::any_of(m.checkpoints.begin(), m.checkpoints.end(), [&](int64_t r) {
      return RunLogReader::checkpoint_name(r, m.run_id) == name;
    });
    std::error_code ignored;
    if (ours && !linked) fs::remove(entry.path(), ignored);
  }
  m.collectable_runs = {m.run_id};
}

void RunLog::set_env(const std::string& key, const std::string& value) {
  for (auto& entry : impl_->env) {
    if (entry.first == key) {
      entry.second = value;
      return;
    }
  }
  impl_->env.emplace_back(key, value);
}

void RunLog::append(int64_t round, const Metrics& metrics, bool commit_now) {
  Impl& m = *impl_;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& metric : metrics) {
    const std::string& name = metric.first;
    FAX_CHECK(name != "round", "{}: 'round' is reserved in /metrics", path_);
    auto it = std::find_if(m.metrics.begin(), m.metrics.end(), [&](const auto& e) { return e.first == name; });
    // A metric that first appears now: earlier rows are NaN.
    if (it == m.metrics.end()) m.metrics.emplace_back(name, std::vector<double>(m.rounds.size(), nan));
  }
  m.rounds.push_back(round);
  for (auto& series : m.metrics) {
    auto it = std::find_if(metrics.begin(), metrics.end(), [&](const auto& e) { return e.first == series.first; });
    series.second.push_back(it == metrics.end() ? nan : it->second);
  }
  if (commit_now) commit();
}

void RunLog::append_clients(const at::Tensor& ids, const std::vector<std::pair<std::string, at::Tensor>>& values) {
  Impl& m = *impl_;
  const at::Tensor id_row = ids.to(at::kLong).contiguous();
  const int64_t width = id_row.numel();
  // Everything is checked before anything is kept, so a refused row leaves no partial row.
  std::vector<at::Tensor> rows;
  for (const auto& [name, v] : values) {
    rows.push_back(v.detach().to(at::kDouble).contiguous());
    FAX_CHECK(rows.back().numel() == width, "{}: per-client metric '{}' has {} values for a cohort of {}", path_, name,
              rows.back().numel(), width);
  }
  const size_t previous = m.client_ids.size();
  m.client_ids.push_back(id_row);
  for (size_t i = 0; i < values.size(); ++i) {
    auto it = std::find_if(m.client_values.begin(), m.client_values.end(),
                           [&](const auto& e) { return e.first == values[i].first; });
    if (it == m.client_values.end()) {
      std::vector<at::Tensor> earlier;
      for (size_t r = 0; r < previous; ++r)
        earlier.push_back(at::full({m.client_ids[r].numel()}, std::numeric_limits<double>::quiet_NaN(), at::kDouble));
      m.client_values.emplace_back(values[i].first, std::move(earlier));
      it = std::prev(m.client_values.end());
    }
    it->second.push_back(rows[i]);
  }
  // A metric this row lacks (a round without clients reports none): NaN.
  for (auto& [name, series] : m.client_values)
    if (series.size() < m.client_ids.size())
      series.push_back(at::full({width}, std::numeric_limits<double>::quiet_NaN(), at::kDouble));
}

void RunLog::checkpoint(int64_t round, const TensorTree& state, int64_t keep) {
  Impl& m = *impl_;
  std::error_code ec;
  fs::create_directories(checkpoint_dir(path_), ec);
  FAX_CHECK(!ec, "{}: cannot create {}: {}", path_, checkpoint_dir(path_), ec.message());
  const std::string file = checkpoint_file(path_, round, m.run_id);
  write_atomically(file, [&](hid_t f) {
    for (const auto& [name, tensor] : state) write_tensor(f, "/" + name, tensor, file);
    // HDF5 lists members by name; the tree's order is kept in an attribute. The run and round
    // let a reader check that the file is the checkpoint its log means.
    Handle root(checked(H5Gopen2(f, "/", H5P_DEFAULT), file, "open /"), H5Gclose);
    write_string_attribute(root.get(), "leaves", fmt::format("{}", fmt::join(state.names(), "\n")), file);
    write_string_attribute(root.get(), "run_id", m.run_id, file);
    write_string_attribute(root.get(), "round", std::to_string(round), file);
  });
  if (std::find(m.checkpoints.begin(), m.checkpoints.end(), round) == m.checkpoints.end()) {
    m.checkpoints.push_back(round);
  }
  if (keep > 0 && static_cast<int64_t>(m.checkpoints.size()) > keep) {
    m.checkpoints.erase(m.checkpoints.begin(), m.checkpoints.end() - keep);
    m.collect_garbage = true;
  }
}

namespace {

// Reads a dataset after checking its type and rank; `what` describes what it must be.
at::Tensor read_checked(const h5::File& file, const std::string& name, at::ScalarType type, int64_t dim,
                        const char* what) {
  FAX_CHECK(file.exists(name), "{}: not a complete fax run log: no {}", file.path(), name);
  at::Tensor t;
  try {
    t = file.read(name);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {} is not {}: {}", file.path(), name, what, e.what()));
  }
  FAX_CHECK(t.scalar_type() == type && t.dim() == dim, "{}: {} is not {} (it holds {} with {} dimensions)",
            file.path(), name, what, c10::toString(t.scalar_type()), t.dim());
  return t;
}

}  // namespace

void check_replaceable_run_log(const std::string& path) {
  // A run's garbage collection removes unlinked files named like its checkpoints: a log under
  // such a name could be taken for one.
  const std::string name = fs::path(path).filename().string();
  FAX_CHECK(!checkpoint_suffix(name), "{}: is named like a checkpoint file (round-<8 digits>-<run id>.h5), which fax may remove "
            "as a leftover; choose another output name", path);
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  bool run_log = false;
  try {
    run_log = RunLogReader(path).has("/metrics/round");
  } catch (const Error&) {
  }
  FAX_CHECK(run_log, "{}: exists and is not a fax run log; fax replaces only its own logs (remove it or choose "
            "another output)", path);
}

RunLogReader::RunLogReader(const std::string& path) : file_(path) {
  FAX_CHECK(file_.exists("/config"), "{}: not a fax run log (no /config)", path);
}

std::string RunLogReader::config() const { return file_.read_string("/config"); }

StringPairs RunLogReader::env() const {
  return file_.exists("/env") ? file_.string_attributes("/env") : StringPairs{};
}

std::string RunLogReader::env(const std::string& key) const { return env_value(env(), key); }

std::vector<int64_t> RunLogReader::rounds() const {
  const at::Tensor r = read_checked(file_, "/metrics/round", at::kLong, 1, "an int64 [rounds] dataset");
  return {r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel()};
}

std::vector<std::string> RunLogReader::metric_names() const {
  std::vector<std::string> names = file_.datasets_below("/metrics");
  names.erase(std::remove(names.begin(), names.end(), "round"), names.end());
  return names;
}

std::vector<double> RunLogReader::metric(const std::string& name) const {
  const at::Tensor m = read_checked(file_, "/metrics/" + name, at::kDouble, 1, "a float64 [rounds] dataset");
  const size_t rounds = this->rounds().size();
  FAX_CHECK(static_cast<size_t>(m.numel()) == rounds, "{}: /metrics/{} has {} rows for {} rounds", file_.path(), name,
            m.numel(), rounds);
  return {m.data_ptr<double>(), m.data_ptr<double>() + m.numel()};
}

at::Tensor RunLogReader::dataset(const std::string& name) const { return file_.read(name); }

std::vector<int64_t> RunLogReader::checkpoint_rounds() const {
  std::vector<int64_t> rounds;
  if (!file_.exists("/checkpoints")) return rounds;
  for (const auto& name : file_.members("/checkpoints")) {
    int64_t round = 0;
    const auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), round);
    FAX_CHECK(error == std::errc() && end == name.data() + name.size() && round >= 1,
              "{}: /checkpoints/{} is not named after a round", file_.path(), name);
    rounds.push_back(round);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds;
}

std::string RunLogReader::checkpoint_folder(const std::string& log) { return log + ".checkpoints"; }

std::string RunLogReader::checkpoint_name(int64_t round, const std::string& run_id) {
  return run_id.empty() ? fmt::format("round-{:08d}.h5", round) : fmt::format("round-{:08d}-{}.h5", round, run_id);
}

TensorTree RunLogReader::checkpoint(int64_t round) const {
  const std::string& path = file_.path();
  const std::string group = fmt::format("/checkpoints/{}", round);
  FAX_CHECK(file_.exists(group), "{}: no checkpoint of round {}", path, round);
  // HDF5 would look for a linked file in several places (the working directory among them), so the
  // link is read, not followed: it must name this round's file of this run's checkpoint folder.
  const std::string run_id = env("run_id");
  const std::string expected = checkpoint_link(path, round, run_id);
  const std::optional<std::string> target = file_.external_link(group);
  FAX_CHECK(target.has_value(), "{}: {} is not a link to a checkpoint file", path, group);
  FAX_CHECK(*target == expected,
            "{}: the checkpoint of round {} links to '{}', not to its own checkpoint folder ('{}'); refusing to use "
            "another file",
            path, round, *target, expected);
  const fs::path parent = fs::path(path).parent_path();
  const std::string file_path = ((parent.empty() ? fs::path(".") : parent) / expected).string();
  std::error_code ec;
  FAX_CHECK(fs::is_regular_file(file_path, ec), "{}: the checkpoint of round {} is missing: no regular file {}", path,
            round, file_path);
  const h5::File checkpoint(file_path);
  if (!run_id.empty()) {
    // A file of the right name from another run (copied in by hand) is still not this run's.
    const std::string their_run = checkpoint.read_string_attribute("/", "run_id");
    const std::string their_round = checkpoint.read_string_attribute("/", "round");
    FAX_CHECK(their_run == run_id && their_round == std::to_string(round),
              "{}: {} holds round {} of run {}, not round {} of this run ({})", path, file_path, their_round,
              their_run, round, run_id);
  }
  std::stringstream order(checkpoint.read_string_attribute("/", "leaves"));
  TensorTree tree;
  for (std::string name; std::getline(order, name);) {
    FAX_CHECK(!name.empty() && checkpoint.exists("/" + name), "{}: the leaf '{}' listed in its 'leaves' is missing",
              file_path, name);
    tree.set(name, checkpoint.read("/" + name));
  }
  return tree;
}

}  // namespace fax
