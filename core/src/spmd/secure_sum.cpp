#include <fax/spmd/secure_sum.h>

#include <cmath>
#include <set>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <fax/base/error.h>
#include <fax/base/rng.h>

namespace fax {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr uint64_t kMaskStream = 0x6d61736b;  // "mask": the pair masks

// flat [k, P] -> leaves shaped like `like`'s, in flat's dtype.
TensorTree leaves_of(const at::Tensor& flat, const TensorTree& like) {
  return unflatten_rows(flat, like.map([&](const at::Tensor& t) { return at::empty(t.sizes(), flat.options()); }));
}

// The partners of `position` among n: all others, or those within neighbors / 2 (rounded up) on
// either side of a ring. Symmetric, so each pair's mask is added once and subtracted once.
std::set<int64_t> partners(int64_t position, int64_t n, int64_t neighbors) {
  std::set<int64_t> out;
  if (neighbors <= 0 || neighbors >= n - 1) {
    for (int64_t other = 0; other < n; ++other) out.insert(other);
  } else {
    for (int64_t d = 1; d <= (neighbors + 1) / 2; ++d) {
      out.insert((position + d) % n);
      out.insert((position - d + n) % n);
    }
  }
  out.erase(position);
  return out;
}

// The sum of the masks client `position` adds: +m for each partner after it, -m for each before,
// m drawn from the pair's own stream, so the two ends of a pair draw the same vector.
at::Tensor masks_of(const Program& p, int64_t position, int64_t size, int64_t modulus, int64_t neighbors) {
  at::Tensor total = at::zeros({size}, at::kLong);
  for (const int64_t other : partners(position, p.cohort_size(), neighbors)) {
    const int64_t lo = std::min(position, other), hi = std::max(position, other);
    at::Generator g = client_generator(client_stream_seed(p.seed() ^ kMaskStream, p.round(), lo), p.round(), hi);
    const at::Tensor m = at::randint(0, modulus, {size}, g, at::TensorOptions().dtype(at::kLong));
    if (position < other) total.add_(m);
    else total.sub_(m);
  }
  return total;
}

struct SecureSumFn : public torch::autograd::Function<SecureSumFn> {
  static variable_list forward(AutogradContext*, at::TensorList xs, const SecureSum* s, const TensorTree* like) {
    const Program& p = Program::current();
    const TensorTree rows = like->with_tensors(std::vector<at::Tensor>(xs.begin(), xs.end()));
    std::vector<TensorTree> sent;
    for (const ClientChunk& c : detail::chunks(p, 0)) {
      at::Tensor clipped = at::zeros({c.size}, at::kDouble);
      sent.push_back(s->encode(c, narrow(rows, c.begin, c.size), clipped));
    }
    return s->decode(sum(Clients<TensorTree>(cat(sent))).value(), rows).tensors();
  }

  // A sum's adjoint: written with broadcast, so it is differentiable again.
  static variable_list backward(AutogradContext*, variable_list grads) {
    TensorTree g;
    for (size_t i = 0; i < grads.size(); ++i) g.set(std::to_string(i), grads[i]);
    variable_list out = broadcast(Server<TensorTree>(g)).value().tensors();
    out.emplace_back();  // s
    out.emplace_back();  // like
    return out;
  }
};

// The value of the first list with the derivative of the second.
struct WithDerivativeFn : public torch::autograd::Function<WithDerivativeFn> {
  static variable_list forward(AutogradContext*, at::TensorList values, at::TensorList plain) {
    FAX_CHECK(values.size() == plain.size(), "with_sum_derivative: {} values for {} sums", values.size(), plain.size());
    variable_list out;
    for (const auto& v : values) out.push_back(v.clone());
    return out;
  }

  static variable_list backward(AutogradContext*, variable_list grads) {
    variable_list out(grads.size());  // values: none
    out.insert(out.end(), grads.begin(), grads.end());
    return out;
  }
};

}  // namespace

