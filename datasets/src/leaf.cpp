// LEAF's JSON files (Caldas et al. 2018, https://leaf.cmu.edu): each file of a split holds
// {"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}. The files
// are parsed as a stream of SAX events straight into per-user buffers, so the JSON text is never
// held in memory; each user becomes a tensor as soon as its object closes.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <fax/base/error.h>
#include <fax/datasets/in_memory.h>
#include <fax/datasets/readers.h>

namespace fax {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// LEAF's Shakespeare vocabulary (models/utils/language_utils.py): a character's id is its index.
constexpr std::string_view kLeafLetters =
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}";
constexpr int64_t kOutOfVocabulary = kLeafLetters.size();
// Sent140's rows are [id, date, query, user, text]: LEAF's models read the text at index 4.
constexpr int64_t kTweetText = 4;

enum class Task { unknown, images, characters, tweets };

const char* task_name(Task t) {
  switch (t) {
    case Task::images: return "numeric features (FEMNIST, Synthetic)";
    case Task::characters: return "characters (Shakespeare)";
    case Task::tweets: return "tweets (Sent140)";
    default: return "unknown";
  }
}

// What every file of the data set must agree on: the task, its row length, the vocabularies.
struct Shared {
  Task task = Task::unknown;
  int64_t features = -1;  // images: numbers per row; characters: characters per row
  // Tweets: words in order of first appearance, their training counts; ids in rows are indices here.
  std::unordered_map<std::string, int32_t> words;
  std::vector<int64_t> word_counts;
  std::vector<std::string> word_list;
  bool counting = true;  // training files count words, test files only look them up
  int64_t out_of_vocabulary = 0;
};

// One user's data as read: rows of numbers or token ids, labels.
struct UserData {
  std::string name;
  std::vector<float> numbers;
  std::vector<int32_t> tokens;  // characters: 80 per row; tweets: a row's words, ends in row_ends
  std::vector<int64_t> row_ends;
  std::vector<int64_t> labels;
  int64_t string_labels = 0;
  int64_t rows = 0;
  bool has_x = false, has_y = false;
};

struct User {
  std::string name;
  std::string file;
  int64_t rows = 0;
  Examples examples;  // tweets: the inputs wait for the vocabulary, known after the training files
  std::vector<int32_t> words;  // tweets: word ids in order of first appearance; row i ends at row_ends[i]
  std::vector<int64_t> row_ends;
};

// How far a split's files have been read, on one line rewritten in place on a terminal and cleared
// when loading ends (so an error stays the only line); nothing when stderr is not a terminal.
class Progress {
 public:
  Progress(int64_t total_bytes, std::string what) : total_(total_bytes), what_(std::move(what)) {}
  ~Progress() {
    if (tty_ && shown_) std::fprintf(stderr, "\r\033[K");
  }
  void update(const std::string& file, int64_t bytes) {
    const auto now = std::chrono::steady_clock::now();
    if (!tty_ || std::chrono::duration<double>(now - last_).count() < 0.25) return;
    last_ = now;
    shown_ = true;
    const std::string line = fmt::format("{}: {} MB of {} MB ({})", what_, (done_ + bytes) >> 20, total_ >> 20, file);
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    std::fflush(stderr);
  }
  void finished(int64_t bytes) { done_ += bytes; }

 private:
  int64_t total_;
  std::string what_;
  int64_t done_ = 0;
  bool tty_ = isatty(STDERR_FILENO) != 0;
  bool shown_ = false;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// LEAF's tokenizer for Sent140 (models/utils/language_utils.py: [\\w']+|[.,!?;]): runs of word
// characters and apostrophes, and the punctuation marks . , ! ? ; as words of their own. Bytes of
// multi-byte UTF-8 characters count as word characters.
template <class F>
void split_words(const std::string& text, F&& f) {
  std::string word;
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '_' || c == '\'' || c >= 0x80) {
      word += ch;
      continue;
    }
    if (!word.empty()) f(word), word.clear();
    if (std::string_view(".,!?;").find(ch) != std::string_view::npos) f(std::string(1, ch));
  }
  if (!word.empty()) f(word);
}

