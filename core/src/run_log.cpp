#include <fax/run_log.h>

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include <ATen/ATen.h>

#include <fax/error.h>

namespace fax {
namespace {

// An HDF5 identifier closed by the matching H5?close.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept {
    std::swap(id_, o.id_);
    std::swap(close_, o.close_);
    return *this;
  }
  ~Handle() {
    if (id_ >= 0 && close_ != nullptr) close_(id_);
  }
  hid_t get() const { return id_; }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

// Runs an HDF5 call that returns an id or status; a negative result is an error naming `what`.
template <class T>
T checked(T result, const std::string& path, const std::string& what) {
  FAX_CHECK(result >= 0, "{}: HDF5 failed to {}", path, what);
  return result;
}

void silence_hdf5_errors() {
  static const bool once = [] { return H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr) >= 0; }();
  (void)once;
}

Handle utf8_string_type() {
  Handle t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  return t;
}

Handle intermediate_groups() {
  Handle p(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(p.get(), 1);
  return p;
}

hid_t native_type(at::ScalarType t, const std::string& path) {
  switch (t) {
    case at::kFloat: return H5T_NATIVE_FLOAT;
    case at::kDouble: return H5T_NATIVE_DOUBLE;
    case at::kLong: return H5T_NATIVE_INT64;
    case at::kInt: return H5T_NATIVE_INT32;
    default: throw Error(fmt::format("{}: cannot store tensors of type {} in HDF5", path, c10::toString(t)));
  }
}

at::ScalarType scalar_type_of(hid_t type, const std::string& path) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) return size == 4 ? at::kFloat : at::kDouble;
  if (cls == H5T_INTEGER) return size == 4 ? at::kInt : at::kLong;
  throw Error(fmt::format("{}: a checkpoint dataset has an unsupported HDF5 type", path));
}

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

std::string read_vlen_string(hid_t object, bool attribute, const std::string& path) {
  Handle type = utf8_string_type();
  char* text = nullptr;
  if (attribute) {
    checked(H5Aread(object, type.get(), &text), path, "read a string attribute");
  } else {
    checked(H5Dread(object, type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &text), path, "read a string");
  }
  std::string out = text != nullptr ? text : "";
  H5free_memory(text);
  return out;
}

