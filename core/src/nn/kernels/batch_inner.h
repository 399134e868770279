#pragma once

// Direct convolutions with the batch innermost (conv_batch_inner.cpp's kernels), one client:
// x [c][h][w][n], weights [o][c][K][K] (PyTorch's order), y [o][h-K+1][w-K+1][n]; stride 1, no
// padding (callers pad while they transpose); n a multiple of Simd<T>::lanes. With the images in
// the vector lanes, every weight is one broadcast and every tap one vector load: no im2col, no
// reorders (experiments/bench/RESULTS.md, "The non-IID benchmark's cell"). Every output element is
// summed by one call in a fixed order: the bits do not depend on how callers split the work over
// threads (by blocks of channels and of images).
//
// On x86 the functions carry __attribute__((target)): fax builds for generic x86-64, so callers
// check available() first. Elsewhere, or where FAX_PORTABLE_SIMD is defined (the tests do, to
// compare the two), Simd is plain C++ one lane at a time: std::fma rounds once, as the fused
// instructions do, so it computes the AVX-512 kernels' bits. There available() is false and
// callers keep LibTorch's path; the portable code is what lets fax build on aarch64. Each variant
// lives in its own inline namespace, so both can sit in one program. Only conv_batch_inner.cpp and
// the tests include this header.

#if (defined(__x86_64__) || defined(__i386__)) && !defined(FAX_PORTABLE_SIMD)
#define FAX_BATCH_INNER_AVX512 1
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <initializer_list>

