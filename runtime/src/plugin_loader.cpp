#include <fax/runtime/plugin_loader.h>

#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include <fax/base/error.h>
#include <fax/base/fingerprint.h>
#include <fax/train/plugin.h>

namespace fax {
namespace fs = std::filesystem;

namespace {

KeyType parse_key_type(const std::string& type, const std::string& key, const std::string& path) {
  for (KeyType t : {KeyType::Int, KeyType::Float, KeyType::Bool, KeyType::String})
    if (type == to_string(t)) return t;
  throw Error(fmt::format("plugin {}: key '{}' has unknown type '{}'", path, key, type));
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, sep))
    if (!part.empty()) out.push_back(part);
  return out;
}

std::string major_minor(const std::string& version) { return version.substr(0, version.rfind('.')); }

fs::path executable_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

// Libraries are never unloaded: algorithm objects and their code must outlive every run.
std::mutex loaded_mutex;
std::vector<void*> loaded_handles;

// Runs `f`, a call into a plugin's code: whatever it throws leaves as a fax::Error naming the
// plugin and the call (fax's own errors, which already say what went wrong, pass unchanged), so a
// plugin that throws an int or a std::bad_alloc neither terminates fax nor passes for fax's own
// internal error.
template <class F>
auto guarded(const std::string& who, const char* call, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const InternalError&) {
    throw;
  } catch (...) {
    // Running out of memory is the run's size, not the plugin's fault: it leaves as it came.
    if (detail::is_out_of_memory(std::current_exception())) throw;
    throw Error(fmt::format("{} failed in {}(): {}", who, call, detail::describe(std::current_exception())));
  }
}

// What a plugin made, deleted by the plugin's own code.
class Made {
 public:
  Made(void* made, const FaxPluginInfo* info, std::string who) : made_(made), info_(info), who_(std::move(who)) {}
  ~Made() {
    try {
      info_->destroy(made_);
    } catch (...) {
      warn(fmt::format("{}: threw while being destroyed", who_));
    }
  }
  Made(const Made&) = delete;
  Made& operator=(const Made&) = delete;
  const std::string& who() const { return who_; }

 private:
  void* made_;
  const FaxPluginInfo* info_;
  std::string who_;
};

// The plugin's algorithm behind a wall (guarded()).
class GuardedAlgorithm final : public Algorithm {
 public:
  GuardedAlgorithm(Algorithm* inner, const FaxPluginInfo* info, std::string who)
      : inner_(inner), made_(inner, info, std::move(who)) {}

  ServerState init(const Config& config, const Model& model, TensorTree initial_params) override {
    return guarded(made_.who(), "init", [&] { return inner_->init(config, model, std::move(initial_params)); });
  }
  RoundMetrics round(ServerState& state, RoundContext& ctx) const override {
    return guarded(made_.who(), "round", [&] { return inner_->round(state, ctx); });
  }
  TensorTree eval_params(const ServerState& state) const override {
    return guarded(made_.who(), "eval_params", [&] { return inner_->eval_params(state); });
  }
  bool adds_noise() const override {
    return guarded(made_.who(), "adds_noise", [&] { return inner_->adds_noise(); });
  }
  int64_t local_examples(int64_t examples) const override {
    return guarded(made_.who(), "local_examples", [&] { return inner_->local_examples(examples); });
  }
  bool asynchronous() const override {
    return guarded(made_.who(), "asynchronous", [&] { return inner_->asynchronous(); });
  }
  void check_state(const ServerState& state, const std::string& where) const override {
    guarded(made_.who(), "check_state", [&] { inner_->check_state(state, where); });
  }

 private:
  Algorithm* inner_;
  Made made_;
};

// The plugin's object and the guard on every call into it.
class Wall {
 public:
  Wall(void* made, const FaxPluginInfo* info, std::string who) : made_(made, info, std::move(who)) {}
  template <class F>
  auto call(const char* name, F&& f) const -> decltype(f()) {
    return guarded(made_.who(), name, std::forward<F>(f));
  }

 private:
  Made made_;
};

// The plugin's model behind the same wall.
class GuardedModel final : public Model {
 public:
  GuardedModel(Model* inner, const FaxPluginInfo* info, std::string who)
      : inner_(inner), wall_(inner, info, std::move(who)) {}