// The SAX events of one file, checked against LEAF's schema as they arrive.
class LeafFile final : public nlohmann::json_sax<json> {
 public:
  LeafFile(std::string file, Shared& shared, std::vector<User>& users, std::function<void()> on_user)
      : file_(std::move(file)), s_(shared), out_(users), on_user_(std::move(on_user)) {}

  // After the parse: users, num_samples and user_data agree; users join `out` in `users` order.
  void finish() {
    for (const char* key : {"users", "num_samples", "user_data"})
      FAX_CHECK(seen_.count(key), "{}: not a LEAF file: no \"{}\" key at the top level", file_, key);
    FAX_CHECK(listed_.size() == num_samples_.size(), "{}: \"users\" names {} users but \"num_samples\" has {} counts",
              file_, listed_.size(), num_samples_.size());
    FAX_CHECK(listed_.size() == read_.size(), "{}: \"users\" names {} users but \"user_data\" holds {}", file_,
              listed_.size(), read_.size());
    for (size_t i = 0; i < listed_.size(); ++i) {
      auto it = read_.find(listed_[i]);
      FAX_CHECK(it != read_.end(), "{}: user \"{}\" is in \"users\" but not in \"user_data\"", file_, listed_[i]);
      User& user = it->second;
      FAX_CHECK(user.rows == num_samples_[i], "{}: user \"{}\" has {} samples, \"num_samples\" says {}",
                file_, listed_[i], user.rows, num_samples_[i]);
      out_.push_back(std::move(user));
      read_.erase(it);
    }
  }

  bool start_object(std::size_t) override {
    switch (top()) {
      case At::none: push(At::top); break;
      case At::top:
        if (key_ == "user_data") push(At::user_data);
        else open_other("an object");
        break;
      case At::user_data: begin_user(); break;
      default: open_other("an object");
    }
    return true;
  }
  bool end_object() override {
    if (top() == At::user) end_user();
    pop();
    return true;
  }
  bool start_array(std::size_t) override {
    switch (top()) {
      case At::top: open_listed_array(); break;
      case At::user: open_user_array(); break;
      case At::x: begin_row(); break;
      default: open_other("a list");
    }
    return true;
  }
  bool end_array() override {
    if (top() == At::x_row) end_row();
    if (top() == At::x) user_.has_x = true;
    if (top() == At::y) user_.has_y = true;
    pop();
    return true;
  }
  bool key(string_t& k) override {
    key_ = k;
    if (top() == At::top) seen_.insert(k);
    return true;
  }

  bool number_integer(number_integer_t v) override { return number(static_cast<double>(v)); }
  bool number_unsigned(number_unsigned_t v) override { return number(static_cast<double>(v)); }
  bool number_float(number_float_t v, const string_t&) override { return number(v); }
  bool string(string_t& v) override {
    switch (top()) {
      case At::users: listed_.push_back(v); break;
      case At::x: string_row(v); break;
      case At::x_row: tweet_field(v); break;
      case At::y: string_label(v); break;
      default: scalar("a string");
    }
    return true;
  }
  bool boolean(bool) override { return scalar("true or false"); }
  bool null() override { return scalar("null"); }
  bool binary(binary_t&) override { return scalar("binary data"); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    // nlohmann's message: "[json.exception.parse_error.101] parse error at line 1, column 13: ...".
    std::string what = e.what();
    for (const std::string prefix : {"] ", "parse error at "}) {
      const size_t at = what.find(prefix);
      if (at != std::string::npos) what = what.substr(at + prefix.size());
    }
    FAX_CHECK(false, "{}: not valid JSON: {}", file_, what);
  }

 private:
  enum class At { none, top, users, num_samples, user_data, user, x, x_row, y, skip };

  At top() const { return stack_.empty() ? At::none : stack_.back(); }
  void push(At a) { stack_.push_back(a); }
  void pop() {
    if (top() == At::skip && --skip_depth_ > 0) return;
    stack_.pop_back();
  }

