// 2x2 max pooling (kernels.h).

#include <cstdint>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels.h"

namespace fax::kernels {
namespace {

// 2x2 max pooling. LibTorch 1.13's NCHW max_pool2d kernel on the CPU is scalar and general
// (dilation, padding), and a large part of a CNN round (experiments/bench/RESULTS.md). This one
// pools the planes of a contiguous tensor and keeps, per output, which corner won (0..3,
// row-major) for the backward pass. Planes may hold `inner` elements per position (the batch-inner
// layout of conv_batch_inner.cpp), each pooled on its own. It picks the corner max_pool2d picks:
// the first maximum in row-major order, or the last NaN; so values, gradients and double
// gradients carry the same bits as max_pool2d's.
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Planes {
  int64_t count, h, w, inner;  // input planes [count, h, w, inner]; outputs [count, h / 2, w / 2, inner]
  bool inner_axis;             // whether the tensors have the inner axis (else inner is 1)
  int64_t out_size() const { return (h / 2) * (w / 2) * inner; }
  std::vector<int64_t> input_sizes() const { return sizes(h, w); }
  std::vector<int64_t> output_sizes() const { return sizes(h / 2, w / 2); }

 private:
  std::vector<int64_t> sizes(int64_t height, int64_t width) const {
    std::vector<int64_t> s{count, height, width};
    if (inner_axis) s.push_back(inner);
    return s;
  }
};

// Calls f(inner): a compile-time 1 for plain planes, so that their loops stay as simple as before.
template <typename F>
void with_inner(const Planes& p, const F& f) {
  if (p.inner == 1) return f(std::integral_constant<int64_t, 1>());
  f(p.inner);
}

// fax builds for generic x86-64, where the loops below vectorise to 4 floats; compiled again for
// AVX-512 they take 16 (the pooling was 10% of a LeNet step on 4). They compare and select, never
// round, so both copies give the same bits. Only for planes with an inner axis, whose loops run
// over contiguous elements: plain planes pair neighbours, and their AVX-512 copy ran slower
// (McMahan's cnn spent twice as long pooling).
#if defined(__x86_64__) || defined(__i386__)
#define FAX_POOL_WIDE __attribute__((target("avx512f,avx512bw"), flatten))
bool wide_available() {
  static const bool available = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return available;
}
#else
#define FAX_POOL_WIDE
bool wide_available() { return false; }
#endif

// f() with everything it calls inlined into an AVX-512 function (flatten).
template <typename F>
FAX_POOL_WIDE void call_wide(const F& f) {
  f();
}

// Runs f(first, end) over ranges of planes on LibTorch's intra-op threads, on AVX-512 where the CPU
// has it and the planes have an inner axis.
template <typename F>
void for_planes(const Planes& p, F f) {
  const bool wide = p.inner > 1 && wide_available();
  at::parallel_for(0, p.count, std::max<int64_t>(1, 32768 / (p.h * p.w * p.inner)), [&](int64_t first, int64_t end) {
    const auto range = [&] { f(first, end); };
    if (wide) return call_wide(range);
    range();
  });
}

// Whether `candidate` (at corner `later`) replaces `best` (at corner `earlier`) under max_pool2d's
// choice: a NaN beats numbers and earlier NaNs; among numbers the larger wins, the earlier on ties.
// Bitwise operators, not && and ||: without branches the compiler vectorises the loops below.
template <typename T>
bool replaces(T candidate, T best, T later, T earlier) {
  return (candidate > best) | ((candidate == best) & (later < earlier)) |
         ((candidate != candidate) & ((best == best) | (later > earlier)));
}

template <typename T>
void pool_planes(const T* x, T* out, uint8_t* corners, const Planes& p, int64_t first, int64_t end) {
  const int64_t h2 = p.h / 2, w2 = p.w / 2, n = p.out_size(), row = p.w;
  // Plain planes (inner 1). Per plane: the maxima of each column's two rows (contiguous), then of
  // each pair of columns, then the corners as bytes; three loops the compiler vectorises. Corners
  // are kept as T until the last loop so that every loop works on one element width.
  std::vector<T> column_max(2 * n), column_corner(2 * n), corner(n);
  for (int64_t plane = first; plane < end; ++plane) {
    for (int64_t i = 0; i < h2; ++i) {
      const T* top = x + plane * p.h * row + 2 * i * row;
      const T* bottom = top + row;
      T* m = column_max.data() + i * 2 * w2;
      T* c = column_corner.data() + i * 2 * w2;
      for (int64_t j = 0; j < 2 * w2; ++j) {
        const bool lower = replaces<T>(bottom[j], top[j], 2, 0);
        m[j] = lower ? bottom[j] : top[j];
        c[j] = lower ? 2 : 0;
      }
    }
    T* o = out + plane * n;
    for (int64_t j = 0; j < n; ++j) {
      const T left = column_max[2 * j], right = column_max[2 * j + 1];
      const T left_corner = column_corner[2 * j], right_corner = column_corner[2 * j + 1] + 1;
      const bool take_right = replaces(right, left, right_corner, left_corner);
      o[j] = take_right ? right : left;
      corner[j] = take_right ? right_corner : left_corner;
    }
    uint8_t* co = corners + plane * n;
    for (int64_t j = 0; j < n; ++j) co[j] = static_cast<uint8_t>(corner[j]);
  }
}

// One row of windows with `inner` elements a position: the corners in row-major order, each
// replacing the best so far under replaces(), so the winner is max_pool2d's. One pass; corners as
// T, so that the loop works on one element width.
template <typename T>
void pool_inner_row(const T* __restrict top, const T* __restrict bottom, T* __restrict out, T* __restrict corner,
                    int64_t w2, int64_t inner) {
  for (int64_t j = 0; j < w2; ++j)
    for (int64_t l = 0; l < inner; ++l) {
      const int64_t left = 2 * j * inner + l, right = left + inner;
      T best = top[left], at = 0;
      const T rest[3] = {top[right], bottom[left], bottom[right]};
      for (int c = 0; c < 3; ++c) {
        const bool take = replaces(rest[c], best, T(c + 1), at);
        best = take ? rest[c] : best;
        at = take ? T(c + 1) : at;
      }
      out[j * inner + l] = best;
      corner[j * inner + l] = at;
    }
}

template <typename T>
void pool_inner_planes(const T* x, T* out, uint8_t* corners, const Planes& p, int64_t first, int64_t end) {
  const int64_t w2 = p.w / 2, row = p.w * p.inner, out_row = w2 * p.inner;
  std::vector<T> corner(out_row);
  for (int64_t plane = first; plane < end; ++plane)
    for (int64_t i = 0; i < p.h / 2; ++i) {
      const T* top = x + plane * p.h * row + 2 * i * row;
      const int64_t at = plane * p.out_size() + i * out_row;
      pool_inner_row(top, top + row, out + at, corner.data(), w2, p.inner);
      for (int64_t j = 0; j < out_row; ++j) corners[at + j] = static_cast<uint8_t>(corner[j]);
    }
}

// Calls f(window_row(plane, i)) for every row i of windows of every plane, on LibTorch's threads.
// A WindowRow points at the window's two input rows, at its outputs and at its corners, given as
// T so that the loops over a row work on one element width and vectorise.
template <typename T>
struct WindowRow {
  T* up;
  T* down;
  T* out;
  const T* corner;
};

template <typename T, typename F>
void for_window_rows(const Planes& p, T* x, T* out, const uint8_t* corners, F f) {
  const int64_t n = p.out_size(), row = p.w * p.inner, out_row = p.w / 2 * p.inner;
  for_planes(p, [&](int64_t first, int64_t end) {
    std::vector<T> corner(n);
    for (int64_t plane = first; plane < end; ++plane) {
      for (int64_t j = 0; j < n; ++j) corner[j] = corners[plane * n + j];
      for (int64_t i = 0; i < p.h / 2; ++i) {
        T* up = x + plane * p.h * row + 2 * i * row;
        f(WindowRow<T>{up, up + row, out + plane * n + i * out_row, corner.data() + i * out_row});
      }
    }
  });
}

// One row of windows each way. __restrict: the rows, outputs and corners never overlap, and
// without knowing so the compiler leaves the loops scalar.
template <typename T, typename Inner>
void scatter_row(T* __restrict up, T* __restrict down, const T* __restrict out, const T* __restrict corner, int64_t w2,
                 Inner inner) {
  for (int64_t j = 0; j < w2; ++j)
    for (int64_t l = 0; l < inner; ++l) {
      const int64_t left = 2 * j * inner + l, right = left + inner;
      const T v = out[j * inner + l] + T(0), c = corner[j * inner + l], zero = 0;
      up[left] = c == 0 ? v : zero;
      up[right] = c == 1 ? v : zero;
      down[left] = c == 2 ? v : zero;
      down[right] = c == 3 ? v : zero;
    }
}

template <typename T, typename Inner>
void gather_row(const T* __restrict up, const T* __restrict down, T* __restrict out, const T* __restrict corner, int64_t w2,
                Inner inner) {
  for (int64_t j = 0; j < w2; ++j)
    for (int64_t l = 0; l < inner; ++l) {
      const int64_t left = 2 * j * inner + l, right = left + inner;
      const T c = corner[j * inner + l];
      out[j * inner + l] = c == 0 ? up[left] : c == 1 ? up[right] : c == 2 ? down[left] : down[right];
    }
}

// grad_x = P^T grad_out: each output's gradient to its corner, zero elsewhere. `+ 0` as in
// max_pool2d's backward (it adds into zeros), which turns -0 into +0.
at::Tensor scatter_to_corners(const at::Tensor& grad_out, const at::Tensor& corners, const Planes& p) {
  at::Tensor g = grad_out.contiguous();
  // An odd last row or column belongs to no window; every other element is written below.
  const bool uncovered = p.h % 2 != 0 || p.w % 2 != 0;
  at::Tensor grad_x = uncovered ? at::zeros(p.input_sizes(), g.options()) : at::empty(p.input_sizes(), g.options());
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "fax::max_pool2 backward", [&] {
    const int64_t w2 = p.w / 2;
    with_inner(p, [&](auto inner) {
      for_window_rows<scalar_t>(p, grad_x.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(), corners.data_ptr<uint8_t>(),
                                [w2, inner](WindowRow<scalar_t> r) {
                                  scatter_row(r.up, r.down, r.out, r.corner, w2, inner);
                                });
    });
  });
  return grad_x;
}

// grad_out = P grad_x: each output reads its corner.
at::Tensor gather_from_corners(const at::Tensor& grad_x, const at::Tensor& corners, const Planes& p) {
  at::Tensor g = grad_x.contiguous();
  at::Tensor grad_out = at::empty(p.output_sizes(), g.options());
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "fax::max_pool2 double backward", [&] {
    const int64_t w2 = p.w / 2;
    with_inner(p, [&](auto inner) {
      for_window_rows<scalar_t>(p, g.data_ptr<scalar_t>(), grad_out.data_ptr<scalar_t>(), corners.data_ptr<uint8_t>(),
                                [w2, inner](WindowRow<scalar_t> r) {
                                  gather_row(r.up, r.down, r.out, r.corner, w2, inner);
                                });
    });
  });
  return grad_out;
}