  std::string describe() const override { return wall_.call("describe", [&] { return inner_->describe(); }); }
  TensorTree init(at::Generator generator) const override {
    return wall_.call("init", [&] { return inner_->init(std::move(generator)); });
  }
  at::Tensor forward(const TensorTree& params, const at::Tensor& x) const override {
    return wall_.call("forward", [&] { return inner_->forward(params, x); });
  }
  at::Tensor forward_eval(const TensorTree& params, const at::Tensor& x) const override {
    return wall_.call("forward_eval", [&] { return inner_->forward_eval(params, x); });
  }
  int64_t forward_flops() const override { return wall_.call("forward_flops", [&] { return inner_->forward_flops(); }); }
  int64_t num_parameters() const override { return wall_.call("num_parameters", [&] { return inner_->num_parameters(); }); }
  int64_t activations_per_example() const override {
    return wall_.call("activations_per_example", [&] { return inner_->activations_per_example(); });
  }
  std::optional<InputLayer> input_layer() const override {
    return wall_.call("input_layer", [&] { return inner_->input_layer(); });
  }
  at::Tensor input_features(const TensorTree& params, const at::Tensor& x) const override {
    return wall_.call("input_features", [&] { return inner_->input_features(params, x); });
  }
  at::Tensor forward_from_input_layer(const TensorTree& params, const at::Tensor& z) const override {
    return wall_.call("forward_from_input_layer", [&] { return inner_->forward_from_input_layer(params, z); });
  }
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& labels) const override {
    return wall_.call("loss", [&] { return inner_->loss(logits, labels); });
  }
  bool is_buffer(const std::string& leaf) const override {
    return wall_.call("is_buffer", [&] { return inner_->is_buffer(leaf); });
  }
  int64_t preferred_chunk() const override { return wall_.call("preferred_chunk", [&] { return inner_->preferred_chunk(); }); }

 private:
  Model* inner_;
  Wall wall_;
};

// The plugin's data set behind the same wall.
class GuardedDataset final : public FederatedDataset {
 public:
  GuardedDataset(FederatedDataset* inner, const FaxPluginInfo* info, std::string who)
      : inner_(inner), wall_(inner, info, std::move(who)) {}

  std::string describe() const override { return wall_.call("describe", [&] { return inner_->describe(); }); }
  int64_t num_clients() const override { return wall_.call("num_clients", [&] { return inner_->num_clients(); }); }
  int64_t num_examples(int64_t client) const override {
    return wall_.call("num_examples", [&] { return inner_->num_examples(client); });
  }
  Examples client(int64_t client) const override { return wall_.call("client", [&] { return inner_->client(client); }); }
  std::string client_name(int64_t client) const override {
    return wall_.call("client_name", [&] { return inner_->client_name(client); });
  }
  const Examples& test() const override { return wall_.call("test", [&]() -> const Examples& { return inner_->test(); }); }
  std::vector<int64_t> input_shape() const override { return wall_.call("input_shape", [&] { return inner_->input_shape(); }); }
  int64_t num_classes() const override { return wall_.call("num_classes", [&] { return inner_->num_classes(); }); }
  std::optional<Augmentation> augmentation() const override {
    return wall_.call("augmentation", [&] { return inner_->augmentation(); });
  }
  const Examples* pool() const override { return wall_.call("pool", [&] { return inner_->pool(); }); }
  at::Tensor client_rows(int64_t client) const override {
    return wall_.call("client_rows", [&] { return inner_->client_rows(client); });
  }

 private:
  FederatedDataset* inner_;
  Wall wall_;
};

// "algorithm plugin 'fedavg' (/path/fax_fedavg.so)": how errors name a plugin.
std::string describe_plugin(const std::string& kind, const std::string& name, const std::string& path) {
  return fmt::format("{} plugin '{}' ({})", kind, name, path);
}

// A new object of the plugin `info`, made by its create() from `args`.
void* create_from(const FaxPluginInfo* info, const std::string& who, const void* args) {
  void* created = nullptr;
  try {
    created = info->create(args);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", who, e.what()));
  } catch (...) {
    throw Error(fmt::format("{} failed to create its {}: {}", who, info->kind, detail::describe(std::current_exception())));
  }
  FAX_CHECK(created != nullptr, "{} failed to create its {}", who, info->kind);
  return created;
}

// While a library's own code runs for the first time (its constructors in dlopen, its entry
// point), a crash names the library instead of killing fax-run anonymously. The message is built
// before, so the handler only writes it (async-signal-safe) and exits.
class CrashNamesPlugin {
 public:
  explicit CrashNamesPlugin(const std::string& path) {
    const std::string text = fmt::format("fax-run: plugin {}: crashed while loading (signal ", path);
    std::snprintf(message_, sizeof message_, "%s", text.c_str());
    struct sigaction action {};
    action.sa_handler = &CrashNamesPlugin::on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND;
    for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &action, &previous_[i]);
  }
  ~CrashNamesPlugin() {
    for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &previous_[i], nullptr);
  }
  CrashNamesPlugin(const CrashNamesPlugin&) = delete;
  CrashNamesPlugin& operator=(const CrashNamesPlugin&) = delete;

 private:
  static constexpr std::array<int, 5> kSignals{SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  static void on_signal(int signal) {
    char number[8];
    int n = 0;
    for (int v = signal; v > 0 && n < 7; v /= 10) number[n++] = static_cast<char>('0' + v % 10);
    (void)!::write(STDERR_FILENO, message_, std::strlen(message_));
    while (n > 0) (void)!::write(STDERR_FILENO, &number[--n], 1);
    (void)!::write(STDERR_FILENO, ")\n", 2);
    _exit(2);
  }
  static char message_[4096];
  std::array<struct sigaction, kSignals.size()> previous_{};
};