  // Where in the file: for messages.
  std::string where() const {
    if (top() == At::users || top() == At::num_samples) return fmt::format("{}: \"{}\"", file_, key_);
    if (user_.name.empty()) return file_;
    std::string w = fmt::format("{}: user \"{}\"", file_, user_.name);
    if (top() == At::x || top() == At::x_row) w += fmt::format(", x[{}]", user_.rows);
    if (top() == At::y) w += fmt::format(", y[{}]", user_.labels.size());
    return w;
  }

  // A value LEAF's schema does not hold here; under a key fax does not read, it is skipped.
  void open_other(const char* what) {
    if (top() == At::skip) {
      ++skip_depth_;
      return;
    }
    FAX_CHECK(top() == At::top || top() == At::user, "{}: {} where LEAF's schema has {}", where(), what, expected());
    FAX_CHECK(!is_read_key(), "{}: \"{}\" is {}; LEAF's schema has {}", where(), key_, what, expected_for_key());
    push(At::skip);
    skip_depth_ = 1;
  }
  bool scalar(const char* what) {
    if (top() == At::skip) return true;
    if (top() == At::top || top() == At::user) {
      FAX_CHECK(!is_read_key(), "{}: \"{}\" is {}; LEAF's schema has {}", where(), key_, what, expected_for_key());
      return true;
    }
    FAX_CHECK(false, "{}: {} where LEAF's schema has {}", where(), what, expected());
  }
  bool is_read_key() const {
    if (top() == At::top) return key_ == "users" || key_ == "num_samples" || key_ == "user_data";
    return key_ == "x" || key_ == "y";
  }
  std::string expected_for_key() const {
    if (key_ == "users") return "a list of user names";
    if (key_ == "num_samples") return "a list of sample counts";
    if (key_ == "user_data") return "an object of users";
    return "a list";  // x, y
  }
  std::string expected() const {
    switch (top()) {
      case At::users: return "user names";
      case At::num_samples: return "sample counts";
      case At::user_data: return "an object per user";
      case At::x: return "examples (lists of numbers or strings)";
      case At::x_row: return s_.task == Task::tweets ? "a tweet's fields" : "numbers";
      case At::y: return "labels";
      default: return "an object";
    }
  }

  void open_listed_array() {
    if (key_ == "users") return push(At::users);
    if (key_ == "num_samples") return push(At::num_samples);
    open_other("a list");
  }
  void open_user_array() {
    if (key_ == "x") {
      FAX_CHECK(!user_.has_x, "{}: user \"{}\" has two \"x\" keys", file_, user_.name);
      return push(At::x);
    }
    if (key_ == "y") {
      FAX_CHECK(!user_.has_y, "{}: user \"{}\" has two \"y\" keys", file_, user_.name);
      return push(At::y);
    }
    open_other("a list");
  }

  void begin_user() {
    FAX_CHECK(!key_.empty(), "{}: a user with an empty name in \"user_data\"", file_);
    FAX_CHECK(!read_.count(key_), "{}: user \"{}\" appears twice in \"user_data\"", file_, key_);
    user_ = UserData();
    user_.name = key_;
    push(At::user);
  }
  void end_user() {
    const std::string& name = user_.name;
    FAX_CHECK(user_.has_x && user_.has_y, "{}: user \"{}\" needs both \"x\" and \"y\"", file_, name);
    FAX_CHECK(user_.rows > 0, "{}: user \"{}\" has no samples", file_, name);
    FAX_CHECK(user_.rows == static_cast<int64_t>(user_.labels.size()), "{}: user \"{}\" has {} x rows but {} y labels",
              file_, name, user_.rows, user_.labels.size());
    const bool characters = s_.task == Task::characters;
    FAX_CHECK(!characters || user_.string_labels == user_.rows,
              "{}: user \"{}\": x holds strings but y numbers (LEAF's CelebA, whose x are image file names, is "
              "not supported; fax reads FEMNIST, Shakespeare, Sent140 and Synthetic)", file_, name);
    FAX_CHECK(characters || user_.string_labels == 0, "{}: user \"{}\": y holds strings but x holds {}", file_, name,
              task_name(s_.task));
    User user;
    user.name = name;
    user.file = file_;
    user.rows = user_.rows;
    if (s_.task == Task::tweets) {
      user.examples.y = at::tensor(user_.labels, at::kLong);
      user.words = std::move(user_.tokens);
      user.row_ends = std::move(user_.row_ends);
    } else {
      user.examples = to_examples();
    }
    read_[name] = std::move(user);
    user_ = UserData();
    on_user_();
  }

