// The FAX tutorial as an out-of-tree program: broadcast 2.0 to 3 clients and sum them over a mesh
// of 3 executors. Exits non-zero unless the value is 6 and its derivative 3.
#include <cstdio>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <fax/fax.h>

int main() {
  fax::Mesh mesh({3, 3});
  const at::Tensor out = mesh.run(fax::Cohort::range(3), [](fax::Program&) {
    const at::Tensor x = at::scalar_tensor(2.0, at::kDouble).requires_grad_(true);
    const at::Tensor total = fax::sum(fax::broadcast(fax::Server<at::Tensor>(x))).value();
    const at::Tensor derivative = torch::autograd::grad({total}, {x})[0];
    return fax::Server<at::Tensor>(at::stack({total, derivative}));
  }).value();
  const double total = out[0].item<double>();
  const double derivative = out[1].item<double>();
  std::printf("fax %s: sum(broadcast(2.0)) over 3 clients = %g, derivative %g\n", fax::version(), total, derivative);
  return total == 6.0 && derivative == 3.0 ? 0 : 1;
}
