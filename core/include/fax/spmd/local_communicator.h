#pragma once

#include <memory>
#include <vector>

#include <fax/spmd/communicator.h>

namespace fax {

class LocalHub;

/// The in-process backend: one communicator per executor thread, all attached to one hub in shared
/// memory. Collectives read the other ranks' tensors in place; the only copy is each rank's result.
class LocalGroup {
 public:
  explicit LocalGroup(int executors);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int size() const { return static_cast<int>(communicators_.size()); }
  Communicator& communicator(int rank) { return *communicators_.at(rank); }

  /// Forgets an abort or finished ranks of the previous program. Call only while no rank runs.
  void reset();

 private:
  std::shared_ptr<LocalHub> hub_;
  std::vector<std::unique_ptr<Communicator>> communicators_;
};

}  // namespace fax