char CrashNamesPlugin::message_[4096];

}  // namespace

namespace {

// Loads the library at `path` and checks what its entry point says against this fax.
const FaxPluginInfo* open_library(const std::string& path) {
  FAX_CHECK(fs::exists(path), "plugin {}: no such file", path);
  const CrashNamesPlugin crash_names_plugin(path);
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  FAX_CHECK(handle != nullptr, "plugin {}: cannot load: {}", path, dlerror());
  {
    std::lock_guard<std::mutex> lock(loaded_mutex);
    loaded_handles.push_back(handle);
  }
  auto entry = reinterpret_cast<FaxPluginEntry>(dlsym(handle, FAX_PLUGIN_ENTRY_POINT));
  FAX_CHECK(entry != nullptr, "plugin {}: no entry point '{}' (is FAX_PLUGIN(Type) missing?)", path,
            FAX_PLUGIN_ENTRY_POINT);
  const FaxPluginInfo* info = nullptr;
  try {
    info = entry();
  } catch (...) {
    throw Error(fmt::format("plugin {}: its entry point threw: {}", path, detail::describe(std::current_exception())));
  }
  FAX_CHECK(info != nullptr, "plugin {}: its entry point returned nothing", path);
  FAX_CHECK(info->abi_version == FAX_PLUGIN_ABI_VERSION,
            "plugin {} was built for plugin ABI version {}, but this fax ({}) loads plugin ABI version {}: "
            "rebuild the plugin against fax {}",
            path, info->abi_version, FAX_VERSION, FAX_PLUGIN_ABI_VERSION, FAX_VERSION);
  FAX_CHECK(major_minor(info->fax_version) == major_minor(FAX_VERSION),
            "plugin {} was built against fax {}, but this is fax {}: rebuild the plugin", path, info->fax_version,
            FAX_VERSION);
  FAX_CHECK(std::string(info->torch_version) == TORCH_VERSION,
            "plugin {} was built against LibTorch {}, but fax runs on LibTorch {}: rebuild the plugin", path,
            info->torch_version, TORCH_VERSION);
  FAX_CHECK(info->cxx11_abi == _GLIBCXX_USE_CXX11_ABI,
            "plugin {} was built with _GLIBCXX_USE_CXX11_ABI={}, but fax uses {}: rebuild the plugin", path,
            info->cxx11_abi, _GLIBCXX_USE_CXX11_ABI);
  FAX_CHECK(info->kind != nullptr && info->name != nullptr && info->description != nullptr &&
                (info->keys != nullptr || info->num_keys == 0) && info->create != nullptr && info->destroy != nullptr,
            "plugin {}: its entry point returned an incomplete description", path);
  const std::string kind = info->kind;
  FAX_CHECK(kind == kAlgorithmPlugin || kind == kModelPlugin || kind == kDatasetPlugin,
            "plugin {}: unknown kind '{}' (this fax loads algorithm, model and dataset plugins)", path, kind);
  return info;
}

// The library at `path`, which must be a plugin of `kind`, as a registry entry of type Entry.
template <class Entry>
std::shared_ptr<Entry> open_plugin(const std::string& path, const char* kind) {
  const FaxPluginInfo* info = open_library(path);
  const auto a = [](const std::string& k) { return (k == kAlgorithmPlugin ? "an " : "a ") + k; };
  const std::string section = std::string(info->kind) == kDatasetPlugin ? "data" : info->kind;
  FAX_CHECK(std::string(info->kind) == kind, "plugin {} holds {}, not {}: name it in {}.name", path, a(info->kind),
            a(kind), section);
  auto plugin = std::make_shared<Entry>();
  plugin->path = path;
  plugin->name = info->name;
  plugin->description = info->description;
  plugin->fax_version = info->fax_version;
  plugin->torch_version = info->torch_version;
  plugin->info = info;
  for (size_t i = 0; i < info->num_keys; ++i) {
    const FaxPluginKey& k = info->keys[i];
    plugin->keys.push_back({k.name, parse_key_type(k.type, k.name, path), k.default_value, k.doc, k.min, k.max,
                            k.min_exclusive != 0, split(k.choices, ',')});
  }
  return plugin;
}

}  // namespace

