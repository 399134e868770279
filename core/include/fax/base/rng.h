#pragma once

#include <cstdint>

#include <ATen/core/Generator.h>

namespace fax {

/// The seed of a random stream keyed by (seed, round, client id): a client draws the same numbers
/// whichever executor, shard or thread runs it. Mixed with splitmix64, so nearby keys give
/// unrelated streams.
uint64_t client_stream_seed(uint64_t seed, int64_t round, int64_t client_id);
/// The seed of the server's stream for a round (a domain of its own, distinct from every client).
/// `stream` names independent sub-streams: 0 draws the cohort; an algorithm takes its own (noise).
uint64_t server_stream_seed(uint64_t seed, int64_t round, uint64_t stream = 0);

/// CPU generators for those streams, for ATen's random functions (at::randn(..., generator)).
at::Generator client_generator(uint64_t seed, int64_t round, int64_t client_id);
at::Generator server_generator(uint64_t seed, int64_t round, uint64_t stream = 0);

}  // namespace fax
