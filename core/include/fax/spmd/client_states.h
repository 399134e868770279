#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include <fax/base/tensor_tree.h>
#include <fax/spmd/primitives.h>

namespace fax {

/// State that an algorithm keeps for each client from one round to the next (SCAFFOLD's control
/// variates), keyed by client id. Every executor reads and writes only its own clients, so the
/// result does not depend on how clients map to executors. Saved in checkpoints.
class ClientStates {
 public:
  /// The leaves named in `initial` (a tree without the clients axis) of the states of a chunk's
  /// clients, stacked along a clients axis; a leaf a client does not have yet is `initial`'s.
  /// Leaves are how users of the states share them (SCAFFOLD's control variates under the
  /// parameters' names, error feedback under aggregation/...).
  TensorTree gather(const ClientChunk& chunk, const TensorTree& initial) const;
  /// Stores rows [k, ...] as the new values of those leaves for the chunk's clients, keeping
  /// their other leaves.
  void scatter(const ClientChunk& chunk, const TensorTree& rows);

  size_t size() const;
  /// All states, stacked in client-id order, with their ids ([n] int64) under "id"; empty when none.
  TensorTree stacked() const;
  /// Replaces the contents with what stacked() produced.
  void restore(const TensorTree& stacked);
  /// Like stacked(), for the clients among `ids` that have a state.
  TensorTree subset(const std::vector<int64_t>& ids) const;
  /// Adds or replaces the states in `stacked` (as stacked() produced it), keeping the others.
  void merge(const TensorTree& stacked);

  /// The states as they are now, to go back to if a round is abandoned: cheap, since a round
  /// replaces a client's tensors (scatter, merge) rather than writing into them.
  using Saved = std::map<int64_t, TensorTree>;
  Saved save() const;
  void roll_back(Saved saved);

 private:
  mutable std::mutex mutex_;
  std::map<int64_t, TensorTree> states_;
};

}  // namespace fax
