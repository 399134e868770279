#include <fax/datasets/readers.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <ATen/ATen.h>

#include <fax/base/error.h>
#include <fax/datasets/in_memory.h>
#include <fax/io/hdf5.h>

namespace fax {
namespace {
namespace fs = std::filesystem;

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  FAX_CHECK(in.good(), "{}: cannot read", path.string());
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Decodes UTF-8 into code points; false when the text is not valid UTF-8.
bool decode_utf8(const std::string& text, std::vector<uint32_t>& out) {
  out.clear();
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const int extra = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xe ? 2 : (c >> 3) == 0x1e ? 3 : -1;
    if (extra < 0 || i + extra >= text.size()) return false;
    uint32_t code = extra == 0 ? c : c & (0x3f >> extra);
    for (int k = 1; k <= extra; ++k) {
      const auto cont = static_cast<unsigned char>(text[i + k]);
      if ((cont >> 6) != 0x2) return false;
      code = (code << 6) | (cont & 0x3f);
    }
    out.push_back(code);
    i += extra + 1;
  }
  return true;
}

// (name, text) of every client in the corpus at `o.path`.
std::vector<std::pair<std::string, std::string>> read_corpus(const TextOptions& o) {
  FAX_CHECK(!o.path.empty(), "data.path: the text corpus to read is not set");
  FAX_CHECK(fs::exists(o.path), "{}: no such file or directory (data.path)", o.path);
  std::vector<std::pair<std::string, std::string>> clients;
  if (fs::is_directory(o.path)) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(o.path))
      if (entry.is_regular_file() && !entry.is_symlink()) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) clients.emplace_back(f.filename().string(), read_all(f));
  } else if (fs::path(o.path).extension() == ".h5") {
    const h5::File file(o.path);
    FAX_CHECK(file.exists("/examples"), "{}: not a TFF federated file (no /examples group)", o.path);
    for (const auto& id : file.members("/examples")) {
      std::string joined;
      for (const auto& s : file.read_strings("/examples/" + id + "/" + o.feature)) joined += s + "\n";
      clients.emplace_back(id, joined);
    }
  } else {
    std::ifstream in(o.path);
    int line_number = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_number;
      if (line.empty()) continue;
      const auto tab = line.find('\t');
      FAX_CHECK(tab != std::string::npos, "{}:{}: expected 'client<TAB>text' lines", o.path, line_number);
      const std::string key = line.substr(0, tab);
      auto it = std::find_if(clients.begin(), clients.end(), [&](const auto& c) { return c.first == key; });
      if (it == clients.end()) it = clients.insert(clients.end(), {key, ""});
      it->second += line.substr(tab + 1) + "\n";
    }
  }
  FAX_CHECK(!clients.empty(), "{}: the corpus holds no clients", o.path);
  return clients;
}

}  // namespace

TextDataset::TextDataset(const TextOptions& o) : options_(o) {
  FAX_CHECK(o.sequence_length > 0, "data.sequence_length must be positive (got {})", o.sequence_length);
  const auto corpus = read_corpus(o);
  // Character vocabulary if the whole corpus is UTF-8 with few enough distinct characters.
  std::set<uint32_t> distinct;
  std::vector<uint32_t> decoded;
  bool utf8 = true;
  for (const auto& [name, text] : corpus) {
    if (!decode_utf8(text, decoded)) {
      utf8 = false;
      break;
    }
    distinct.insert(decoded.begin(), decoded.end());
  }
  byte_level_ = !utf8 || static_cast<int64_t>(distinct.size()) > o.max_vocab;
  if (!byte_level_) alphabet_.assign(distinct.begin(), distinct.end());
  vocab_size_ = byte_level_ ? 256 : std::max<int64_t>(2, static_cast<int64_t>(alphabet_.size()));

  const int64_t window = o.sequence_length + 1;
  std::vector<Examples> train;
  std::vector<at::Tensor> test_x, test_y;
  for (const auto& [name, text] : corpus) {
    const std::vector<int64_t> ids = encode(text);
    const int64_t windows = static_cast<int64_t>(ids.size()) / window;
    if (windows == 0) continue;
    const at::Tensor seq = at::tensor(std::vector<int64_t>(ids.begin(), ids.begin() + windows * window), at::kLong)
                               .view({windows, window});
    const int64_t held = windows > 1 ? std::max<int64_t>(1, static_cast<int64_t>(o.test_fraction * windows)) : 0;
    const at::Tensor x = seq.narrow(1, 0, o.sequence_length), y = seq.narrow(1, 1, o.sequence_length);
    train.push_back({x.narrow(0, 0, windows - held).contiguous(), y.narrow(0, 0, windows - held).contiguous()});
    test_x.push_back(x.narrow(0, windows - held, held));
    test_y.push_back(y.narrow(0, windows - held, held));
    names_.push_back(name);
  }
  FAX_CHECK(!train.empty(), "{}: no client has {} tokens (data.sequence_length + 1)", o.path, window);
  train_ = std::move(train);
  test_ = {at::cat(test_x).contiguous(), at::cat(test_y).contiguous()};
}

std::vector<int64_t> TextDataset::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  if (byte_level_) {
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::vector<uint32_t> decoded;
  if (!decode_utf8(text, decoded)) decoded.assign(text.begin(), text.end());
  for (uint32_t c : decoded) {
    const auto it = std::lower_bound(alphabet_.begin(), alphabet_.end(), c);
    ids.push_back(it != alphabet_.end() && *it == c ? it - alphabet_.begin() : 0);
  }
  return ids;
}

std::string TextDataset::describe() const {
  int64_t windows = 0;
  for (const auto& e : train_) windows += e.size();
  return fmt::format("text({}): {} clients, {} training sequences of {} tokens, {} vocabulary of {}", options_.path,
                     train_.size(), windows, options_.sequence_length, byte_level_ ? "byte" : "character",
                     vocab_size_);
}

int64_t TextDataset::num_examples(int64_t client) const { return train_.at(client).size(); }

Examples TextDataset::client(int64_t client) const {
  FAX_CHECK(client >= 0 && client < num_clients(), "client {} is not in the population (0..{})", client,
            num_clients() - 1);
  return train_[client];
}

}  // namespace fax
