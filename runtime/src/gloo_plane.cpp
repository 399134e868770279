#include "gloo_plane.h"

#include <fax/runtime/remote.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fax/spmd/ordered_sum.h>

namespace fax::remote {
namespace {

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    throw CommunicationError(fmt::format("Gloo {} failed: {}", what, e.what()));
  }
}

}  // namespace

struct GlooStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

GlooStore::GlooStore(double timeout_s) : impl_(std::make_unique<Impl>()) {
  c10d::TCPStoreOptions o;
  o.port = 0;  // any free port; workers learn it from their tasks
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = millis(timeout_s);
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>("0.0.0.0", o);
  } catch (const std::exception& e) {
    throw Error(fmt::format("cannot start the Gloo rendezvous store: {}", e.what()));
  }
}

GlooStore::~GlooStore() = default;

int GlooStore::port() const { return impl_->store->getPort(); }


struct GlooGroup::Impl {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  int rank = 0;
  int size = 0;

  // One exchange for the values `which` (all of one dtype), flattened one after the other.
  void exchange(const std::vector<const ShardPartial*>& local, const std::vector<size_t>& which,
                const std::vector<int64_t>& shards_per_rank, std::vector<at::Tensor>& out) {
    const at::Tensor& first = local.front()->values[which.front()];
    const auto options = first.options().memory_format(at::MemoryFormat::Contiguous);
    int64_t total = 0;
    for (size_t j : which) total += local.front()->values[j].numel();
    if (total == 0) {
      for (size_t j : which) out[j] = at::empty(local.front()->values[j].sizes(), options);
      return;
    }
    const int64_t W = size, mine = static_cast<int64_t>(local.size());
    const int64_t L = std::accumulate(shards_per_rank.begin(), shards_per_rank.end(), int64_t{0});
    const int64_t slice = (total + W - 1) / W;  // padded so that every rank owns an equal slice

    at::Tensor flat = at::empty({mine, W * slice}, options);
    for (int64_t s = 0; s < mine; ++s) {
      int64_t offset = 0;
      for (size_t j : which) {
        const at::Tensor& v = local[static_cast<size_t>(s)]->values[j];
        flat[s].narrow(0, offset, v.numel()).copy_(v.reshape({-1}));
        offset += v.numel();
      }
      flat[s].narrow(0, total, W * slice - total).zero_();
    }
    // Rows grouped by destination rank: row d * mine + s is slice d of local shard s.
    at::Tensor send = flat.view({mine, W, slice}).transpose(0, 1).contiguous().view({W * mine, slice});
    at::Tensor received = at::empty({L, slice}, options);  // slice `rank` of every shard, in shard order
    std::vector<int64_t> send_counts(static_cast<size_t>(W), mine), receive_counts = shards_per_rank;
    wait(group->alltoall_base(received, send, receive_counts, send_counts), "alltoall");

    // This rank's slice of the sum, added in shard order as detail::ordered_sum_slice does.
    at::Tensor sum = received[0].clone();
    for (int64_t s = 1; s < L; ++s) sum.add_(received[s]);

    at::Tensor gathered = at::empty({W, slice}, options);
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int64_t r = 0; r < W; ++r) outputs[0].push_back(gathered[r]);
    std::vector<at::Tensor> inputs{sum};
    wait(group->allgather(outputs, inputs), "allgather");

    const at::Tensor all = gathered.view({-1});
    int64_t offset = 0;
    for (size_t j : which) {
      const at::Tensor& v = local.front()->values[j];
      out[j] = all.narrow(0, offset, v.numel()).view(v.sizes());
      offset += v.numel();
    }
  }
};

GlooGroup::GlooGroup(const std::string& store_ip, int store_port, int64_t generation, int rank, int size,
                     double timeout_s, const std::string& local_ip)
    : impl_(std::make_unique<Impl>()), generation_(generation) {
  impl_->rank = rank;
  impl_->size = size;
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(store_port);
    o.isServer = false;
    o.timeout = millis(timeout_s);
    auto store = c10::make_intrusive<c10d::TCPStore>(store_ip, o);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(fmt::format("fax/generation/{}", generation), store);
    auto options = c10d::ProcessGroupGloo::Options::create(millis(timeout_s));
    const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
    options->devices.push_back(interface && *interface
                                   ? c10d::ProcessGroupGloo::createDeviceForInterface(interface)
                                   : c10d::ProcessGroupGloo::createDeviceForHostname(local_ip));
    options->threads = 1;  // collectives are issued and waited for one at a time
    impl_->group = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, options);
  } catch (const std::exception& e) {
    throw CommunicationError(fmt::format("cannot join Gloo group {} as rank {} of {} (store {}:{}): {}", generation,
                                         rank, size, store_ip, store_port, e.what()));
  }
}

GlooGroup::~GlooGroup() = default;

std::vector<at::Tensor> GlooGroup::allreduce_sum(const std::vector<ShardPartial>& partials,
                                                 const std::vector<int64_t>& shards_per_rank) {
  std::vector<const ShardPartial*> local;
  for (const auto& p : partials) local.push_back(&p);
  std::sort(local.begin(), local.end(), [](const ShardPartial* a, const ShardPartial* b) { return a->shard < b->shard; });
  FAX_ASSERT(static_cast<int64_t>(local.size()) == shards_per_rank.at(static_cast<size_t>(impl_->rank)),
             "Gloo allreduce: rank {} passes {} shard partials but owns {} logical shards", impl_->rank, local.size(),
             shards_per_rank[static_cast<size_t>(impl_->rank)]);
  FAX_ASSERT(!local.empty(), "Gloo allreduce over no logical shards");
  const size_t count = local.front()->values.size();
  for (size_t j = 0; j < count; ++j) detail::check_same_shapes(local, j);
  std::vector<at::Tensor> out(count);
  std::vector<bool> done(count, false);
  for (size_t j = 0; j < count; ++j) {
    if (done[j]) continue;
    const at::ScalarType dtype = local.front()->values[j].scalar_type();
    std::vector<size_t> which;
    for (size_t k = j; k < count; ++k) {
      if (!done[k] && local.front()->values[k].scalar_type() == dtype) {
        which.push_back(k);
        done[k] = true;
      }
    }
    impl_->exchange(local, which, shards_per_rank, out);
  }
  return out;
}

}  // namespace fax::remote

namespace fax {
namespace {

// A client of the store at host:port, or an Error saying which store could not be reached.
c10::intrusive_ptr<c10d::TCPStore> launcher_store(const std::string& host, int port, double timeout_s) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = remote::millis(timeout_s);
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, o);
  } catch (const std::exception& e) {
    throw Error(fmt::format("cannot reach the launcher's store at {}:{}: {}", host, port, e.what()));
  }
}

}  // namespace

void launcher_store_set(const std::string& host, int port, const std::string& key, const std::string& value,
                        double timeout_s) {
  const auto store = launcher_store(host, port, timeout_s);
  try {
    store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    throw Error(fmt::format("cannot set '{}' in the launcher's store at {}:{}: {}", key, host, port, e.what()));
  }
}

std::string launcher_store_get(const std::string& host, int port, const std::string& key, double timeout_s) {
  const auto store = launcher_store(host, port, timeout_s);
  try {
    const std::vector<uint8_t> value = store->get(key);
    return std::string(value.begin(), value.end());
  } catch (const std::exception& e) {
    throw Error(fmt::format("'{}' did not appear in the launcher's store at {}:{} within {} s: {}", key, host, port,
                            timeout_s, e.what()));
  }
}

}  // namespace fax
