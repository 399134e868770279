// Convolutions with the batch innermost (kernels.h): the ATen glue and autograd of batch_inner.h.

#include <cstdint>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <fax/base/error.h>

#include "batch_inner.h"
#include "kernels.h"

namespace fax::kernels {
namespace {

namespace bi = batch_inner;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t lanes(at::ScalarType type) { return type == at::kFloat ? bi::Simd<float>::lanes : bi::Simd<double>::lanes; }

// One client's shape: x [k, c, h, w, n], weights [k, o, c, K, K].
bi::Shape client_shape(at::IntArrayRef x, int64_t out_channels) { return {x[1], x[2], x[3], x[4], out_channels}; }

// Runs f(client, item) for items [0, count) of each of `clients`, on LibTorch's threads. Every
// output element belongs to one item, so the bits do not depend on the thread count.
template <typename F>
void for_items(int64_t clients, int64_t count, const F& f) {
  at::parallel_for(0, clients * count, 1, [&](int64_t first, int64_t end) {
    for (int64_t i = first; i < end; ++i) f(i / count, i % count);
  });
}

// Calls f(T(), std::integral_constant<int, K>()) for t's element type T and the kernel size K
// (the sizes the kernels are built for).
template <typename F>
void dispatch(at::ScalarType t, int64_t size, const F& f) {
  AT_DISPATCH_FLOATING_TYPES(t, "fax::conv2d_batch_inner", [&] {
    if (size == 5) return f(scalar_t(), std::integral_constant<int, 5>());
    TORCH_INTERNAL_ASSERT(size == 3, "batch-inner convolution of size ", size);
    f(scalar_t(), std::integral_constant<int, 3>());
  });
}

// y = x * w + b: [k, o, h - K + 1, w - K + 1, n].
at::Tensor conv_forward(const at::Tensor& x_in, const at::Tensor& w_in, const at::Tensor& b_in) {
  const at::Tensor x = x_in.contiguous(), w = w_in.contiguous(), b = b_in.contiguous();
  const int64_t k = x.size(0), size = w.size(3);
  const bi::Shape s = client_shape(x.sizes(), w.size(1));
  at::Tensor y = at::empty({k, s.o, s.h - size + 1, s.w - size + 1, s.n}, x.options());
  dispatch(x.scalar_type(), size, [&](auto zero, auto kernel) {
    using T = decltype(zero);
    constexpr int K = decltype(kernel)::value;
    const bi::ForwardPlan plan = bi::forward_plan(s, bi::Simd<T>::lanes);
    const T *xp = x.data_ptr<T>(), *wp = w.data_ptr<T>(), *bp = b.data_ptr<T>();
    T* yp = y.data_ptr<T>();
    const int64_t xs = x.stride(0), ws = w.stride(0), ys = y.stride(0);
    for_items(k, plan.count(), [&](int64_t j, int64_t item) {
      bi::forward<T, K>(plan, xp + j * xs, wp + j * ws, bp + j * s.o, yp + j * ys, s, item);
    });
  });
  return y;
}

// dx = the gradient of y = x * w wrt x, for y's gradient g: [k, c, height, width, n].
at::Tensor data_grad(const at::Tensor& g_in, const at::Tensor& w_in, int64_t height, int64_t width) {
  const at::Tensor g = g_in.contiguous(), w = w_in.contiguous();
  const int64_t k = g.size(0), size = w.size(3);
  const bi::Shape s{w.size(2), height, width, g.size(4), w.size(1)};
  at::Tensor dx = at::empty({k, s.c, height, width, s.n}, g.options());
  dispatch(g.scalar_type(), size, [&](auto zero, auto kernel) {
    using T = decltype(zero);
    constexpr int K = decltype(kernel)::value;
    const bi::DataGradPlan plan = bi::data_grad_plan(s, bi::Simd<T>::lanes);
    const T *gp = g.data_ptr<T>(), *wp = w.data_ptr<T>();
    T* dp = dx.data_ptr<T>();
    const int64_t gs = g.stride(0), ws = w.stride(0), ds = dx.stride(0);
    for_items(k, plan.count(), [&](int64_t j, int64_t item) {
      bi::data_grad<T, K>(plan, gp + j * gs, wp + j * ws, dp + j * ds, s, item);
    });
  });
  return dx;
}

// dw = the gradient of y = x * w wrt w, for y's gradient g: [k, o, c, K, K].
at::Tensor weight_grad(const at::Tensor& x_in, const at::Tensor& g_in, int64_t size) {
  const at::Tensor x = x_in.contiguous(), g = g_in.contiguous();
  const int64_t k = x.size(0);
  const bi::Shape s = client_shape(x.sizes(), g.size(1));
  at::Tensor dw = at::empty({k, s.o, s.c, size, size}, x.options());
  dispatch(x.scalar_type(), size, [&](auto zero, auto kernel) {
    using T = decltype(zero);
    constexpr int K = decltype(kernel)::value;
    const bi::WeightGradPlan plan = bi::weight_grad_plan(s);
    const T *xp = x.data_ptr<T>(), *gp = g.data_ptr<T>();
    T* dp = dw.data_ptr<T>();
    const int64_t xs = x.stride(0), gs = g.stride(0), ds = dw.stride(0);
    for_items(k, plan.count(s, K), [&](int64_t j, int64_t item) {
      bi::weight_grad<T, K>(plan, xp + j * xs, gp + j * gs, dp + j * ds, s, item);
    });
  });
  return dw;
}

// db: the sums of g [k, o, ...] over all but its first two axes: [k, o].
at::Tensor bias_grad(const at::Tensor& g_in) {
  const at::Tensor g = g_in.contiguous();
  const int64_t k = g.size(0), o = g.size(1), elements = g.numel() / (k * o);
  at::Tensor db = at::empty({k, o}, g.options());
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "fax::conv2d_batch_inner bias gradient", [&] {
    const scalar_t* gp = g.data_ptr<scalar_t>();
    scalar_t* dp = db.data_ptr<scalar_t>();
    for_items(k, o, [&](int64_t j, int64_t i) { dp[j * o + i] = bi::channel_sum(gp + (j * o + i) * elements, elements); });
  });
  return db;
}

// No bias: zeros, which start the sums as no bias does (autograd functions take no undefined tensors).
at::Tensor no_bias(const at::Tensor& x, const at::Tensor& w) { return at::zeros({w.size(0), w.size(1)}, x.options()); }

// Three linear maps, each one's derivatives made of the others, so that gradients of gradients
// (hypergradients) run on the same kernels: F(x, w) = y, D(g, w) = dx, W(x, g) = dw, with
// <D(g, w), x> = <g, F(x, w)> = <W(x, g), w>.
struct ConvFn : public torch::autograd::Function<ConvFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    ctx->save_for_backward({x, w});
    return conv_forward(x, w, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads);
};