  Examples to_examples() {
    const int64_t n = user_.rows;
    const at::Tensor y = at::tensor(user_.labels, at::kLong);
    if (s_.task == Task::images) {
      at::Tensor x = at::from_blob(user_.numbers.data(), {n, s_.features}, at::kFloat).clone();
      if (s_.features == 28 * 28) x = x.view({n, 1, 28, 28});  // FEMNIST's images
      return {x, y};
    }
    // Next-character prediction at every position: a row and its next character share one
    // [n, length + 1] tensor, the inputs its first `length` columns, the labels its last.
    const int64_t length = s_.features;
    at::Tensor sequence = at::empty({n, length + 1}, at::kLong);
    int64_t* p = sequence.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(user_.tokens.data() + i * length, length, p + i * (length + 1));
      p[i * (length + 1) + length] = user_.labels[i];
    }
    return {sequence.narrow(1, 0, length), sequence.narrow(1, 1, length)};
  }

  void begin_row() {
    if (s_.task == Task::unknown) s_.task = Task::images;  // decided by the first row's first element below
    FAX_CHECK(s_.task != Task::characters, "{}: a list where this data set's rows are strings", where());
    push(At::x_row);
    row_start_ = s_.task == Task::tweets ? static_cast<int64_t>(user_.tokens.size())
                                         : static_cast<int64_t>(user_.numbers.size());
    row_field_ = 0;
  }
  void end_row() {
    if (s_.task == Task::tweets) {
      FAX_CHECK(row_field_ > kTweetText, "{}: a Sent140 row needs the tweet's text at index {}, the row has {} fields",
                where(), kTweetText, row_field_);
      user_.row_ends.push_back(static_cast<int64_t>(user_.tokens.size()));
    } else {
      const int64_t length = static_cast<int64_t>(user_.numbers.size()) - row_start_;
      FAX_CHECK(length > 0, "{}: an empty row", where());
      if (s_.features < 0) s_.features = length;
      FAX_CHECK(length == s_.features, "{}: {} numbers where the data set's first row has {}", where(), length,
                s_.features);
    }
    ++user_.rows;
  }

  bool number(double v) {
    switch (top()) {
      case At::num_samples:
        FAX_CHECK(v >= 0 && v <= 9007199254740992.0 && v == std::floor(v), "{}: {} is not a sample count", where(), v);
        num_samples_.push_back(static_cast<int64_t>(v));
        break;
      case At::x_row:
        if (s_.task == Task::tweets) {
          ++row_field_;  // a numeric field of a tweet (its id): not read
          FAX_CHECK(row_field_ - 1 != kTweetText, "{}: the tweet's text (field {}) is a number", where(), kTweetText);
          break;
        }
        FAX_CHECK(std::isfinite(static_cast<float>(v)), "{}: feature {} is not a finite float", where(), v);
        user_.numbers.push_back(static_cast<float>(v));
        break;
      case At::y:
        FAX_CHECK(v >= 0 && v < std::numeric_limits<int32_t>::max(), "{}: label {} is out of range", where(), v);
        FAX_CHECK(v == std::floor(v), "{}: label {} is not a whole number", where(), v);
        user_.labels.push_back(static_cast<int64_t>(v));
        break;
      default: scalar("a number");
    }
    return true;
  }

  // A row given as a string: Shakespeare's 80 characters.
  void string_row(const std::string& text) {
    if (s_.task == Task::unknown) s_.task = Task::characters;
    FAX_CHECK(s_.task == Task::characters, "{}: a string where this data set's rows are lists", where());
    const size_t before = user_.tokens.size();
    for_each_character(text, [&](int64_t id) { user_.tokens.push_back(static_cast<int32_t>(id)); });
    const int64_t length = static_cast<int64_t>(user_.tokens.size() - before);
    FAX_CHECK(length > 0, "{}: an empty string", where());
    if (s_.features < 0) s_.features = length;
    FAX_CHECK(length == s_.features, "{}: {} characters where the data set's first row has {}", where(), length,
              s_.features);
    ++user_.rows;
  }
  // A label given as a string: Shakespeare's next character.
  void string_label(const std::string& text) {
    ++user_.string_labels;
    int64_t count = 0, id = 0;
    for_each_character(text, [&](int64_t c) { id = c, ++count; });
    FAX_CHECK(count == 1, "{}: \"{}\" is not one character", where(), text.size() > 40 ? text.substr(0, 40) + "..." : text);
    user_.labels.push_back(id);
  }
  // The ids of a string's characters (UTF-8 code points; a character outside LEAF's 80 gets 80).
  template <class F>
  void for_each_character(const std::string& text, F&& f) {
    for (size_t i = 0; i < text.size();) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      const size_t width = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      const size_t at = width == 1 ? kLeafLetters.find(static_cast<char>(c)) : std::string_view::npos;
      if (at == std::string_view::npos) ++s_.out_of_vocabulary;
      f(at == std::string_view::npos ? kOutOfVocabulary : static_cast<int64_t>(at));
      i += width;
    }
  }

  // A field of a Sent140 row: the text at kTweetText becomes words, the others are skipped.
  void tweet_field(const std::string& text) {
    // The data set's first row decides: a string in it makes the rows tweets (whose id may be a number).
    if (s_.task == Task::images && s_.features < 0 && user_.rows == 0 && out_.empty() && read_.empty()) {
      s_.task = Task::tweets;
      row_field_ = static_cast<int64_t>(user_.numbers.size()) - row_start_;
      user_.numbers.resize(row_start_);
      row_start_ = static_cast<int64_t>(user_.tokens.size());
    }
    FAX_CHECK(s_.task == Task::tweets, "{}: a string where this data set's rows hold numbers", where());
    if (row_field_++ != kTweetText) return;
    split_words(text, [&](const std::string& word) { user_.tokens.push_back(word_id(word)); });
  }
  int32_t word_id(const std::string& word) {
    auto it = s_.words.find(word);
    if (it == s_.words.end()) {
      FAX_CHECK(s_.word_list.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()), "{}: too many words",
                file_);
      it = s_.words.emplace(word, static_cast<int32_t>(s_.word_list.size())).first;
      s_.word_list.push_back(word);
      s_.word_counts.push_back(0);
    }
    if (s_.counting) ++s_.word_counts[it->second];
    return it->second;
  }

  std::string file_;
  Shared& s_;
  std::vector<User>& out_;
  std::function<void()> on_user_;
  std::vector<At> stack_;
  int64_t skip_depth_ = 0;
  std::string key_;
  std::set<std::string> seen_;
  std::vector<std::string> listed_;
  std::vector<int64_t> num_samples_;
  std::map<std::string, User> read_;
  UserData user_;
  int64_t row_start_ = 0;
  int64_t row_field_ = 0;
};