namespace fax::kernels::batch_inner {
#ifdef FAX_BATCH_INNER_AVX512
inline namespace avx512 {
#else
inline namespace portable {
#endif

// The lanes of a vector summed pairwise in a fixed tree (a reduction intrinsic's order may differ
// between compilers; this one does not).
template <typename T, int N>
T tree_sum(T* l) {
  for (int w = N / 2; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) l[i] += l[i + w];
  return l[0];
}

template <typename T>
struct Simd;

#ifdef FAX_BATCH_INNER_AVX512
#define FAX_SIMD_TARGET __attribute__((target("avx512f,fma")))

inline bool available() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma"); }

template <>
struct Simd<float> {
  using V = __m512;
  static constexpr int lanes = 16;
  FAX_SIMD_TARGET static V load(const float* p) { return _mm512_loadu_ps(p); }
  FAX_SIMD_TARGET static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  FAX_SIMD_TARGET static V splat(float x) { return _mm512_set1_ps(x); }
  FAX_SIMD_TARGET static V zero() { return _mm512_setzero_ps(); }
  FAX_SIMD_TARGET static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  FAX_SIMD_TARGET static V add(V a, V b) { return _mm512_add_ps(a, b); }
  FAX_SIMD_TARGET static float sum(V v) {
    alignas(64) float l[lanes];
    _mm512_store_ps(l, v);
    return tree_sum<float, lanes>(l);
  }
};

template <>
struct Simd<double> {
  using V = __m512d;
  static constexpr int lanes = 8;
  FAX_SIMD_TARGET static V load(const double* p) { return _mm512_loadu_pd(p); }
  FAX_SIMD_TARGET static void store(double* p, V v) { _mm512_storeu_pd(p, v); }
  FAX_SIMD_TARGET static V splat(double x) { return _mm512_set1_pd(x); }
  FAX_SIMD_TARGET static V zero() { return _mm512_setzero_pd(); }
  FAX_SIMD_TARGET static V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  FAX_SIMD_TARGET static V add(V a, V b) { return _mm512_add_pd(a, b); }
  FAX_SIMD_TARGET static double sum(V v) {
    alignas(64) double l[lanes];
    _mm512_store_pd(l, v);
    return tree_sum<double, lanes>(l);
  }
};

#else
#define FAX_SIMD_TARGET

inline bool available() { return false; }

// 64 bytes a vector, as AVX-512's, so both variants block the images alike.
template <typename T>
struct Simd {
  static constexpr int lanes = 64 / sizeof(T);
  struct V {
    T l[lanes];
  };
  static V load(const T* p) {
    V v;
    for (int i = 0; i < lanes; ++i) v.l[i] = p[i];
    return v;
  }
  static void store(T* p, const V& v) {
    for (int i = 0; i < lanes; ++i) p[i] = v.l[i];
  }
  static V splat(T x) {
    V v;
    for (int i = 0; i < lanes; ++i) v.l[i] = x;
    return v;
  }
  static V zero() { return splat(T(0)); }
  static V fma(const V& a, const V& b, V c) {
    for (int i = 0; i < lanes; ++i) c.l[i] = std::fma(a.l[i], b.l[i], c.l[i]);
    return c;
  }
  static V add(V a, const V& b) {
    for (int i = 0; i < lanes; ++i) a.l[i] += b.l[i];
    return a;
  }
  static T sum(V v) { return tree_sum<T, lanes>(v.l); }
};
#endif

struct Shape {
  int64_t c, h, w, n;  // input channels, height, width, images (a multiple of the vector block)
  int64_t o;           // output channels
  int64_t oh(int k) const { return h - k + 1; }
  int64_t ow(int k) const { return w - k + 1; }
};

// y[o0 .. o0+OB)[.][.][n0 .. n0 + NV lanes) = b + sum over c, taps of w x: one register block of
// OB output channels x NV vectors of images, for every output position.
template <typename T, int K, int OB, int NV>
FAX_SIMD_TARGET void forward_block(const T* x, const T* wt, const T* b, T* y, const Shape& s, int64_t o0, int64_t n0) {
  using S = Simd<T>;
  const int64_t oh = s.oh(K), ow = s.ow(K);
  for (int64_t h = 0; h < oh; ++h)
    for (int64_t w = 0; w < ow; ++w) {
      typename S::V acc[OB][NV];
      for (int o = 0; o < OB; ++o)
        for (int v = 0; v < NV; ++v) acc[o][v] = S::splat(b[o0 + o]);
      for (int64_t c = 0; c < s.c; ++c)
        for (int ky = 0; ky < K; ++ky)
          for (int kx = 0; kx < K; ++kx) {
            const T* in = x + ((c * s.h + h + ky) * s.w + w + kx) * s.n + n0;
            typename S::V xv[NV];
            for (int v = 0; v < NV; ++v) xv[v] = S::load(in + v * S::lanes);
            for (int o = 0; o < OB; ++o) {
              const typename S::V wv = S::splat(wt[(((o0 + o) * s.c + c) * K + ky) * K + kx]);
              for (int v = 0; v < NV; ++v) acc[o][v] = S::fma(wv, xv[v], acc[o][v]);
            }
          }
      for (int o = 0; o < OB; ++o)
        for (int v = 0; v < NV; ++v) S::store(y + (((o0 + o) * oh + h) * ow + w) * s.n + n0 + v * S::lanes, acc[o][v]);
    }
}

// dx[c][h][w][n0 ..] = sum over o, taps of w[o][c][ky][kx] g[o][h-ky][w-kx]: CB input channels at
// once, the taps cut to g's edges.
template <typename T, int K, int CB, int NV>
FAX_SIMD_TARGET void data_grad_block(const T* g, const T* wt, T* dx, const Shape& s, int64_t c0, int64_t n0) {
  using S = Simd<T>;
  const int64_t oh = s.oh(K), ow = s.ow(K);
  for (int64_t h = 0; h < s.h; ++h)
    for (int64_t w = 0; w < s.w; ++w) {
      typename S::V acc[CB][NV];
      for (int c = 0; c < CB; ++c)
        for (int v = 0; v < NV; ++v) acc[c][v] = S::zero();
      const int64_t ky0 = h - oh + 1 > 0 ? h - oh + 1 : 0, ky1 = h < K - 1 ? h : K - 1;
      const int64_t kx0 = w - ow + 1 > 0 ? w - ow + 1 : 0, kx1 = w < K - 1 ? w : K - 1;
      for (int64_t o = 0; o < s.o; ++o)
        for (int64_t ky = ky0; ky <= ky1; ++ky)
          for (int64_t kx = kx0; kx <= kx1; ++kx) {
            const T* gp = g + ((o * oh + h - ky) * ow + w - kx) * s.n + n0;
            typename S::V gv[NV];
            for (int v = 0; v < NV; ++v) gv[v] = S::load(gp + v * S::lanes);
            for (int c = 0; c < CB; ++c) {
              const typename S::V wv = S::splat(wt[((o * s.c + c0 + c) * K + ky) * K + kx]);
              for (int v = 0; v < NV; ++v) acc[c][v] = S::fma(wv, gv[v], acc[c][v]);
            }
          }
      for (int c = 0; c < CB; ++c)
        for (int v = 0; v < NV; ++v) S::store(dx + (((c0 + c) * s.h + h) * s.w + w) * s.n + n0 + v * S::lanes, acc[c][v]);
    }
}

// dw[o0 .. o0+OB)[c][ky][.] = sum over positions and all images of g x: per kernel row, OB output
// channels x K taps of vector sums, one image vector after the other, then each lane sum. With
// fewer than 4 output channels a block the loads bound it, so along a row its K inputs slide by
// one: one new load a position (wider blocks lost a little to the register moves). The sums run
// in the same order either way.
template <typename T, int K, int OB>
FAX_SIMD_TARGET void weight_grad_block(const T* x, const T* g, T* dw, const Shape& s, int64_t o0, int64_t c, int ky) {
  using S = Simd<T>;
  const int64_t oh = s.oh(K), ow = s.ow(K);
  typename S::V acc[OB][K];
  for (int o = 0; o < OB; ++o)
    for (int kx = 0; kx < K; ++kx) acc[o][kx] = S::zero();
  for (int64_t n0 = 0; n0 < s.n; n0 += S::lanes)
    for (int64_t h = 0; h < oh && ow > 0; ++h) {  // no output column: no input to prime
      const T* row = x + (c * s.h + h + ky) * s.w * s.n + n0;
      typename S::V xv[K];
      for (int kx = 1; kx < K; ++kx) xv[kx] = S::load(row + (kx - 1) * s.n);
      for (int64_t w = 0; w < ow; ++w) {
        if constexpr (OB < 4) {
          for (int kx = 0; kx + 1 < K; ++kx) xv[kx] = xv[kx + 1];
          xv[K - 1] = S::load(row + (w + K - 1) * s.n);
        } else {
          for (int kx = 0; kx < K; ++kx) xv[kx] = S::load(row + (w + kx) * s.n);
        }
        for (int o = 0; o < OB; ++o) {
          const typename S::V gv = S::load(g + (((o0 + o) * oh + h) * ow + w) * s.n + n0);
          for (int kx = 0; kx < K; ++kx) acc[o][kx] = S::fma(gv, xv[kx], acc[o][kx]);
        }
      }
    }
  for (int o = 0; o < OB; ++o)
    for (int kx = 0; kx < K; ++kx) dw[(((o0 + o) * s.c + c) * K + ky) * K + kx] = S::sum(acc[o][kx]);
}

// The sum of one channel of g over positions and images: one vector sum, then its lanes.
template <typename T>
FAX_SIMD_TARGET T channel_sum(const T* g, int64_t elements) {
  using S = Simd<T>;
  typename S::V acc = S::zero();
  for (int64_t e = 0; e < elements; e += S::lanes) acc = S::add(acc, S::load(g + e));
  return S::sum(acc);
}

// The register blocks a layer runs with, by its channel counts: the largest block that divides
// them (wide blocks keep more accumulators busy per load), else single channels.
inline int divisor_block(int64_t total, std::initializer_list<int> sizes) {
  for (int b : sizes)
    if (total % b == 0) return b;
  return 1;
}

// Work items: callers run items [0, count) in any order and on any threads.
struct ForwardPlan {
  int ob, nv;              // output channels x image vectors a block
  int64_t blocks, groups;  // output channel blocks x groups of nv vectors (the last may be short)
  int64_t count() const { return blocks * groups; }
};
inline ForwardPlan forward_plan(const Shape& s, int lanes) {
  const int ob = divisor_block(s.o, {8, 6, 4});
  const int nv = ob == 8 || ob == 4 ? 2 : 4;
  const int64_t vectors = s.n / lanes;
  return {ob, nv, s.o / ob, (vectors + nv - 1) / nv};
}

template <typename T, int K, int OB, int NV>
void forward_item(const T* x, const T* wt, const T* b, T* y, const Shape& s, int64_t item, int64_t groups) {
  const int64_t o0 = item / groups * OB, v0 = item % groups * NV, vectors = s.n / Simd<T>::lanes;
  if (v0 + NV <= vectors) return forward_block<T, K, OB, NV>(x, wt, b, y, s, o0, v0 * Simd<T>::lanes);
  for (int64_t v = v0; v < vectors; ++v) forward_block<T, K, OB, 1>(x, wt, b, y, s, o0, v * Simd<T>::lanes);
}

template <typename T, int K>
void forward(const ForwardPlan& p, const T* x, const T* wt, const T* b, T* y, const Shape& s, int64_t item) {
  switch (p.ob) {
    case 8: return forward_item<T, K, 8, 2>(x, wt, b, y, s, item, p.groups);
    case 6: return forward_item<T, K, 6, 4>(x, wt, b, y, s, item, p.groups);
    case 4: return forward_item<T, K, 4, 2>(x, wt, b, y, s, item, p.groups);
    default: return forward_item<T, K, 1, 4>(x, wt, b, y, s, item, p.groups);
  }
}

struct DataGradPlan {
  int cb;                  // input channels a block; image vectors a block: 4
  int64_t blocks, groups;  // input channel blocks x groups of 4 vectors (the last may be short)
  int64_t count() const { return blocks * groups; }
};
inline DataGradPlan data_grad_plan(const Shape& s, int lanes) {
  const int cb = divisor_block(s.c, {6, 4});
  return {cb, s.c / cb, (s.n / lanes + 3) / 4};
}

template <typename T, int K, int CB>
void data_grad_item(const T* g, const T* wt, T* dx, const Shape& s, int64_t item, int64_t groups) {
  const int64_t c0 = item / groups * CB, v0 = item % groups * 4, vectors = s.n / Simd<T>::lanes;
  if (v0 + 4 <= vectors) return data_grad_block<T, K, CB, 4>(g, wt, dx, s, c0, v0 * Simd<T>::lanes);
  for (int64_t v = v0; v < vectors; ++v) data_grad_block<T, K, CB, 1>(g, wt, dx, s, c0, v * Simd<T>::lanes);
}

template <typename T, int K>
void data_grad(const DataGradPlan& p, const T* g, const T* wt, T* dx, const Shape& s, int64_t item) {
  switch (p.cb) {
    case 6: return data_grad_item<T, K, 6>(g, wt, dx, s, item, p.groups);
    case 4: return data_grad_item<T, K, 4>(g, wt, dx, s, item, p.groups);
    default: return data_grad_item<T, K, 1>(g, wt, dx, s, item, p.groups);
  }
}

struct WeightGradPlan {
  int ob;          // output channels a block (x the K taps of one kernel row)
  int64_t blocks;  // output channel blocks; items: blocks x input channels x kernel rows
  int64_t count(const Shape& s, int k) const { return blocks * s.c * k; }
};
inline WeightGradPlan weight_grad_plan(const Shape& s) {
  const int ob = divisor_block(s.o, {4, 3});
  return {ob, s.o / ob};
}

template <typename T, int K>
void weight_grad(const WeightGradPlan& p, const T* x, const T* g, T* dw, const Shape& s, int64_t item) {
  const int ky = static_cast<int>(item % K);
  const int64_t c = item / K % s.c, o0 = item / K / s.c * p.ob;
  switch (p.ob) {
    case 4: return weight_grad_block<T, K, 4>(x, g, dw, s, o0, c, ky);
    case 3: return weight_grad_block<T, K, 3>(x, g, dw, s, o0, c, ky);
    default: return weight_grad_block<T, K, 1>(x, g, dw, s, o0, c, ky);
  }
}

}  // inline namespace
}  // namespace fax::kernels::batch_inner