// Names of the datasets below `group` (recursively), relative to it, in creation order where
// tracked and name order otherwise.
std::vector<std::string> datasets_below(hid_t file, const std::string& group) {
  std::vector<std::string> names;
  auto visit = [](hid_t, const char* name, const H5O_info_t* info, void* data) -> herr_t {
    if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  Handle g(H5Gopen2(file, group.c_str(), H5P_DEFAULT), H5Gclose);
  if (g.get() < 0) return names;
  H5Ovisit2(g.get(), H5_INDEX_NAME, H5_ITER_INC, visit, &names, H5O_INFO_BASIC);
  return names;
}

template <class T>
std::vector<T> read_vector(hid_t file, const std::string& name, hid_t type, const std::string& path) {
  Handle ds(checked(H5Dopen2(file, name.c_str(), H5P_DEFAULT), path, "open " + name), H5Dclose);
  Handle space(H5Dget_space(ds.get()), H5Sclose);
  std::vector<T> out(H5Sget_simple_extent_npoints(space.get()));
  if (!out.empty()) checked(H5Dread(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), path, "read " + name);
  return out;
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

struct RunLogReader::Impl {
  Handle file;
};

RunLogReader::RunLogReader(const std::string& path) : impl_(std::make_unique<Impl>()), path_(path) {
  silence_hdf5_errors();
  FAX_CHECK(H5Fis_hdf5(path.c_str()) > 0, "{}: not an HDF5 file, or cannot be read", path);
  impl_->file = Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  FAX_CHECK(impl_->file.get() >= 0, "{}: cannot open the run log", path);
  FAX_CHECK(H5Lexists(impl_->file.get(), "/config", H5P_DEFAULT) > 0, "{}: not a fax run log (no /config)", path);
}

RunLogReader::~RunLogReader() = default;

std::string RunLogReader::config() const {
  Handle ds(checked(H5Dopen2(impl_->file.get(), "/config", H5P_DEFAULT), path_, "open /config"), H5Dclose);
  return read_vlen_string(ds.get(), false, path_);
}

StringPairs RunLogReader::env() const {
  Handle group(checked(H5Gopen2(impl_->file.get(), "/env", H5P_DEFAULT), path_, "open /env"), H5Gclose);
  H5O_info_t info;
  H5Oget_info2(group.get(), &info, H5O_INFO_NUM_ATTRS);
  StringPairs out;
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    Handle attr(checked(H5Aopen_by_idx(group.get(), ".", H5_INDEX_CRT_ORDER, H5_ITER_INC, i, H5P_DEFAULT,
                                       H5P_DEFAULT),
                        path_, "read /env"),
                H5Aclose);
    char name[256] = {0};
    H5Aget_name(attr.get(), sizeof(name), name);
    out.emplace_back(name, read_vlen_string(attr.get(), true, path_));
  }
  return out;
}

std::vector<int64_t> RunLogReader::rounds() const {
  return read_vector<int64_t>(impl_->file.get(), "/metrics/round", H5T_NATIVE_INT64, path_);
}

std::vector<std::string> RunLogReader::metric_names() const {
  std::vector<std::string> names = datasets_below(impl_->file.get(), "/metrics");
  names.erase(std::remove(names.begin(), names.end(), "round"), names.end());
  return names;
}

std::vector<double> RunLogReader::metric(const std::string& name) const {
  return read_vector<double>(impl_->file.get(), "/metrics/" + name, H5T_NATIVE_DOUBLE, path_);
}

at::Tensor RunLogReader::dataset(const std::string& name) const {
  FAX_CHECK(H5Lexists(impl_->file.get(), name.c_str(), H5P_DEFAULT) > 0, "{}: no dataset {}", path_, name);
  Handle ds(checked(H5Dopen2(impl_->file.get(), name.c_str(), H5P_DEFAULT), path_, "open " + name), H5Dclose);
  Handle space(H5Dget_space(ds.get()), H5Sclose);
  Handle type(H5Dget_type(ds.get()), H5Tclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  const at::ScalarType st = scalar_type_of(type.get(), path_);
  at::Tensor t = at::empty(std::vector<int64_t>(dims.begin(), dims.end()), at::TensorOptions().dtype(st));
  if (t.numel() > 0) {
    checked(H5Dread(ds.get(), native_type(st, path_), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()), path_, "read " + name);
  }
  return t;
}

std::vector<int64_t> RunLogReader::checkpoint_rounds() const {
  std::vector<int64_t> rounds;
  Handle g(H5Gopen2(impl_->file.get(), "/checkpoints", H5P_DEFAULT), H5Gclose);
  if (g.get() < 0) return rounds;
  auto visit = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
    static_cast<std::vector<int64_t>*>(data)->push_back(std::stoll(name));
    return 0;
  };
  H5Literate(g.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, visit, &rounds);
  std::sort(rounds.begin(), rounds.end());
  return rounds;
}

TensorTree RunLogReader::checkpoint(int64_t round) const {
  const std::string group = fmt::format("/checkpoints/{}", round);
  FAX_CHECK(H5Lexists(impl_->file.get(), "/checkpoints", H5P_DEFAULT) > 0 &&
                H5Lexists(impl_->file.get(), group.c_str(), H5P_DEFAULT) > 0,
            "{}: no checkpoint of round {}", path_, round);
  Handle g(checked(H5Gopen2(impl_->file.get(), group.c_str(), H5P_DEFAULT), path_, "open " + group), H5Gclose);
  Handle leaves(checked(H5Aopen(g.get(), "leaves", H5P_DEFAULT), path_, "read the leaves of " + group), H5Aclose);
  std::vector<std::string> names;
  std::stringstream order(read_vlen_string(leaves.get(), true, path_));
  for (std::string name; std::getline(order, name);) names.push_back(name);
  TensorTree tree;
  for (const auto& name : names) tree.set(name, dataset(group + "/" + name));
  return tree;
}

}  // namespace fax