// The .json files of a split's folder, in name order.
std::vector<fs::path> split_files(const fs::path& root, const char* split) {
  const fs::path dir = root / split;
  std::error_code ec;
  FAX_CHECK(fs::is_directory(dir, ec), "data.path: {} has no {}/ folder (LEAF's split step writes train/ and test/)",
            root.string(), split);
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".json") continue;
    std::error_code bad;
    const bool regular = fs::is_regular_file(entry.path(), bad);
    FAX_CHECK(!bad, "{}: cannot read: {}", entry.path().string(), bad.message());
    if (regular) files.push_back(entry.path());  // folders, pipes, devices named .json are not data
  }
  FAX_CHECK(!ec, "{}: cannot list the folder: {}", dir.string(), ec.message());
  FAX_CHECK(!files.empty(), "{}: no .json files", dir.string());
  std::sort(files.begin(), files.end());
  return files;
}

int64_t total_bytes(const std::vector<fs::path>& files) {
  int64_t total = 0;
  std::error_code ec;
  for (const auto& f : files) total += static_cast<int64_t>(fs::file_size(f, ec));
  return total;
}

// Every user of a split's files, in file order and each file's "users" order.
std::vector<User> read_split(const std::vector<fs::path>& files, Shared& shared, Progress& progress) {
  std::vector<User> users;
  std::map<std::string, std::string> file_of;
  for (const fs::path& path : files) {
    const std::string file = path.string();
    std::ifstream in;
    std::vector<char> buffer(1 << 20);
    in.rdbuf()->pubsetbuf(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    in.open(path, std::ios::binary);
    FAX_CHECK(in, "{}: cannot open the file", file);
    const size_t before = users.size();
    LeafFile handler(file, shared, users, [&] {
      const std::streamoff at = in.rdbuf()->pubseekoff(0, std::ios::cur, std::ios::in);
      progress.update(path.filename().string(), at < 0 ? 0 : static_cast<int64_t>(at));
    });
    try {
      json::sax_parse(in, &handler);
    } catch (const std::bad_alloc&) {
      FAX_CHECK(false, "{}: out of memory while reading the file", file);
    }
    handler.finish();
    std::error_code ec;
    progress.finished(static_cast<int64_t>(fs::file_size(path, ec)));
    for (size_t i = before; i < users.size(); ++i) {
      const auto [it, fresh] = file_of.emplace(users[i].name, file);
      FAX_CHECK(fresh, "{}: user \"{}\" is also in {}", file, users[i].name, it->second);
    }
  }
  return users;
}

// Sent140: the `keep` most frequent training words get ids 2.. (ties in byte order), 0 pads a
// tweet to `length` words, 1 stands for every other word; a tweet's words past `length` are cut.
// Returns the vocabulary's size.
int64_t tokenize_tweets(std::vector<User>& train, std::vector<User>& test, const Shared& shared, int64_t keep,
                        int64_t length) {
  std::vector<int32_t> order;
  for (size_t w = 0; w < shared.word_list.size(); ++w)
    if (shared.word_counts[w] > 0) order.push_back(static_cast<int32_t>(w));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (shared.word_counts[a] != shared.word_counts[b]) return shared.word_counts[a] > shared.word_counts[b];
    return shared.word_list[a] < shared.word_list[b];
  });
  if (static_cast<int64_t>(order.size()) > keep) order.resize(keep);
  std::vector<int64_t> id(shared.word_list.size(), 1);
  for (size_t rank = 0; rank < order.size(); ++rank) id[order[rank]] = static_cast<int64_t>(rank) + 2;
  for (auto* split : {&train, &test}) {
    for (User& user : *split) {
      at::Tensor x = at::zeros({user.rows, length}, at::kLong);
      int64_t* p = x.data_ptr<int64_t>();
      int64_t start = 0;
      for (int64_t r = 0; r < user.rows; ++r) {
        const int64_t end = user.row_ends[r];
        for (int64_t i = start; i < end && i - start < length; ++i) p[r * length + i - start] = id[user.words[i]];
        start = end;
      }
      user.examples.x = x;
      user.words = {};
      user.row_ends = {};
    }
  }
  return static_cast<int64_t>(order.size()) + 2;
}

