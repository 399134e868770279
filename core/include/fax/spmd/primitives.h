#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include <fax/base/error.h>
#include <fax/base/interrupt.h>
#include <fax/base/tensor_tree.h>
#include <fax/spmd/mesh.h>
#include <fax/spmd/placement.h>

/// The federated building blocks. Each is differentiable; the adjoint of broadcast is sum over
/// clients, of sum a broadcast, of mean a broadcast / N, and each backward is written with the
/// primitives themselves, so derivatives of any order are federated computations again.
/// They must be called inside a program (fax::Mesh::run). Server values are replicated on every
/// executor; a clients value holds this executor's clients (Program::local_size() rows).

namespace fax {

/// Server -> clients: every client gets the server value (a view, no copy).
Clients<at::Tensor> broadcast(const Server<at::Tensor>& x);
Clients<TensorTree> broadcast(const Server<TensorTree>& x);

/// Clients -> server: sum over all clients of the cohort, in client order inside each logical
/// shard, then in shard order across shards: the same bits for any number of executors. An empty
/// shard adds -0.0, which changes no sum.
Server<at::Tensor> sum(const Clients<at::Tensor>& x);
Server<TensorTree> sum(const Clients<TensorTree>& x);

/// sum(x) / N, N the cohort size; the mean of no clients is their sum, -0.0.
Server<at::Tensor> mean(const Clients<at::Tensor>& x);
Server<TensorTree> mean(const Clients<TensorTree>& x);

/// sum(w * x) / sum(w), with one weight per client (w has shape [clients]). Differentiable in x
/// and in w. Numerator and denominator travel in one collective.
Server<at::Tensor> weighted_mean(const Clients<at::Tensor>& x, const Clients<at::Tensor>& w);
Server<TensorTree> weighted_mean(const Clients<TensorTree>& x, const Clients<at::Tensor>& w);

/// Applies `fn` to a server value.
template <class F, class T>
auto map_server(F&& fn, const Server<T>& x) {
  using R = std::decay_t<std::invoke_result_t<F&, const T&>>;
  return Server<R>(fn(x.value()));
}

/// Not a federated primitive: gathers every client's row to every executor, in cohort order
/// ([N, ...]). For per-client logging and for tests; not differentiable.
Server<at::Tensor> collect(const Clients<at::Tensor>& x);

/// A run of this executor's clients handed to a map_clients function. Chunks never cross a
/// logical shard, so they are the same whatever the number of executors.
struct ClientChunk {
  const Program& program;
  int64_t shard;  ///< the logical shard holding these clients
  int64_t begin;  ///< row of the first client in this executor's clients values
  int64_t size;   ///< clients in the chunk

