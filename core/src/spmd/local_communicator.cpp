#include <fax/spmd/local_communicator.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include <ATen/ATen.h>

#include <fax/base/cohort.h>
#include <fax/base/error.h>

#include <fax/spmd/ordered_sum.h>

namespace fax {
namespace {

enum class Kind { allreduce_sum, broadcast, allgather, barrier };

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::allreduce_sum: return "allreduce_sum";
    case Kind::broadcast: return "broadcast";
    case Kind::allgather: return "allgather";
    case Kind::barrier: return "barrier";
  }
  return "?";
}

// What a rank says it is doing when it arrives at a rendezvous; all ranks must agree.
struct Signature {
  Kind kind = Kind::barrier;
  int phase = 0;
  int64_t count = 0;  // values reduced, or the broadcast root
  bool operator==(const Signature& o) const { return kind == o.kind && phase == o.phase && count == o.count; }
};

// Below this many elements a value is reduced by one rank alone: splitting it would cost more in
// kernel calls than it saves.
constexpr int64_t kSplitThreshold = 1 << 14;

}  // namespace

/// Shared state of the ranks of one LocalGroup. Every collective is: deposit a pointer to the
/// caller's arguments, rendezvous, read the others' arguments in place, rendezvous again so no rank
/// leaves while others still read its arguments. Allreduce writes into a shared output that ranks
/// copy after the second rendezvous; outputs alternate between two slots, which is safe because a
/// rank can only reach collective k + 2 after every rank has left collective k.
class LocalHub {
 public:
  explicit LocalHub(int ranks)
      : ranks_(ranks), arrivals_(ranks), inputs_{std::vector<const void*>(ranks), std::vector<const void*>(ranks)} {}

  int ranks() const { return ranks_; }

  void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    arrived_ = 0;
    aborted_ = false;
    abort_reason_.clear();
    finished_rank_ = -1;
    collective_ = 0;
  }

  void abort(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_) {
      aborted_ = true;
      abort_reason_ = reason;
    }
    cv_.notify_all();
  }

  void finish(int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_rank_ < 0) finished_rank_ = rank;
    cv_.notify_all();
  }

  // Blocks until every rank has arrived with the same signature; `on_complete` runs once, under
  // the lock, by the last rank to arrive.
  void rendezvous(int rank, Signature signature, const std::function<void()>& on_complete = {}) {
    std::unique_lock<std::mutex> lock(mutex_);
    throw_if_unusable(rank, signature);
    arrivals_[rank] = signature;
    const uint64_t generation = generation_;
    if (++arrived_ == ranks_) {
      arrived_ = 0;
      for (int r = 0; r < ranks_; ++r) {
        if (!(arrivals_[r] == arrivals_[0])) {
          aborted_ = true;
          abort_reason_ = fmt::format(
              "executors disagree on collective #{}: executor 0 called {}({}) but executor {} called {}({}); "
              "every executor must run the same collectives in the same order",
              collective_, kind_name(arrivals_[0].kind), arrivals_[0].count, r,
              kind_name(arrivals_[r].kind), arrivals_[r].count);
          cv_.notify_all();
          throw Error(abort_reason_);
        }
      }
      if (signature.phase == 0) ++collective_;
      if (on_complete) on_complete();
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation || aborted_ || finished_rank_ >= 0; });
    if (generation_ != generation) return;
    throw_if_unusable(rank, signature);
  }

  // The argument slot and shared output of collective `parity`.
  std::vector<const void*>& inputs(uint64_t parity) { return inputs_[parity & 1]; }
  std::vector<at::Tensor>& outputs(uint64_t parity) { return outputs_[parity & 1]; }

 private:
  void throw_if_unusable(int rank, const Signature& signature) {
    if (aborted_) throw Error(abort_reason_);
    if (finished_rank_ >= 0) {
      throw Error(fmt::format(
          "executor {} entered {} but executor {} had already returned from the program: every "
          "executor must run the same collectives in the same order",
          rank, kind_name(signature.kind), finished_rank_));
    }
  }

  const int ranks_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  uint64_t collective_ = 0;
  std::vector<Signature> arrivals_;
  bool aborted_ = false;
  std::string abort_reason_;
  int finished_rank_ = -1;
  std::vector<const void*> inputs_[2];
  std::vector<at::Tensor> outputs_[2];
};