// A message on one line whatever the files hold: control characters (a user named "a\nb") escaped,
// its length bounded.
std::string one_line(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += ch;
    if (out.size() > 2000) return out + "...";
  }
  return out;
}

std::unique_ptr<FederatedDataset> read_leaf(const LeafOptions& options) {
  FAX_CHECK(!options.path.empty(), "data.path: set it to LEAF's data folder (the one holding train/ and test/, e.g. "
            "leaf/data/femnist/data)");
  std::error_code ec;
  FAX_CHECK(fs::is_directory(options.path, ec), "data.path: {}: no such folder", options.path);
  const std::vector<fs::path> train_files = split_files(options.path, "train");
  const std::vector<fs::path> test_files = split_files(options.path, "test");
  Shared shared;
  std::vector<User> train, test;
  {
    Progress progress(total_bytes(train_files) + total_bytes(test_files), "leaf: reading " + options.path);
    train = read_split(train_files, shared, progress);
    shared.counting = false;
    test = read_split(test_files, shared, progress);
  }
  FAX_CHECK(!train.empty(), "{}/train: no users", options.path);
  std::string name = fmt::format("leaf {} from {}", task_name(shared.task), options.path);
  int64_t classes = kOutOfVocabulary + 1;
  if (shared.task == Task::characters) {
    FAX_CHECK(options.classes == 0 || options.classes == classes,
              "data.classes: characters have LEAF's {} classes and one for any other character", kOutOfVocabulary);
    if (shared.out_of_vocabulary > 0)
      name += fmt::format(" ({} characters outside LEAF's vocabulary share id {})", shared.out_of_vocabulary,
                          kOutOfVocabulary);
  } else {
    if (shared.task == Task::tweets) {
      const int64_t vocabulary =
          tokenize_tweets(train, test, shared, options.vocab, options.sequence_length);
      name += fmt::format(", a vocabulary of {} ids (0 padding, 1 other words)", vocabulary);
    }
    int64_t largest = 0;
    for (const auto* split : {&train, &test})
      for (const User& user : *split) largest = std::max(largest, user.examples.y.max().item<int64_t>());
    classes = options.classes > 0 ? options.classes : largest + 1;
    for (const auto* split : {&train, &test})
      for (const User& user : *split) {
        const int64_t top = user.examples.y.max().item<int64_t>();
        FAX_CHECK(top < classes, "{}: user \"{}\": label {} is out of range (data.classes is {})", user.file,
                  user.name, top, classes);
      }
  }
  std::vector<Examples> clients;
  std::vector<std::string> names;
  for (User& user : train) {
    clients.push_back(std::move(user.examples));
    names.push_back(user.name);
  }
  Examples test_split;
  if (!test.empty()) {
    std::vector<at::Tensor> xs, ys;
    for (const User& user : test) xs.push_back(user.examples.x), ys.push_back(user.examples.y);
    test_split = {at::cat(xs), at::cat(ys)};
  }
  return std::make_unique<InMemoryDataset>(std::move(clients), std::move(test_split), classes, std::move(name),
                                           std::move(names));
}

}  // namespace

