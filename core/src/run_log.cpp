#include <fax/run_log.h>

#include <algorithm>
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

std::string checkpoint_dir(const std::string& path) { return path + ".checkpoints"; }

std::string checkpoint_file(const std::string& path, int64_t round) {
  return fmt::format("{}/round-{:08d}.h5", checkpoint_dir(path), round);
}

}  // namespace

struct RunLog::Impl {
  std::string config;
  StringPairs env;
  std::vector<int64_t> rounds;
  std::vector<std::pair<std::string, std::vector<double>>> metrics;
  std::vector<at::Tensor> client_ids;  // one row per append_clients
  std::vector<std::pair<std::string, std::vector<at::Tensor>>> client_values;
  std::vector<int64_t> checkpoints;
};

RunLog::RunLog(const std::string& path, const std::string& config_yaml, const StringPairs& env)
    : impl_(std::make_unique<Impl>()), path_(path) {
  impl_->config = config_yaml;
  impl_->env = env;
  std::error_code ec;
  fs::remove_all(checkpoint_dir(path), ec);
  commit();
}

RunLog::~RunLog() = default;
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
    for (size_t r = 0; r < keep && r < static_cast<size_t>(ids.size(0)); ++r) m.client_ids.push_back(ids[r]);
    for (const auto& name : reader.datasets_below("/clients")) {
      if (name == "id") continue;
      const at::Tensor values = reader.dataset("/clients/" + name);
      std::vector<at::Tensor> rows;
      for (size_t r = 0; r < m.client_ids.size(); ++r) rows.push_back(values[r]);
      m.client_values.emplace_back(name, std::move(rows));
    }
  }
  for (int64_t r : reader.checkpoint_rounds())
    if (r <= after_round) m.checkpoints.push_back(r);
  // Checkpoint files after the resume point, or that no log links to, are leftovers of the crash.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(checkpoint_dir(path), ec)) {
    const std::string file = entry.path().string();
    const bool linked = std::any_of(m.checkpoints.begin(), m.checkpoints.end(),
                                    [&](int64_t r) { return checkpoint_file(path, r) == file; });
    if (!linked) fs::remove(entry.path(), ec);
  }
  log.commit();
  return log;
}

void RunLog::commit() const {
  const Impl& m = *impl_;
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
      write_tensor(file, "/clients/id", at::stack(m.client_ids), path_);
      for (const auto& [name, rows] : m.client_values) write_tensor(file, "/clients/" + name, at::stack(rows), path_);
    }
    for (int64_t r : m.checkpoints) {
      // Relative to the log's own directory, so the log and its checkpoints can move together.
      const std::string target =
          fs::path(checkpoint_file(path_, r)).lexically_relative(fs::path(path_).parent_path().empty() ? "." : fs::path(path_).parent_path()).string();
      checked(H5Lcreate_external(target.c_str(), "/", file, fmt::format("/checkpoints/{}", r).c_str(),
                                 intermediate_groups().get(), H5P_DEFAULT),
              path_, "link the checkpoint of round " + std::to_string(r));
    }
  });
}

void RunLog::append(int64_t round, const Metrics& metrics) {
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
  commit();
}

void RunLog::append_clients(const at::Tensor& ids, const std::vector<std::pair<std::string, at::Tensor>>& values) {
  Impl& m = *impl_;
  const at::Tensor id_row = ids.to(at::kLong).contiguous();
  const int64_t width = id_row.numel();
  FAX_CHECK(m.client_ids.empty() || m.client_ids.front().numel() == width,
            "{}: a cohort of {} after cohorts of {}: per-client rows need a fixed cohort size", path_, width,
            m.client_ids.empty() ? 0 : m.client_ids.front().numel());
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
      m.client_values.emplace_back(values[i].first,
                                   std::vector<at::Tensor>(previous, at::full({width}, std::numeric_limits<double>::quiet_NaN(), at::kDouble)));
      it = std::prev(m.client_values.end());
    }
    it->second.push_back(rows[i]);
  }
}

void RunLog::checkpoint(int64_t round, const TensorTree& state) {
  std::error_code ec;
  fs::create_directories(checkpoint_dir(path_), ec);
  FAX_CHECK(!ec, "{}: cannot create {}: {}", path_, checkpoint_dir(path_), ec.message());
  const std::string file = checkpoint_file(path_, round);
  write_atomically(file, [&](hid_t f) {
    for (const auto& [name, tensor] : state) write_tensor(f, "/" + name, tensor, file);
    // HDF5 lists members by name; the tree's order is kept in an attribute.
    Handle root(checked(H5Gopen2(f, "/", H5P_DEFAULT), file, "open /"), H5Gclose);
    write_string_attribute(root.get(), "leaves", fmt::format("{}", fmt::join(state.names(), "\n")), file);
  });
  if (std::find(impl_->checkpoints.begin(), impl_->checkpoints.end(), round) == impl_->checkpoints.end()) {
    impl_->checkpoints.push_back(round);
  }
}

RunLogReader::RunLogReader(const std::string& path) : file_(path) {
  FAX_CHECK(file_.exists("/config"), "{}: not a fax run log (no /config)", path);
}

std::string RunLogReader::config() const { return file_.read_string("/config"); }

StringPairs RunLogReader::env() const { return file_.string_attributes("/env"); }

std::vector<int64_t> RunLogReader::rounds() const {
  const at::Tensor r = file_.read("/metrics/round");
  return {r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel()};
}

std::vector<std::string> RunLogReader::metric_names() const {
  std::vector<std::string> names = file_.datasets_below("/metrics");
  names.erase(std::remove(names.begin(), names.end(), "round"), names.end());
  return names;
}

std::vector<double> RunLogReader::metric(const std::string& name) const {
  const at::Tensor m = file_.read("/metrics/" + name).to(at::kDouble);
  return {m.data_ptr<double>(), m.data_ptr<double>() + m.numel()};
}

at::Tensor RunLogReader::dataset(const std::string& name) const { return file_.read(name); }

std::vector<int64_t> RunLogReader::checkpoint_rounds() const {
  std::vector<int64_t> rounds;
  if (!file_.exists("/checkpoints")) return rounds;
  for (const auto& name : file_.members("/checkpoints")) rounds.push_back(std::stoll(name));
  std::sort(rounds.begin(), rounds.end());
  return rounds;
}

TensorTree RunLogReader::checkpoint(int64_t round) const {
  const std::string group = fmt::format("/checkpoints/{}", round);
  FAX_CHECK(file_.exists(group), "{}: no checkpoint of round {}", file_.path(), round);
  std::stringstream order(file_.read_string_attribute(group, "leaves"));
  TensorTree tree;
  for (std::string name; std::getline(order, name);) tree.set(name, file_.read(group + "/" + name));
  return tree;
}

}  // namespace fax