void save_corners(AutogradContext* ctx, const at::Tensor& corners, const Planes& p) {
  ctx->saved_data["corners"] = corners;
  ctx->saved_data["count"] = p.count;
  ctx->saved_data["h"] = p.h;
  ctx->saved_data["w"] = p.w;
  ctx->saved_data["inner"] = p.inner;
  ctx->saved_data["inner_axis"] = p.inner_axis;
}

// What save_corners kept.
struct SavedCorners {
  at::Tensor corners;
  Planes planes;
};

SavedCorners saved_corners(AutogradContext* ctx) {
  return {ctx->saved_data["corners"].toTensor(),
          {ctx->saved_data["count"].toInt(), ctx->saved_data["h"].toInt(), ctx->saved_data["w"].toInt(),
           ctx->saved_data["inner"].toInt(), ctx->saved_data["inner_axis"].toBool()}};
}

// The pooling's backward as a function of its own, linear in grad_out: its backward is the gather.
struct ScatterFn : public torch::autograd::Function<ScatterFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad_out, const at::Tensor& corners, Planes p) {
    save_corners(ctx, corners, p);
    return scatter_to_corners(grad_out, corners, p);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads);
};

struct GatherFn : public torch::autograd::Function<GatherFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad_x, const at::Tensor& corners, Planes p) {
    save_corners(ctx, corners, p);
    return gather_from_corners(grad_x, corners, p);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const SavedCorners saved = saved_corners(ctx);
    return {ScatterFn::apply(grads[0], saved.corners, saved.planes), at::Tensor(), at::Tensor()};
  }
};