// Bytes in memory per byte of LEAF JSON, from the first row of the first training file: numbers
// shrink to floats (about 1); Shakespeare's strings become int64 ids (8 per character of a row, the
// row and its labels sharing one tensor); Sent140's tweets a fixed number of ids (about 1).
int64_t estimate_leaf_bytes(const LeafOptions& options) {
  std::vector<fs::path> train, test;
  try {
    train = split_files(options.path, "train");
    test = split_files(options.path, "test");
  } catch (const Error&) {
    return 0;
  }
  std::ifstream in(train.front(), std::ios::binary);
  std::string head(1 << 16, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  const size_t x = head.find("\"x\"");
  const size_t first = x == std::string::npos ? x : head.find_first_not_of(" \t\r\n:[", x + 3);
  const int64_t factor = first != std::string::npos && head[first] == '"' ? 8 : 1;
  // Sent140's vocabulary, capped: the setting has no upper bound and the sum must not overflow.
  return factor * (total_bytes(train) + total_bytes(test)) + std::min<int64_t>(options.vocab, int64_t{1} << 40) * 128;
}

std::unique_ptr<FederatedDataset> load_leaf(const LeafOptions& options) {
  try {
    return read_leaf(options);
  } catch (const Error& e) {
    throw Error(one_line(e.what()));
  }
}

}  // namespace fax
