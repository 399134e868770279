// libFuzzer target: the TFF-style HDF5 reader, structure-aware. The input describes one or two
// files (which groups exist, client names, features as numeric or string datasets or groups, element
// types, ranks, shapes, values); libhdf5 writes them and fax reads them back through the data set API.
// Raw mutated bytes mostly fuzz libhdf5's own metadata parser, whose crashes on corrupt headers
// (1.10.8) fax cannot guard against; fax's reader logic is what this target owns.
#include <hdf5.h>

#include <fuzzer/FuzzedDataProvider.h>

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <fax/base/error.h>
#include <fax/datasets/readers.h>
#include <fax/train/dataset.h>

#include <unistd.h>

namespace {

const char* const kFeatures[] = {"pixels", "label", "tokens"};

std::vector<hid_t> element_types() {
  // Supported and unsupported ones: the reader must refuse the latter with an error.
  return {H5T_NATIVE_UINT8, H5T_NATIVE_INT8,  H5T_NATIVE_INT16,  H5T_NATIVE_INT32, H5T_NATIVE_INT64,
          H5T_NATIVE_FLOAT, H5T_NATIVE_DOUBLE, H5T_NATIVE_UINT32, H5T_NATIVE_UINT64};
}

// A dataset of `type` and shape `dims` holding `data`; a name libhdf5 refuses writes nothing.
void write_dataset(hid_t group, const char* name, hid_t type, const std::vector<hsize_t>& dims, const void* data) {
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t ds = H5Dcreate2(group, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (ds >= 0) {
    H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    H5Dclose(ds);
  }
  H5Sclose(space);
}

void write_numeric(FuzzedDataProvider& in, hid_t group, const char* name) {
  const std::vector<hid_t> types = element_types();
  const hid_t type = types[in.ConsumeIntegralInRange<size_t>(0, types.size() - 1)];
  const int rank = in.ConsumeIntegralInRange(0, 4);
  std::vector<hsize_t> dims(rank);
  hsize_t n = 1;
  for (auto& d : dims) n *= (d = in.ConsumeIntegralInRange(0, 6));
  std::vector<uint8_t> values = in.ConsumeBytes<uint8_t>(n * H5Tget_size(type));
  values.resize(n * H5Tget_size(type) + 1);
  write_dataset(group, name, type, dims, values.data());
}

void write_strings(FuzzedDataProvider& in, hid_t group, const char* name) {
  std::vector<std::string> text(in.ConsumeIntegralInRange(0, 4));
  std::vector<const char*> pointers;
  for (auto& t : text) {
    t = in.ConsumeRandomLengthString(40);
    pointers.push_back(t.c_str());
  }
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  write_dataset(group, name, type, {text.size()}, pointers.data());
  H5Tclose(type);
}

void write_file(FuzzedDataProvider& in, const std::string& path) {
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hid_t examples = H5Gcreate2(file, in.ConsumeBool() ? "examples" : "other", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  const int clients = in.ConsumeIntegralInRange(0, 4);
  for (int c = 0; c < clients; ++c) {
    const hid_t client =
        H5Gcreate2(examples, in.ConsumeRandomLengthString(8).c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (client < 0) continue;  // a name libhdf5 refuses (empty, '.', a slash)
    for (const char* feature : kFeatures) {
      switch (in.ConsumeIntegralInRange(0, 3)) {
        case 0: break;
        case 1: write_numeric(in, client, feature); break;
        case 2: write_strings(in, client, feature); break;
        default: H5Gclose(H5Gcreate2(client, feature, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      }
    }
    H5Gclose(client);
  }
  H5Gclose(examples);
  H5Fclose(file);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr) >= 0;
  (void)quiet;
  static const std::string stem = "/dev/shm/fax_fuzz_" + std::to_string(::getpid());
  FuzzedDataProvider in(data, size);
  fax::TffHdf5Options options;
  options.path = stem + "_train.h5";
  write_file(in, options.path);
  if (in.ConsumeBool()) {
    options.test_path = stem + "_test.h5";
    write_file(in, options.test_path);
  }
  options.x = kFeatures[in.ConsumeIntegralInRange(0, 2)];
  options.y = kFeatures[in.ConsumeIntegralInRange(0, 2)];
  options.test_fraction = in.ConsumeFloatingPointInRange(0.0, 0.99);
  options.classes = in.ConsumeIntegralInRange(0, 12);
  try {
    const auto dataset = fax::load_tff_hdf5(options);
    // What the trainer relies on: every client holds examples, as many inputs as labels.
    for (int64_t c = 0; c < dataset->num_clients(); ++c) {
      const fax::Examples examples = dataset->client(c);
      if (examples.size() < 1 || examples.x.size(0) != examples.y.size(0)) __builtin_trap();
    }
    (void)dataset->test();
    (void)dataset->input_shape();
  } catch (const fax::Error&) {
  }
  return 0;
}