SecureSum::SecureSum(SecureSumOptions o) : o_(o) {
  FAX_CHECK(o.bits >= 2 && o.bits <= 32, "secure_sum: bits must be in [2, 32] (sums of int64 must not overflow), got {}",
            o.bits);
  FAX_CHECK(std::isfinite(o.range) && o.range > 0, "secure_sum: range must be positive and finite, got {}", o.range);
  FAX_CHECK(o.neighbors >= 0, "secure_sum: neighbors must be at least 0, got {}", o.neighbors);
  step_ = 2 * o.range / std::ldexp(1.0, static_cast<int>(o.bits));
}

TensorTree SecureSum::encode(const ClientChunk& chunk, const TensorTree& rows, at::Tensor& clipped, bool reduce) const {
  const int64_t modulus = int64_t{1} << o_.bits, half = modulus / 2;
  const at::Tensor scaled = (flatten_rows(rows, at::kDouble) / step_).round();
  // A NaN has no integer to become (its conversion is undefined behaviour); an infinity would be
  // clipped silently.
  const at::Tensor finite = at::isfinite(scaled).all(1);
  if (!finite.all().item<bool>()) {
    const int64_t i = at::logical_not(finite).nonzero()[0][0].item<int64_t>();
    throw Error(fmt::format("secure_sum: round {}, client {} (cohort position {}) sends a non-finite value",
                            chunk.program.round() + 1, chunk.client_id(i), chunk.position(i)));
  }
  const at::Tensor outside = scaled.lt(static_cast<double>(-half)).logical_or(scaled.gt(static_cast<double>(half - 1)));
  if (scaled.size(1) > 0) clipped.add_(outside.to(at::kDouble).mean(1));
  at::Tensor q = scaled.clamp(static_cast<double>(-half), static_cast<double>(half - 1)).to(at::kLong);
  if (o_.masks && chunk.size > 0) {
    std::vector<at::Tensor> masks;
    for (int64_t i = 0; i < chunk.size; ++i)
      masks.push_back(masks_of(chunk.program, chunk.position(i), q.size(1), modulus, o_.neighbors));
    q = q + at::stack(masks);
  }
  return leaves_of(reduce ? q.bitwise_and(modulus - 1) : q, rows);
}

TensorTree SecureSum::decode(const TensorTree& sum, const TensorTree& like) const {
  const int64_t modulus = int64_t{1} << o_.bits, half = modulus / 2;
  TensorTree out;
  for (const auto& [name, s] : sum) {
    const at::Tensor r = s.bitwise_and(modulus - 1);
    const at::Tensor v = r - r.ge(half).to(at::kLong) * modulus;
    out.set(name, (v.to(at::kDouble) * step_).to(like.at(name).scalar_type()));
  }
  return out;
}

TensorTree SecureSum::wrap(const TensorTree& values) const {
  const int64_t modulus = int64_t{1} << o_.bits;
  return decode(values.map([&](const at::Tensor& t) {
    return (t.to(at::kDouble) / step_).round().to(at::kLong).bitwise_and(modulus - 1);
  }), values);
}

int64_t SecureSum::overflows(const TensorTree& signed_sum) const {
  const int64_t half = int64_t{1} << (o_.bits - 1);
  int64_t count = 0;
  for (const auto& [name, s] : signed_sum) count += s.lt(-half).logical_or(s.gt(half - 1)).sum().item<int64_t>();
  return count;
}

Server<TensorTree> secure_sum(const Clients<TensorTree>& x, const SecureSum& s) {
  const TensorTree& rows = x.value();
  const std::vector<at::Tensor> leaves = rows.tensors();
  // As a TensorList: a custom Function sees the inputs of that type only.
  return Server<TensorTree>(rows.with_tensors(SecureSumFn::apply(at::TensorList(leaves), &s, &rows)));
}

TensorTree with_sum_derivative(const TensorTree& value, const TensorTree& plain) {
  std::vector<at::Tensor> sums;
  for (const auto& [name, t] : value) sums.push_back(plain.at(name));
  const std::vector<at::Tensor> values = value.tensors();
  return value.with_tensors(WithDerivativeFn::apply(at::TensorList(values), at::TensorList(sums)));
}

}  // namespace fax