struct BiasGradFn : public torch::autograd::Function<BiasGradFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& g) {
    ctx->saved_data["sizes"] = g.sizes().vec();
    return bias_grad(g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    return {grads[0].reshape({sizes[0], sizes[1], 1, 1, 1}).expand(sizes)};
  }
};

struct WeightGradFn;

struct DataGradFn : public torch::autograd::Function<DataGradFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& g, const at::Tensor& w, int64_t height, int64_t width) {
    ctx->save_for_backward({g, w});
    return data_grad(g, w, height, width);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads);
};

struct WeightGradFn : public torch::autograd::Function<WeightGradFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& g, int64_t size) {
    ctx->save_for_backward({x, g});
    return weight_grad(x, g, size);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &g = saved[1];
    return {ctx->needs_input_grad(0) ? DataGradFn::apply(g, grads[0], x.size(2), x.size(3)) : at::Tensor(),
            ctx->needs_input_grad(1) ? ConvFn::apply(x, grads[0], no_bias(x, grads[0])) : at::Tensor(), at::Tensor()};
  }
};

variable_list DataGradFn::backward(AutogradContext* ctx, variable_list grads) {
  const variable_list saved = ctx->get_saved_variables();
  const at::Tensor &g = saved[0], &w = saved[1];
  return {ctx->needs_input_grad(0) ? ConvFn::apply(grads[0], w, no_bias(grads[0], w)) : at::Tensor(),
          ctx->needs_input_grad(1) ? WeightGradFn::apply(grads[0], g, w.size(3)) : at::Tensor(), at::Tensor(),
          at::Tensor()};
}