variable_list ScatterFn::backward(AutogradContext* ctx, variable_list grads) {
  const SavedCorners saved = saved_corners(ctx);
  return {GatherFn::apply(grads[0], saved.corners, saved.planes), at::Tensor(), at::Tensor()};
}

// x: [planes, h, w] or [planes, h, w, inner], contiguous.
struct MaxPool2Fn : public torch::autograd::Function<MaxPool2Fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    const bool inner_axis = x.dim() == 4;
    const Planes p{x.size(0), x.size(1), x.size(2), inner_axis ? x.size(3) : 1, inner_axis};
    at::Tensor out = at::empty(p.output_sizes(), x.options());
    at::Tensor corners = at::empty(p.output_sizes(), x.options().dtype(at::kByte));
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "fax::max_pool2", [&] {
      const scalar_t* xp = x.data_ptr<scalar_t>();
      scalar_t* op = out.data_ptr<scalar_t>();
      uint8_t* cp = corners.data_ptr<uint8_t>();
      for_planes(p, [&](int64_t first, int64_t end) {
        if (p.inner == 1) return pool_planes(xp, op, cp, p, first, end);
        pool_inner_planes(xp, op, cp, p, first, end);
      });
    });
    save_corners(ctx, corners, p);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const SavedCorners saved = saved_corners(ctx);
    return {ScatterFn::apply(grads[0], saved.corners, saved.planes)};
  }
};

}  // namespace

at::Tensor max_pool2_planes(const at::Tensor& x) { return MaxPool2Fn::apply(x); }

}  // namespace fax::kernels
