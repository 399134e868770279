// libFuzzer target: the LEAF JSON reader. An input is a training file and a test file separated by
// a NUL byte (which valid JSON text never holds), written to train/ and test/ of a private folder.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include <ATen/ATen.h>

#include <fax/base/error.h>
#include <fax/datasets/readers.h>

namespace {

void write(const std::filesystem::path& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path root = "/dev/shm/fax_fuzz_leaf_" + std::to_string(::getpid());
  static const bool made = std::filesystem::create_directories(root / "train") &&
                           std::filesystem::create_directories(root / "test");
  (void)made;
  const uint8_t* split = std::find(data, data + size, uint8_t{0});
  write(root / "train" / "a.json", data, split - data);
  const uint8_t* rest = split == data + size ? split : split + 1;
  write(root / "test" / "a.json", rest, data + size - rest);
  fax::LeafOptions options;
  options.path = root.string();
  options.vocab = 3;
  options.sequence_length = 4;
  try {
    const auto dataset = fax::load_leaf(options);
    // What the trainer relies on: every client holds examples, as many inputs as labels, labels
    // among the classes, inputs of one shape.
    const auto check = [&](const fax::Examples& e) {
      if (e.x.size(0) != e.y.size(0)) __builtin_trap();
      if (e.size() > 0 && (e.y.min().item<int64_t>() < 0 || e.y.max().item<int64_t>() >= dataset->num_classes()))
        __builtin_trap();
      if (e.size() > 0 && e.x.sizes().slice(1) != at::IntArrayRef(dataset->input_shape())) __builtin_trap();
    };
    for (int64_t c = 0; c < dataset->num_clients(); ++c) {
      const fax::Examples examples = dataset->client(c);
      if (examples.size() < 1) __builtin_trap();
      check(examples);
    }
    check(dataset->test());
  } catch (const fax::Error&) {
  }
  return 0;
}