variable_list ConvFn::backward(AutogradContext* ctx, variable_list grads) {
  const variable_list saved = ctx->get_saved_variables();
  const at::Tensor &x = saved[0], &w = saved[1];
  return {ctx->needs_input_grad(0) ? DataGradFn::apply(grads[0], w, x.size(2), x.size(3)) : at::Tensor(),
          ctx->needs_input_grad(1) ? WeightGradFn::apply(x, grads[0], w.size(3)) : at::Tensor(),
          ctx->needs_input_grad(2) ? BiasGradFn::apply(grads[0]) : at::Tensor()};
}

}  // namespace

bool batch_inner_takes(const at::Tensor& x, int64_t kernel_size) {
  static const bool simd = bi::available();
  return simd && x.is_cpu() && x.layout() == at::kStrided &&
         (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble) &&
         (kernel_size == 3 || kernel_size == 5);
}

at::Tensor to_batch_inner(const at::Tensor& x, int64_t padding) {
  const int64_t b = x.size(1), step = lanes(x.scalar_type()), n = (b + step - 1) / step * step;
  return at::constant_pad_nd(x.permute({0, 2, 3, 4, 1}), {0, n - b, padding, padding, padding, padding}).contiguous();
}

at::Tensor pad_batch_inner(const at::Tensor& x, int64_t padding) {
  return padding == 0 ? x : at::constant_pad_nd(x, {0, 0, padding, padding, padding, padding});
}

at::Tensor flatten_batch_inner(const at::Tensor& x, int64_t images) {
  return x.narrow(4, 0, images).permute({0, 4, 1, 2, 3}).reshape({x.size(0), images, x.size(1) * x.size(2) * x.size(3)});
}

at::Tensor conv2d_batch_inner(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  // The kernels index raw memory by these sizes: a mismatch is an error here, not a stray read.
  FAX_CHECK(x.dim() == 5 && w.dim() == 5 && x.size(0) > 0 && x.size(0) == w.size(0) && w.size(1) > 0 &&
                x.size(1) == w.size(2) && w.size(3) == w.size(4) && x.size(2) >= w.size(3) && x.size(3) >= w.size(3) &&
                x.size(4) % lanes(x.scalar_type()) == 0 && batch_inner_takes(x, w.size(3)) &&
                w.scalar_type() == x.scalar_type() && w.device() == x.device() && w.layout() == at::kStrided,
            "conv2d_batch_inner: images {} [{}] do not fit weights {} [{}]", x.toString(), fmt::join(x.sizes(), ", "),
            w.toString(), fmt::join(w.sizes(), ", "));
  FAX_CHECK(!bias.defined() || (bias.dim() == 2 && bias.size(0) == w.size(0) && bias.size(1) == w.size(1) &&
                                bias.scalar_type() == x.scalar_type() && bias.device() == x.device() &&
                                bias.layout() == at::kStrided),
            "conv2d_batch_inner: bias [{}] does not fit weights [{}]", fmt::join(bias.sizes(), ", "), fmt::join(w.sizes(), ", "));
  return ConvFn::apply(x, w, bias.defined() ? bias : no_bias(x, w));
}

at::Tensor max_pool2_batch_inner(const at::Tensor& x) {
  const at::Tensor c = x.contiguous();
  const at::Tensor pooled = max_pool2_planes(c.view({x.size(0) * x.size(1), x.size(2), x.size(3), x.size(4)}));
  return pooled.view({x.size(0), x.size(1), pooled.size(1), pooled.size(2), x.size(4)});
}

}  // namespace fax::kernels
