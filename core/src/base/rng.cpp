#include <fax/base/rng.h>

#include <ATen/CPUGeneratorImpl.h>

namespace fax {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Domain tags keep client and server streams apart even for colliding (round, id) values.
constexpr uint64_t kClientDomain = 0x636c69656e74ULL;  // "client"
constexpr uint64_t kServerDomain = 0x736572766572ULL;  // "server"

uint64_t mix(uint64_t domain, uint64_t seed, int64_t round, int64_t id) {
  uint64_t h = splitmix64(domain ^ splitmix64(seed));
  h = splitmix64(h ^ static_cast<uint64_t>(round));
  return splitmix64(h ^ static_cast<uint64_t>(id));
}

}  // namespace

uint64_t client_stream_seed(uint64_t seed, int64_t round, int64_t client_id) {
  return mix(kClientDomain, seed, round, client_id);
}

uint64_t server_stream_seed(uint64_t seed, int64_t round, uint64_t stream) {
  return mix(kServerDomain, seed, round, static_cast<int64_t>(stream));
}

at::Generator client_generator(uint64_t seed, int64_t round, int64_t client_id) {
  return at::make_generator<at::CPUGeneratorImpl>(client_stream_seed(seed, round, client_id));
}

at::Generator server_generator(uint64_t seed, int64_t round, uint64_t stream) {
  return at::make_generator<at::CPUGeneratorImpl>(server_stream_seed(seed, round, stream));
}

}  // namespace fax
