#include <fax/run_log.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include <ATen/ATen.h>

#include "hdf5_util.h"

namespace fax {
namespace {
using namespace h5::detail;

// An extendable dataset growing along its first axis: [rows] or [rows, width].
class Series {
 public:
  Series(hid_t file, const std::string& name, hid_t type, int64_t width, const std::string& path)
      : type_(type), width_(width), path_(path) {
    const int rank = width > 0 ? 2 : 1;
    hsize_t dims[2] = {0, static_cast<hsize_t>(width)};
    hsize_t max[2] = {H5S_UNLIMITED, static_cast<hsize_t>(width)};
    hsize_t chunk[2] = {width > 0 ? 16u : 256u, static_cast<hsize_t>(std::max<int64_t>(width, 1))};
    Handle space(checked(H5Screate_simple(rank, dims, max), path, "create a dataspace"), H5Sclose);
    Handle props(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_chunk(props.get(), rank, chunk);
    dataset_ = Handle(checked(H5Dcreate2(file, name.c_str(), type, space.get(), intermediate_groups().get(),
                                         props.get(), H5P_DEFAULT),
                              path, "create " + name),
                      H5Dclose);
  }

  void append(const void* row) {
    const int rank = width_ > 0 ? 2 : 1;
    hsize_t extent[2] = {rows_ + 1, static_cast<hsize_t>(width_)};
    checked(H5Dset_extent(dataset_.get(), extent), path_, "extend a dataset");
    Handle file_space(H5Dget_space(dataset_.get()), H5Sclose);
    hsize_t start[2] = {rows_, 0};
    hsize_t count[2] = {1, static_cast<hsize_t>(width_)};
    H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
    Handle mem_space(H5Screate_simple(rank, count, nullptr), H5Sclose);
    checked(H5Dwrite(dataset_.get(), type_, mem_space.get(), file_space.get(), H5P_DEFAULT, row), path_,
            "write a row");
    ++rows_;
  }

  hsize_t rows() const { return rows_; }

 private:
  Handle dataset_;
  hid_t type_;
  int64_t width_;
  std::string path_;
  hsize_t rows_ = 0;
};

void write_string(hid_t file, const std::string& name, const std::string& value, const std::string& path) {
  Handle type = utf8_string_type();
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle ds(checked(H5Dcreate2(file, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                    path, "create " + name),
            H5Dclose);
  const char* text = value.c_str();
  checked(H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &text), path, "write " + name);
}

void write_string_attribute(hid_t object, const std::string& name, const std::string& value, const std::string& path) {
  Handle type = utf8_string_type();
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(checked(H5Acreate2(object, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), path,
                      "create attribute " + name),
              H5Aclose);
  const char* text = value.c_str();
  checked(H5Awrite(attr.get(), type.get(), &text), path, "write attribute " + name);
}

}  // namespace

struct RunLog::Impl {
  Handle file;
  std::unique_ptr<Series> rounds;
  std::vector<std::pair<std::string, std::unique_ptr<Series>>> metrics;
  std::unique_ptr<Series> client_ids;
  std::vector<std::pair<std::string, std::unique_ptr<Series>>> client_values;
};

RunLog::RunLog(const std::string& path, const std::string& config_yaml, const StringPairs& env)
    : impl_(std::make_unique<Impl>()), path_(path) {
  silence_hdf5_errors();
  impl_->file = Handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  FAX_CHECK(impl_->file.get() >= 0, "{}: cannot create the run log (is the directory writable?)", path);
  write_string(impl_->file.get(), "/config", config_yaml, path);
  // Attribute creation order is tracked so the environment reads back in the order it was written.
  Handle group_props(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  H5Pset_attr_creation_order(group_props.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  Handle group(checked(H5Gcreate2(impl_->file.get(), "/env", H5P_DEFAULT, group_props.get(), H5P_DEFAULT), path,
                       "create /env"),
               H5Gclose);
  for (const auto& [key, value] : env) write_string_attribute(group.get(), key, value, path);
  impl_->rounds = std::make_unique<Series>(impl_->file.get(), "/metrics/round", H5T_NATIVE_INT64, 0, path);
  H5Fflush(impl_->file.get(), H5F_SCOPE_GLOBAL);
}

RunLog::~RunLog() = default;

void RunLog::append(int64_t round, const Metrics& metrics) {
  const hsize_t row = impl_->rounds->rows();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [name, value] : metrics) {
    FAX_CHECK(name != "round", "{}: 'round' is reserved in /metrics", path_);
    auto it = std::find_if(impl_->metrics.begin(), impl_->metrics.end(), [&](const auto& m) { return m.first == name; });
    if (it == impl_->metrics.end()) {
      // A metric that first appears now: earlier rows are NaN.
      auto series = std::make_unique<Series>(impl_->file.get(), "/metrics/" + name, H5T_NATIVE_DOUBLE, 0, path_);
      for (hsize_t r = 0; r < row; ++r) series->append(&nan);
      impl_->metrics.emplace_back(name, std::move(series));
    }
  }
  impl_->rounds->append(&round);
  for (auto& [name, series] : impl_->metrics) {
    auto it = std::find_if(metrics.begin(), metrics.end(), [&](const auto& m) { return m.first == name; });
    const double value = it == metrics.end() ? nan : it->second;
    series->append(&value);
  }
  H5Fflush(impl_->file.get(), H5F_SCOPE_GLOBAL);
}

void RunLog::append_clients(const at::Tensor& ids, const std::vector<std::pair<std::string, at::Tensor>>& values) {
  const at::Tensor id_row = ids.to(at::kLong).contiguous();
  const int64_t width = id_row.numel();
  // Everything is checked before anything is written, so a refused row leaves no partial row.
  std::vector<at::Tensor> rows;
  for (const auto& [name, v] : values) {
    rows.push_back(v.detach().to(at::kDouble).contiguous());
    FAX_CHECK(rows.back().numel() == width, "{}: per-client metric '{}' has {} values for a cohort of {}", path_, name,
              rows.back().numel(), width);
  }
  if (!impl_->client_ids) {
    impl_->client_ids = std::make_unique<Series>(impl_->file.get(), "/clients/id", H5T_NATIVE_INT64, width, path_);
  }
  impl_->client_ids->append(id_row.data_ptr<int64_t>());
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string& name = values[i].first;
    auto it = std::find_if(impl_->client_values.begin(), impl_->client_values.end(),
                           [&](const auto& m) { return m.first == name; });
    if (it == impl_->client_values.end()) {
      impl_->client_values.emplace_back(
          name, std::make_unique<Series>(impl_->file.get(), "/clients/" + name, H5T_NATIVE_DOUBLE, width, path_));
      it = std::prev(impl_->client_values.end());
    }
    it->second->append(rows[i].data_ptr<double>());
  }
  H5Fflush(impl_->file.get(), H5F_SCOPE_GLOBAL);
}

void RunLog::checkpoint(int64_t round, const TensorTree& state) {
  const std::string group = fmt::format("/checkpoints/{}", round);
  for (const auto& [name, tensor] : state) {
    const at::Tensor t = tensor.detach().cpu().contiguous();
    std::vector<hsize_t> dims(t.sizes().begin(), t.sizes().end());
    Handle space(t.dim() == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(t.dim(), dims.data(), nullptr), H5Sclose);
    const std::string ds_name = group + "/" + name;
    const hid_t type = native_type(t.scalar_type(), path_);
    Handle ds(checked(H5Dcreate2(impl_->file.get(), ds_name.c_str(), type, space.get(), intermediate_groups().get(),
                                 H5P_DEFAULT, H5P_DEFAULT),
                      path_, "create " + ds_name),
              H5Dclose);
    checked(H5Dwrite(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()), path_, "write " + ds_name);
  }
  // HDF5 lists members by name; the tree's order is kept in an attribute.
  Handle g(checked(H5Gopen2(impl_->file.get(), group.c_str(), H5P_DEFAULT), path_, "open " + group), H5Gclose);
  write_string_attribute(g.get(), "leaves", fmt::format("{}", fmt::join(state.names(), "\n")), path_);
  H5Fflush(impl_->file.get(), H5F_SCOPE_GLOBAL);
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