namespace {

// Splits value j's elements over ranks: returns rank's [begin, length).
Range value_slice(int64_t numel, size_t j, int rank, int ranks) {
  if (numel < kSplitThreshold) {
    return static_cast<int>(j % ranks) == rank ? Range{0, numel} : Range{0, 0};
  }
  return {numel * rank / ranks, numel * (rank + 1) / ranks};
}

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return hub_->ranks(); }

  std::vector<at::Tensor> allreduce_sum(const std::vector<ShardPartial>& partials) override {
    const int64_t count = partials.empty() ? -1 : static_cast<int64_t>(partials.front().values.size());
    for (const auto& p : partials)
      FAX_ASSERT(static_cast<int64_t>(p.values.size()) == count, "shard partials of unequal length");
    const uint64_t parity = sequence_++;
    auto& inputs = hub_->inputs(parity);
    inputs[rank_] = &partials;
    hub_->rendezvous(rank_, {Kind::allreduce_sum, 0, count}, [&] {
      auto ordered = gather_ordered(inputs);
      auto& outputs = hub_->outputs(parity);
      outputs.clear();
      for (const auto& v : ordered.front()->values)
        outputs.push_back(at::empty(v.sizes(), v.options().memory_format(at::MemoryFormat::Contiguous)));
    });
    const auto ordered = gather_ordered(inputs);
    auto& outputs = hub_->outputs(parity);
    for (size_t j = 0; j < outputs.size(); ++j) {
      detail::check_same_shapes(ordered, j);
      const Range slice = value_slice(outputs[j].numel(), j, rank_, size());
      if (slice.size() > 0) detail::ordered_sum_slice(ordered, j, outputs[j], slice.begin, slice.size());
    }
    hub_->rendezvous(rank_, {Kind::allreduce_sum, 1, count});
    if (size() == 1) return std::move(outputs);  // nobody else reads it
    std::vector<at::Tensor> result;
    result.reserve(outputs.size());
    for (const auto& out : outputs) result.push_back(out.clone());
    return result;
  }

  std::vector<at::Tensor> broadcast(const std::vector<at::Tensor>& values, int root) override {
    FAX_CHECK(root >= 0 && root < size(), "broadcast root {} is not an executor (0..{})", root, size() - 1);
    auto& inputs = hub_->inputs(sequence_++);
    inputs[rank_] = &values;
    hub_->rendezvous(rank_, {Kind::broadcast, 0, root});
    std::vector<at::Tensor> result;
    if (rank_ == root) {
      result = values;
    } else {
      const auto& source = *static_cast<const std::vector<at::Tensor>*>(inputs[root]);
      for (const auto& v : source) result.push_back(v.clone());
    }
    hub_->rendezvous(rank_, {Kind::broadcast, 1, root});
    return result;
  }

  std::vector<at::Tensor> allgather(const at::Tensor& local) override {
    auto& inputs = hub_->inputs(sequence_++);
    inputs[rank_] = &local;
    hub_->rendezvous(rank_, {Kind::allgather, 0, 1});
    std::vector<at::Tensor> result;
    for (int r = 0; r < size(); ++r) {
      const auto& t = *static_cast<const at::Tensor*>(inputs[r]);
      result.push_back(r == rank_ ? t : t.clone());
    }
    hub_->rendezvous(rank_, {Kind::allgather, 1, 1});
    return result;
  }

  void barrier() override { hub_->rendezvous(rank_, {Kind::barrier, 0, 0}); }
  void abort(const std::string& reason) override { hub_->abort(reason); }
  void finish() override { hub_->finish(rank_); }
  void reset_sequence() { sequence_ = 0; }

 private:
  // All ranks' shard partials sorted by shard index.
  static std::vector<const ShardPartial*> gather_ordered(const std::vector<const void*>& inputs) {
    std::vector<const ShardPartial*> all;
    for (const void* in : inputs)
      for (const auto& p : *static_cast<const std::vector<ShardPartial>*>(in)) all.push_back(&p);
    return detail::by_shard(std::move(all));
  }

  std::shared_ptr<LocalHub> hub_;
  int rank_;
  uint64_t sequence_ = 0;
};

}  // namespace

LocalGroup::LocalGroup(int executors) : hub_(std::make_shared<LocalHub>(executors)) {
  FAX_CHECK(executors > 0, "a local group needs at least one executor (got {})", executors);
  for (int r = 0; r < executors; ++r) communicators_.push_back(std::make_unique<LocalCommunicator>(hub_, r));
}

LocalGroup::~LocalGroup() = default;

void LocalGroup::reset() {
  hub_->reset();
  for (auto& c : communicators_) static_cast<LocalCommunicator&>(*c).reset_sequence();
}

}  // namespace fax
