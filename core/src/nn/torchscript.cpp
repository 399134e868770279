#include <fax/nn/torchscript.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/script.h>

#include <fax/base/error.h>
#include <fax/base/fingerprint.h>

namespace fax {
namespace {

// A LibTorch error in one line, without its C++ backtrace: the first line, or for an error inside
// the TorchScript interpreter (a traceback of the module's code) the last, which says what failed.
std::string first_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  const bool traceback = text.rfind("The following operation failed in the TorchScript interpreter", 0) == 0;
  text = traceback ? text.substr(text.rfind('\n') + 1) : text.substr(0, text.find('\n'));
  return text.empty() ? "unknown error" : text;
}

std::string shape_text(at::IntArrayRef shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// Refuses a module whose forward (or loss) draws random numbers (dropout and the like): they come
// from LibTorch's one global generator, shared by every executor thread, so no run could repeat.
void refuse_random_ops(const torch::jit::Module& module, const std::string& path) {
  static const std::set<std::string> random = {
      "aten::dropout", "aten::dropout_", "aten::feature_dropout", "aten::alpha_dropout", "aten::feature_alpha_dropout",
      "aten::bernoulli", "aten::bernoulli_", "aten::rand", "aten::rand_like", "aten::randn", "aten::randn_like",
      "aten::randint", "aten::randint_like", "aten::randperm", "aten::normal", "aten::normal_", "aten::uniform_",
      "aten::multinomial", "aten::rrelu", "aten::rrelu_with_noise", "aten::exponential_", "aten::geometric_",
      "aten::cauchy_", "aten::log_normal_", "aten::random_", "aten::poisson"};
  for (const torch::jit::Method& method : module.get_methods()) {
    if (method.name() != "forward" && method.name() != "loss") continue;
    const std::shared_ptr<torch::jit::Graph> graph = method.graph()->copy();
    torch::jit::Inline(*graph);
    std::vector<torch::jit::Block*> blocks{graph->block()};
    while (!blocks.empty()) {
      torch::jit::Block* block = blocks.back();
      blocks.pop_back();
      for (torch::jit::Node* node : block->nodes()) {
        const std::string kind = node->kind().toQualString();
        FAX_CHECK(random.count(kind) == 0,
                  "model.path: {}: {}() draws random numbers ({}), which no fax run could repeat; remove it (or "
                  "make it a no-op in training) before saving the module",
                  path, method.name(), kind);
        for (torch::jit::Block* inner : node->blocks()) blocks.push_back(inner);
      }
    }
  }
}

// A copy of the module for one thread at a time, with the slots of its parameters and buffers.
using Slot = std::pair<c10::intrusive_ptr<c10::ivalue::Object>, size_t>;

// The object and attribute slot of a dotted attribute name of `module` ("block.0.weight": the
// attribute "weight" of the object block.0).
Slot find_slot(const torch::jit::Module& module, const std::string& name) {
  c10::intrusive_ptr<c10::ivalue::Object> object = module._ivalue();
  std::string rest = name;
  for (size_t dot = rest.find('.'); dot != std::string::npos; dot = rest.find('.')) {
    object = object->getAttr(rest.substr(0, dot)).toObject();
    rest = rest.substr(dot + 1);
  }
  return {object, object->type()->getAttributeSlot(rest)};
}

struct ModuleCopy {
  torch::jit::Module module;
  std::vector<Slot> slots;  // in leaf order
  std::vector<std::pair<Slot, at::Tensor>> counters;  // integer buffers and their saved values
  bool training = true;

  void set(size_t leaf, const at::Tensor& value) { slots[leaf].first->setSlot(slots[leaf].second, value); }
  // Integer buffers (num_batches_tracked) back at their saved values, so no call sees what an
  // earlier call on this copy (another client, another round) counted.
  void reset_counters() {
    for (auto& [slot, saved] : counters) slot.first->setSlot(slot.second, saved.clone());
  }
  void set_mode(bool train) {
    if (training != train) module.train(train);
    training = train;
  }
};

class TorchScriptModel final : public Model {
 public:
  TorchScriptModel(std::string path, const std::string& bytes, const ModelShape& shape);

  std::string describe() const override { return description_; }
  TensorTree init(at::Generator) const override {
    return initial_.map([](const at::Tensor& t) { return t.clone(); });
  }
  at::Tensor forward(const TensorTree& params, const at::Tensor& x) const override { return run(params, x, true); }
  at::Tensor forward_eval(const TensorTree& params, const at::Tensor& x) const override {
    return run(params, x, false);
  }
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& labels) const override;
  bool is_buffer(const std::string& leaf) const override { return buffers_.count(leaf) > 0; }
  int64_t forward_flops() const override { return flops_; }
  int64_t num_parameters() const override { return initial_.numel(); }
  int64_t preferred_chunk() const override {
    // Chunks whose parameters fill about 4 MiB: client after client, the chunk's parameters, their
    // gradients and the stacked updates then stay in cache (the MLP's 0.8 MB: chunks of 5;
    // `fax-run bench`: 16 at once were 1.5x slower than 4).
    return std::max<int64_t>(1, (int64_t{4} << 20) / std::max<int64_t>(1, 4 * initial_.numel()));
  }

 private:
  class Lease;
  at::Tensor run(const TensorTree& params, const at::Tensor& x, bool train) const;
  // Calls the module's `method` on `inputs` and checks that it returns a tensor.
  at::Tensor call(ModuleCopy& copy, const char* method, std::vector<c10::IValue> inputs) const;
  std::unique_ptr<ModuleCopy> make_copy() const;

  std::string path_;
  std::string description_;
  torch::jit::Module module_;
  TensorTree initial_;            // parameters and floating buffers, as saved
  std::vector<std::string> names_;
  std::set<std::string> buffers_;
  bool has_loss_ = false;
  int64_t label_rank_ = 1;  // of one client's labels: [batch], or [batch, tokens]
  int64_t flops_ = 1;
  mutable std::mutex mutex_;
  mutable std::vector<std::unique_ptr<ModuleCopy>> free_;  // copies no thread uses now
};

// A module copy held by one call, given back when it ends with the saved values in its slots (so
// it keeps no client's tensors alive).
class TorchScriptModel::Lease {
 public:
  explicit Lease(const TorchScriptModel& model) : model_(model) {
    // Cloning registers the copy's methods in the module's compilation unit, which is not
    // thread-safe: copies are made under the lock too (once per thread that runs the model).
    std::lock_guard<std::mutex> lock(model.mutex_);
    if (model.free_.empty()) {
      copy_ = model.make_copy();
    } else {
      copy_ = std::move(model.free_.back());
      model.free_.pop_back();
    }
    copy_->reset_counters();
  }
  ~Lease() {
    for (size_t j = 0; j < model_.names_.size(); ++j) copy_->set(j, model_.initial_.at(model_.names_[j]));
    std::lock_guard<std::mutex> lock(model_.mutex_);
    model_.free_.push_back(std::move(copy_));
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ModuleCopy& operator*() const { return *copy_; }

 private:
  const TorchScriptModel& model_;
  std::unique_ptr<ModuleCopy> copy_;
};

std::unique_ptr<ModuleCopy> TorchScriptModel::make_copy() const {
  auto copy = std::make_unique<ModuleCopy>();
  copy->module = module_.clone();
  copy->module.train(true);
  for (const std::string& name : names_) copy->slots.push_back(find_slot(copy->module, name));
  for (const auto& b : module_.named_buffers(true))
    if (!b.value.is_floating_point()) copy->counters.emplace_back(find_slot(copy->module, b.name), b.value.clone());
  return copy;
}

at::Tensor TorchScriptModel::call(ModuleCopy& copy, const char* method, std::vector<c10::IValue> inputs) const {
  // The interpreter runs the graph as saved: no fusion or specialisation that could round
  // differently from one run (or thread) to the next, and plain autograd through every op.
  const torch::jit::GraphOptimizerEnabledGuard plain(false);
  c10::IValue out;
  try {
    out = copy.module.get_method(method)(std::move(inputs));
  } catch (const std::exception& e) {
    throw Error(fmt::format("model.path: {}: {}() failed: {}", path_, method, first_line(e)));
  }
  FAX_CHECK(out.isTensor(), "model.path: {}: {}() returned a {}, not a tensor", path_, method, out.tagKind());
  return out.toTensor();
}

at::Tensor TorchScriptModel::run(const TensorTree& params, const at::Tensor& x, bool train) const {
  FAX_CHECK(params.size() == names_.size(), "model.path: {}: the parameters have {} leaves, the module {}", path_,
            params.size(), names_.size());
  const Lease lease(*this);
  ModuleCopy& copy = *lease;
  copy.set_mode(train);
  const at::Tensor& first = params.at(names_[0]);
  if (first.dim() == initial_.at(names_[0]).dim()) {
    // One model: its buffers are copies, so a forward pass does not change the caller's.
    for (size_t j = 0; j < names_.size(); ++j) {
      const at::Tensor& leaf = params.at(names_[j]);
      copy.set(j, train && is_buffer(names_[j]) ? leaf.clone() : leaf);
    }
    return call(copy, "forward", {x});
  }
  // A chunk of k clients, one at a time: each leaf's rows are views (unbind: one backward node
  // that stacks the k gradients). A buffer's row goes in as a copy, which the training forward pass
  // may update; the update is written back into the chunk's rows when they are the caller's own
  // (local SGD's: no gradient, no broadcast row shared by every client), else dropped.
  const int64_t k = first.size(0);
  FAX_CHECK(x.size(0) == k, "model.path: {}: the input has {} clients, the parameters {}", path_, x.size(0), k);
  std::vector<std::vector<at::Tensor>> rows;
  std::vector<bool> write_back;
  for (const std::string& name : names_) {
    const at::Tensor& leaf = params.at(name);
    rows.push_back(leaf.unbind(0));
    write_back.push_back(train && is_buffer(name) && !leaf.requires_grad() &&
                         at::has_internal_overlap(leaf) == at::MemOverlap::No);
  }
  const std::vector<at::Tensor> inputs = x.unbind(0);
  std::vector<at::Tensor> outputs;
  for (int64_t i = 0; i < k; ++i) {
    std::vector<at::Tensor> buffers(names_.size());
    for (size_t j = 0; j < names_.size(); ++j) {
      if (train && is_buffer(names_[j])) buffers[j] = rows[j][i].detach().clone();
      copy.set(j, buffers[j].defined() ? buffers[j] : rows[j][i]);
    }
    outputs.push_back(call(copy, "forward", {inputs[i]}));
    const at::NoGradGuard no_grad;
    for (size_t j = 0; j < names_.size(); ++j)
      if (write_back[j]) rows[j][i].copy_(buffers[j]);
  }
  return at::stack(outputs);
}

at::Tensor TorchScriptModel::loss(const at::Tensor& logits, const at::Tensor& labels) const {
  if (!has_loss_) return Model::loss(logits, labels);
  if (labels.dim() > label_rank_) {
    // A chunk's clients [k, B, ...]: the module's loss sees one client's batch at a time, as
    // its forward does.
    std::vector<at::Tensor> per_client;
    const std::vector<at::Tensor> client_labels = labels.unbind(0);
    const std::vector<at::Tensor> client_logits = logits.unbind(0);
    for (size_t i = 0; i < client_labels.size(); ++i) per_client.push_back(loss(client_logits[i], client_labels[i]));
    return at::stack(per_client);
  }
  const Lease lease(*this);
  const at::Tensor out = call(*lease, "loss", {logits, labels});
  FAX_CHECK(at::isFloatingType(out.scalar_type()), "model.path: {}: loss() returns {}, not floating point", path_,
            c10::toString(out.scalar_type()));
  FAX_CHECK(out.sizes() == labels.sizes(), "model.path: {}: loss() returned {} for labels {}: it must return one value per label",
            path_, shape_text(out.sizes()), shape_text(labels.sizes()));
  return out;
}

TorchScriptModel::TorchScriptModel(std::string path, const std::string& bytes, const ModelShape& shape)
    : path_(std::move(path)) {
  const std::string hint = "save one with torch.jit.save(torch.jit.script(module), path)";
  try {
    std::istringstream in(bytes);
    module_ = torch::jit::load(in, at::kCPU);
  } catch (const std::exception& e) {
    throw Error(fmt::format("model.path: {} is not a TorchScript module ({}): {}", path_, hint, first_line(e)));
  }
  std::vector<std::pair<std::string, at::Tensor>> seen;
  for (const auto& p : module_.named_parameters(true)) {
    FAX_CHECK(p.value.is_floating_point(), "model.path: {}: parameter {} is {}, not floating point", path_, p.name,
              c10::toString(p.value.scalar_type()));
    // Tied weights would train as separate leaves and drift apart: refused rather than untied.
    for (const auto& [other, t] : seen)
      FAX_CHECK(!p.value.is_alias_of(t), "model.path: {}: parameters {} and {} share their storage (tied weights), "
                "which fax would train apart; untie them in the module", path_, other, p.name);
    seen.emplace_back(p.name, p.value);
    initial_.set(p.name, p.value.detach().clone().contiguous());
    names_.push_back(p.name);
  }
  FAX_CHECK(!names_.empty(), "model.path: {}: the module has no parameters to train", path_);
  refuse_random_ops(module_, path_);
  for (const auto& b : module_.named_buffers(true)) {
    if (!b.value.is_floating_point()) continue;  // counters: they stay in the module
    initial_.set(b.name, b.value.detach().clone().contiguous());
    names_.push_back(b.name);
    buffers_.insert(b.name);
  }
  has_loss_ = module_.find_method("loss").has_value();

  // A batch of 2 zero inputs shaped as the data set's must give one logit per class (per token).
  std::vector<int64_t> input{2};
  input.insert(input.end(), shape.input_shape.begin(), shape.input_shape.end());
  const bool per_token = shape.label_rank >= 0 ? shape.label_rank == 1 : !at::isFloatingType(shape.input_type);
  std::vector<int64_t> labels{2};
  if (per_token) labels.insert(labels.end(), shape.input_shape.begin(), shape.input_shape.end());
  label_rank_ = static_cast<int64_t>(labels.size());
  std::vector<int64_t> expected = labels;
  expected.push_back(shape.num_classes);
  at::Tensor out;
  try {
    // On copies: a forward pass that changes its parameters must not change the saved values.
    out = run(initial_.map([](const at::Tensor& t) { return t.clone(); }), at::zeros(input, shape.input_type), true);
  } catch (const Error& e) {
    throw Error(fmt::format("{} (inputs {} of {}, as the data set gives them)", e.what(), shape_text(input),
                            c10::toString(shape.input_type)));
  }
  FAX_CHECK(out.sizes() == at::IntArrayRef(expected),
            "model.path: {}: forward() maps inputs {} to {}, but the data set needs {} (one logit per class, {} classes)",
            path_, shape_text(input), shape_text(out.sizes()), shape_text(expected), shape.num_classes);
  FAX_CHECK(at::isFloatingType(out.scalar_type()), "model.path: {}: forward() returns {}, not floating point logits", path_,
            c10::toString(out.scalar_type()));
  if (has_loss_) loss(out, at::zeros(labels, at::kLong));
  // FLOPs: a module says nothing of its cost; 2 per parameter per example is a dense model's.
  int64_t buffered = 0;
  for (const auto& b : buffers_) buffered += initial_.at(b).numel();
  flops_ = std::max<int64_t>(1, 2 * (initial_.numel() - buffered));
  description_ = fmt::format("torchscript({} {}: {} parameters{})", std::filesystem::path(path_).filename().string(),
                             describe_fingerprint(static_cast<int64_t>(bytes.size()), fnv1a(bytes)),
                             initial_.numel() - buffered,
                             buffers_.empty() ? "" : fmt::format(", {} buffer elements", buffered));
}

}  // namespace

std::unique_ptr<Model> load_torchscript_model(const std::string& path, const ModelShape& shape) {
  FAX_CHECK(!path.empty(), "model.path: set it to the TorchScript file of the module (model.name: torchscript)");
  struct stat info {};
  FAX_CHECK(::stat(path.c_str(), &info) == 0, "model.path: {}: {}", path, std::strerror(errno));
  FAX_CHECK(S_ISREG(info.st_mode), "model.path: {}: not a regular file", path);
  std::ifstream in(path, std::ios::binary);
  FAX_CHECK(in.good(), "model.path: {}: cannot open: {}", path, std::strerror(errno));
  std::string bytes;
  try {
    bytes.resize(static_cast<size_t>(info.st_size));
  } catch (const std::bad_alloc&) {
    throw Error(fmt::format("model.path: {}: its {} bytes do not fit in memory", path, info.st_size));
  }
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  FAX_CHECK(in.gcount() == static_cast<std::streamsize>(bytes.size()), "model.path: {}: cannot read the whole file", path);
  return std::make_unique<TorchScriptModel>(path, bytes, shape);
}

}  // namespace fax
