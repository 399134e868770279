#include <fax/datasets/readers.h>

#include <ATen/ATen.h>

#include <fax/base/error.h>
#include <fax/base/rng.h>
#include <fax/datasets/in_memory.h>

namespace fax {
namespace {
constexpr int64_t kTokensRound = -3000;  // a stream domain of its own
}

std::unique_ptr<FederatedDataset> make_synthetic_tokens(const SyntheticTokensOptions& o) {
  FAX_CHECK(o.clients > 0 && o.sequences > 1 && o.sequence_length > 0 && o.vocab > 1,
            "synthetic_tokens needs clients > 0, sequences > 1, sequence_length > 0 and vocab > 1");
  // A shared transition table with peaked rows; each client perturbs its logits.
  const at::Tensor shared = at::randn({o.vocab, o.vocab}, server_generator(o.seed, kTokensRound)) * 3.0;
  std::vector<Examples> clients;
  std::vector<at::Tensor> test_x, test_y;
  const int64_t held = std::max<int64_t>(1, static_cast<int64_t>(o.test_fraction * static_cast<double>(o.sequences)));
  for (int64_t c = 0; c < o.clients; ++c) {
    at::Generator g = client_generator(o.seed, kTokensRound, c);
    const at::Tensor transitions = at::softmax(shared + at::randn({o.vocab, o.vocab}, g), 1);
    at::Tensor tokens = at::empty({o.sequences, o.sequence_length + 1}, at::kLong);
    at::Tensor current = at::randint(0, o.vocab, {o.sequences}, g, at::kLong);
    tokens.select(1, 0).copy_(current);
    for (int64_t t = 1; t <= o.sequence_length; ++t) {
      current = at::multinomial(transitions.index_select(0, current), 1, true, g).squeeze(1);
      tokens.select(1, t).copy_(current);
    }
    const at::Tensor x = tokens.narrow(1, 0, o.sequence_length), y = tokens.narrow(1, 1, o.sequence_length);
    const int64_t train = o.sequences - held;
    clients.push_back({x.narrow(0, 0, train).contiguous(), y.narrow(0, 0, train).contiguous()});
    test_x.push_back(x.narrow(0, train, held));
    test_y.push_back(y.narrow(0, train, held));
  }
  return std::make_unique<InMemoryDataset>(
      std::move(clients), Examples{at::cat(test_x), at::cat(test_y)}, o.vocab,
      fmt::format("synthetic_tokens({} clients x {} sequences of {} tokens, vocabulary {})", o.clients, o.sequences,
                  o.sequence_length, o.vocab));
}

}  // namespace fax
