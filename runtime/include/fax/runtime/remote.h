#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fax/base/cohort.h>
#include <fax/base/tensor_tree.h>
#include <fax/spmd/mesh.h>

namespace fax {

/// The programs a remote executor runs: an experiment's round or evaluation. Other values are the
/// TaskFn's own (fax-run bench measures the data plane with one).
enum class TaskKind : int64_t { round = 1, evaluate = 2 };

/// One executor's part of a task: runs the program for `kind` on this executor's clients and
/// returns what goes back to the coordinator.
using TaskFn = std::function<TensorTree(Program& program, TaskKind kind, const TensorTree& input)>;

/// How the executors of a task reduce: through the coordinator over TensorPipe (a star: best for
/// small models and few workers), or directly between the workers over Gloo (LibTorch's
/// c10d::ProcessGroupGloo: for large models, where the coordinator's link would be the limit).
/// Both give the same bits. TensorPipe carries everything else either way.
enum class Collectives { tensorpipe, gloo };

/// Where event lines go (worker connected, refused, dropped); empty: nowhere.
using LogFn = std::function<void(const std::string& line)>;

/// A key of a launcher's rendezvous store: torchrun's agent holds a c10d::TCPStore at
/// MASTER_ADDR:MASTER_PORT (that port is taken, so rank 0 listens elsewhere and says where here).
/// `launcher_store_set` sets the key; `launcher_store_get` waits up to `timeout_s` for it. Both
/// throw fax::Error naming the store and the key.
void launcher_store_set(const std::string& host, int port, const std::string& key, const std::string& value,
                        double timeout_s);
std::string launcher_store_get(const std::string& host, int port, const std::string& key, double timeout_s);

}  // namespace fax