std::shared_ptr<const Plugin> load_plugin_file(const std::string& path) {
  auto plugin = open_plugin<Plugin>(path, kAlgorithmPlugin);
  plugin->create = [info = plugin->info, who = describe_plugin(kAlgorithmPlugin, plugin->name, path)] {
    auto* inner = static_cast<Algorithm*>(create_from(info, who, nullptr));
    return AlgorithmInstance(new GuardedAlgorithm(inner, info, who), [](Algorithm* a) { delete a; });
  };
  return plugin;
}

std::shared_ptr<const ModelPlugin> load_model_plugin_file(const std::string& path) {
  auto plugin = open_plugin<ModelPlugin>(path, kModelPlugin);
  plugin->create = [info = plugin->info, who = describe_plugin(kModelPlugin, plugin->name, path)](
                       const Config& config, const ModelShape& shape) -> std::unique_ptr<Model> {
    const ModelPluginArgs args{&config, &shape};
    auto* inner = static_cast<Model*>(create_from(info, who, &args));
    return std::make_unique<GuardedModel>(inner, info, who);
  };
  return plugin;
}

std::shared_ptr<const DatasetPlugin> load_dataset_plugin_file(const std::string& path) {
  auto plugin = open_plugin<DatasetPlugin>(path, kDatasetPlugin);
  plugin->create = [info = plugin->info, who = describe_plugin(kDatasetPlugin, plugin->name, path)](
                       const Config& config) -> std::unique_ptr<FederatedDataset> {
    const DatasetPluginArgs args{&config};
    auto* inner = static_cast<FederatedDataset*>(create_from(info, who, &args));
    return std::make_unique<GuardedDataset>(inner, info, who);
  };
  return plugin;
}

std::string plugin_kind(const std::string& path) { return open_library(path)->kind; }

std::string file_fingerprint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FAX_CHECK(in.good(), "cannot read {}", path);
  uint64_t hash = fnv1a({});
  int64_t size = 0;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    hash = fnv1a({buffer, static_cast<size_t>(in.gcount())}, hash);
    size += in.gcount();
  }
  FAX_CHECK(!in.bad(), "cannot read {}", path);
  return describe_fingerprint(size, hash);
}

PluginLoader::PluginLoader(std::vector<std::string> plugin_dirs) : search_path_(std::move(plugin_dirs)) {
  if (const char* env = std::getenv("FAX_PLUGIN_PATH")) {
    for (const auto& dir : split(env, ':')) search_path_.push_back(dir);
  }
  const fs::path exe = executable_dir();
  if (!exe.empty()) search_path_.push_back((exe.parent_path() / "lib" / "fax" / "plugins").string());
}

std::optional<std::string> PluginLoader::locate(const std::string& name) const {
  if (name.find('/') != std::string::npos) return name;
  for (const auto& dir : search_path_) {
    const fs::path candidate = fs::path(dir) / ("fax_" + name + ".so");
    if (fs::exists(candidate)) return candidate.string();
  }
  return std::nullopt;
}

std::string PluginLoader::find(const std::string& name, const char* kind) const {
  if (const auto path = locate(name)) return *path;
  const std::string file = "fax_" + name + ".so";
  // The names of the files only: loading every plugin to list them would run their code.
  std::vector<std::string> available;
  for (const auto& path : candidates()) available.push_back(fs::path(path).stem().string().substr(4));
  throw Error(fmt::format("{} plugin '{}' not found: no {} in {} (available: {})", kind, name, file,
                          fmt::join(search_path_, ", "), available.empty() ? "none" : fmt::to_string(fmt::join(available, ", "))));
}

std::shared_ptr<const Plugin> PluginLoader::load(const std::string& name) const {
  return load_plugin_file(find(name, kAlgorithmPlugin));
}

std::shared_ptr<const ModelPlugin> PluginLoader::load_model(const std::string& name) const {
  return load_model_plugin_file(find(name, kModelPlugin));
}

std::shared_ptr<const DatasetPlugin> PluginLoader::load_dataset(const std::string& name) const {
  return load_dataset_plugin_file(find(name, kDatasetPlugin));
}

std::vector<std::string> PluginLoader::candidates() const {
  std::vector<std::string> out;
  std::vector<std::string> seen;
  for (const auto& dir : search_path_) {
    std::error_code ec;
    std::vector<fs::path> files;
    for (const auto& item : fs::directory_iterator(dir, ec)) {
      const std::string filename = item.path().filename().string();
      if (filename.rfind("fax_", 0) == 0 && item.path().extension() == ".so") files.push_back(item.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& path : files) {
      const std::string stem = path.stem().string();
      if (std::find(seen.begin(), seen.end(), stem) != seen.end()) continue;
      seen.push_back(stem);
      out.push_back(path.string());
    }
  }
  return out;
}

}  // namespace fax
