#pragma once

#include <cstdint>
#include <string>

#include <fax/base/config.h>
#include <fax/nn/model.h>

namespace fax {

/// What a run will hold in memory and how many threads it starts, worked out from its resolved
/// settings before anything is allocated, so that a run that cannot fit is refused with a clear
/// message instead of driving the machine into the OOM killer or hanging in thread creation.
/// Rough by design (within a small factor): it must catch a width of 10^6 or 10^8 clients, not
/// tell 1.2 GB from 1.5 GB.
struct ResourceEstimate {
  int64_t data_bytes = 0;   ///< the data set once loaded (DatasetEntry::estimate_bytes)
  int64_t model_bytes = 0;  ///< the server state and the executors' copies of it
  int64_t chunk_bytes = 0;  ///< local training: each executor's chunk of clients, their parameter copies, gradients, batches and activations
  int64_t threads = 0;      ///< executor threads x intra-op threads, on this host
  int64_t total_bytes() const;
  /// "data 1.2 GB, model 30 MB, local training 2.1 GB, 4 threads".
  std::string describe() const;
};

/// Sizes with `data_bytes` for the data set; `model` (may be null before it is built) adds the
/// parameters, chunks and activations; `remote`: the executors run on other hosts (only the
/// server state is here).
ResourceEstimate estimate_resources(const Config& config, int64_t data_bytes, const Model* model, bool remote);

/// What this host offers: memory available now (MemAvailable, lowered to what a cgroup limit
/// leaves) and its hardware threads.
struct MachineResources {
  int64_t memory_bytes = 0;
  int64_t hardware_threads = 1;
  static MachineResources of_this_host();
  /// The most threads a run may start: 8 per hardware thread, at least 64.
  int64_t max_threads() const;
};

/// "" when `estimate` fits `machine`. Otherwise a fax::Error saying what does not fit and how to
/// shrink it, or, when `force`, the same text returned (to record in the run log) and printed as a
/// warning.
std::string check_resources(const ResourceEstimate& estimate, const MachineResources& machine, bool force);

/// Bytes as "1.5 GB" / "30 MB" / "512 bytes".
std::string format_bytes(int64_t bytes);

}  // namespace fax