  int64_t position(int64_t i) const { return program.local_positions().begin + begin + i; }
  int64_t client_id(int64_t i) const { return program.cohort().id(position(i)); }
  /// Client i's random stream, keyed by (seed, round, client id).
  at::Generator generator(int64_t i) const { return program.client_generator(position(i)); }
};

namespace detail {
int64_t rows(const at::Tensor& x);
int64_t rows(const TensorTree& x);
at::Tensor rows_slice(const at::Tensor& x, int64_t begin, int64_t length);
TensorTree rows_slice(const TensorTree& x, int64_t begin, int64_t length);
at::Tensor rows_concat(const std::vector<at::Tensor>& parts);
TensorTree rows_concat(const std::vector<TensorTree>& parts);
/// Row 0 without the clients axis, and back: map_each_client's per-client view.
at::Tensor rows_select(const at::Tensor& x);
TensorTree rows_select(const TensorTree& x);
at::Tensor rows_unsqueeze(const at::Tensor& x);
TensorTree rows_unsqueeze(const TensorTree& x);
/// The chunks of `chunk` clients (0: a whole shard) of this executor, shard by shard.
std::vector<ClientChunk> chunks(const Program& p, int64_t chunk);
void check_rows(const char* what, int64_t got, int64_t expected);

template <class F, class... T>
auto call_chunk(F& fn, const ClientChunk& c, const T&... args) {
  if constexpr (std::is_invocable_v<F&, const ClientChunk&, const T&...>) {
    return fn(c, args...);
  } else {
    return fn(args...);
  }
}
}  // namespace detail

/// Per-call options of map_clients.
struct MapOptions {
  /// Clients per chunk; 0 takes the program's default (MeshOptions::vectorize).
  int64_t vectorize = 0;
};

/// Runs `fn` over this executor's clients in chunks and concatenates the results: a clients value.
/// `fn` is batched over clients: it gets each argument's rows for the chunk (leading axis = chunk
/// size) and returns a tensor or tree with one row per client of the chunk. It may take a
/// `const ClientChunk&` first to learn the clients' ids and random streams. A logical shard without
/// clients (a cohort smaller than the shards) is one chunk of size 0: `fn` must then return
/// values with 0 rows and the shape it gives any other chunk. Gradients flow through
/// `fn` (federated AD), including graphs it builds with create_graph.
template <class F, class... T>
auto map_clients(const MapOptions& options, F&& fn, const Clients<T>&... args) {
  const Program& p = Program::current();
  (detail::check_rows("map_clients argument", detail::rows(args.value()), p.local_size()), ...);
  const int64_t k = options.vectorize > 0 ? options.vectorize : p.vectorize();
  using R = std::decay_t<decltype(detail::call_chunk(fn, std::declval<const ClientChunk&>(), args.value()...))>;
  static_assert(is_federated_payload_v<R>, "a map_clients function returns an at::Tensor or a fax::TensorTree");
  std::vector<R> parts;
  for (const ClientChunk& c : detail::chunks(p, k)) {
    check_interrupt();
    parts.push_back(detail::call_chunk(fn, c, detail::rows_slice(args.value(), c.begin, c.size)...));
    detail::check_rows("map_clients result", detail::rows(parts.back()), c.size);
  }
  return Clients<R>(detail::rows_concat(parts));
}

template <class F, class... T>
auto map_clients(F&& fn, const Clients<T>&... args) {
  return map_clients(MapOptions{}, std::forward<F>(fn), args...);
}

namespace detail {
/// Adds `rows`' rows, in order, to `acc` (undefined: starts from the first row), with the same
/// elementwise adds as sum's per-shard reduction; out of place when a gradient must flow. With
/// `weights` ([rows], defined), row i joins times weights[i] in the row's type: the bits of adding
/// the rows of scale_rows(rows, weights), without writing the weighted rows out (through a graph,
/// it is that, derivatives included).
TensorTree add_rows(TensorTree acc, const TensorTree& rows, const at::Tensor& weights = at::Tensor());
/// Adds each leaf of `sums` (no clients axis) to `acc` like one more row.
TensorTree add_sums(TensorTree acc, const TensorTree& sums);
/// The server sum of per-shard partial sums (this executor's shards, in order): the allreduce of
/// sum, differentiable (the gradient of each partial is the server gradient).
TensorTree sum_shard_partials(const std::vector<TensorTree>& partials);
}  // namespace detail

/// What a map_sum_clients function returns for a chunk: rows kept per client (small values:
/// losses, flags) and rows that are only ever summed over the cohort (model updates).
struct ChunkRows {
  TensorTree keep;
  TensorTree sum;
  /// Leaves the function sums over the chunk's clients itself (no clients axis), e.g. with one
  /// matrix product: added to the shard's running sum as they are. The same leaves from every chunk.
  TensorTree summed;
  /// Rows summed times `weights` ([chunk size], one per client): sum(weights * weighted) without
  /// the weighted rows ever written out (a pass over the chunk's rows saved). Leaves not in `sum`.
  TensorTree weighted;
  at::Tensor weights;
};

/// The result of map_sum_clients: the kept rows, a clients value, and the sum over the cohort.
struct MappedSum {
  Clients<TensorTree> keep;
  Server<TensorTree> sum;
};

/// sum(map_clients(fn, ...)) for the `sum` rows, without holding them for every client: each
/// chunk's rows join its logical shard's running sum as soon as they exist, so memory grows with
/// the chunk size (vectorize), not with the cohort. The same bits as the unfused form for any
/// number of executors; differentiable like it (the chunks' graphs are then kept).
template <class F, class... T>
MappedSum map_sum_clients(const MapOptions& options, F&& fn, const Clients<T>&... args) {
  const Program& p = Program::current();
  (detail::check_rows("map_sum_clients argument", detail::rows(args.value()), p.local_size()), ...);
  const int64_t k = options.vectorize > 0 ? options.vectorize : p.vectorize();
  std::vector<TensorTree> keep;
  std::vector<TensorTree> partials;
  int64_t shard = -1;
  for (const ClientChunk& c : detail::chunks(p, k)) {
    check_interrupt();
    ChunkRows out = detail::call_chunk(fn, c, detail::rows_slice(args.value(), c.begin, c.size)...);
    detail::check_rows("map_sum_clients kept rows", out.keep.empty() ? c.size : detail::rows(out.keep), c.size);
    if (!out.sum.empty() || out.weighted.empty()) detail::check_rows("map_sum_clients summed rows", detail::rows(out.sum), c.size);
    if (!out.weighted.empty()) {
      detail::check_rows("map_sum_clients weighted rows", detail::rows(out.weighted), c.size);
      detail::check_rows("map_sum_clients weights", out.weights.defined() ? out.weights.size(0) : -1, c.size);
    }
    if (c.shard != shard) {
      partials.emplace_back();
      shard = c.shard;
    }
    TensorTree acc = detail::add_rows(std::move(partials.back()), out.weighted, out.weights);
    partials.back() = detail::add_sums(detail::add_rows(std::move(acc), out.sum), out.summed);
    keep.push_back(std::move(out.keep));
  }
  return {Clients<TensorTree>(detail::rows_concat(keep)), Server<TensorTree>(detail::sum_shard_partials(partials))};
}

template <class F, class... T>
MappedSum map_sum_clients(F&& fn, const Clients<T>&... args) {
  return map_sum_clients(MapOptions{}, std::forward<F>(fn), args...);
}

/// One client at a time: `fn` gets each argument's row for one client (no clients axis) and
/// returns that client's value. Simple to write; map_clients is the fast path.
template <class F, class... T>
auto map_each_client(F&& fn, const Clients<T>&... args) {
  auto one = [&fn](const ClientChunk& c, const auto&... rows) {
    return detail::rows_unsqueeze(detail::call_chunk(fn, c, detail::rows_select(rows)...));
  };
  return map_clients(MapOptions{1}, one, args...);
}

}  // namespace fax
