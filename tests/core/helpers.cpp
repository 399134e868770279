#include "helpers.h"

#include <cstring>

#include <torch/csrc/autograd/autograd.h>

namespace fax::test {
namespace {

at::Tensor place(const Program& p, Place where, const at::Tensor& global) {
  return where == Place::clients ? p.local_rows(global).value() : global;
}

// The global value of a placed output: clients rows are gathered from every executor.
at::Tensor globalize(Place where, const at::Tensor& placed) {
  return where == Place::clients ? collect(Clients<at::Tensor>(placed)).value() : placed;
}

at::Tensor output_cotangent(Mesh& mesh, const Cohort& cohort, PlacedSignature sig, const PlacedFn& fn,
                            const at::Tensor& x) {
  const at::Tensor y = mesh.run(cohort, [&](Program& p) {
    return Server<at::Tensor>(globalize(sig.out, fn(p, place(p, sig.in, x))));
  }).value();
  return at::randn(y.sizes(), y.options());
}

}  // namespace

at::Tensor federated_vjp(Mesh& mesh, const Cohort& cohort, PlacedSignature sig, const PlacedFn& fn,
                         const at::Tensor& x, const at::Tensor& v) {
  return mesh.run(cohort, [&](Program& p) {
    const at::Tensor input = place(p, sig.in, x).detach().clone().requires_grad_(true);
    const at::Tensor y = fn(p, input);
    const at::Tensor g = torch::autograd::grad({y}, {input}, {place(p, sig.out, v)})[0];
    return Server<at::Tensor>(globalize(sig.in, g));
  }).value();
}

at::Tensor finite_difference_vjp(Mesh& mesh, const Cohort& cohort, PlacedSignature sig, const PlacedFn& fn,
                                 const at::Tensor& x, const at::Tensor& v, double eps) {
  auto objective = [&](const at::Tensor& at_x) {
    return mesh.run(cohort, [&](Program& p) {
      return Server<at::Tensor>((globalize(sig.out, fn(p, place(p, sig.in, at_x))) * v).sum());
    }).value().item<double>();
  };
  at::Tensor grad = at::zeros_like(x);
  at::Tensor flat_x = x.detach().clone().contiguous();
  auto xs = flat_x.view({-1});
  auto gs = grad.view({-1});
  for (int64_t i = 0; i < xs.numel(); ++i) {
    const double original = xs[i].item<double>();
    xs[i] = original + eps;
    const double plus = objective(flat_x);
    xs[i] = original - eps;
    const double minus = objective(flat_x);
    xs[i] = original;
    gs[i] = (plus - minus) / (2 * eps);
  }
  return grad;
}

void expect_vjp_matches_finite_differences(Mesh& mesh, const Cohort& cohort, PlacedSignature sig,
                                           const PlacedFn& fn, const at::Tensor& x, double atol, double rtol) {
  ASSERT_EQ(x.scalar_type(), at::kDouble) << "finite differences need float64";
  const at::Tensor v = output_cotangent(mesh, cohort, sig, fn, x);
  const at::Tensor analytic = federated_vjp(mesh, cohort, sig, fn, x, v);
  const at::Tensor numeric = finite_difference_vjp(mesh, cohort, sig, fn, x, v);
  ASSERT_EQ(analytic.sizes(), numeric.sizes());
  const double err = (analytic - numeric).abs().max().item<double>();
  const double scale = numeric.abs().max().item<double>();
  EXPECT_LE(err, atol + rtol * scale) << "federated AD:\n" << analytic << "\nfinite differences:\n" << numeric;
  EXPECT_GT(scale, 0.0) << "a zero gradient checks nothing";
}

void expect_gradient_matches_finite_differences(Mesh& mesh, const Cohort& cohort, const PlacedFn& loss,
                                                const at::Tensor& x, double atol, double rtol) {
  expect_vjp_matches_finite_differences(mesh, cohort, {Place::server, Place::server}, loss, x, atol, rtol);
}

std::vector<uint8_t> bytes_of(const at::Tensor& t) {
  const at::Tensor c = t.detach().contiguous();
  std::vector<uint8_t> out(c.numel() * c.element_size());
  if (!out.empty()) std::memcpy(out.data(), c.data_ptr(), out.size());  // an empty tensor may have no data
  return out;
}

}  // namespace fax::test
