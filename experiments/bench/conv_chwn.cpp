// Probe for the non-IID cell's convolutions (RESULTS.md, "The non-IID benchmark's cell"): direct 5x5
// convolutions with the batch innermost ([channels][height][width][64 images]), so that every
// vector holds 16 images and no pass needs a layout change; forward, backward data and backward
// weights at LeNet's two shapes, one thread, AVX-512, checked at random points against a scalar
// sum. Best of 7 timings of 20 calls.
//   g++ -O3 -march=native -std=c++17 -o /tmp/conv_chwn experiments/bench/conv_chwn.cpp && /tmp/conv_chwn
#include <immintrin.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int N = 64, K = 5;
using Clock = std::chrono::steady_clock;

// y[o][h][w][n] = b[o] + sum_i,ky,kx w[o][i][ky][kx] x[i][h+ky][w+kx][n]; OB output channels x NV
// vectors of 16 images in registers.
template <int I, int O, int H, int W, int OB, int NV>
void forward(const float* x, const float* wt, const float* b, float* y) {
  constexpr int OH = H - K + 1, OW = W - K + 1;
  for (int n0 = 0; n0 < N; n0 += 16 * NV)
  for (int o0 = 0; o0 < O; o0 += OB)
    for (int h = 0; h < OH; ++h)
      for (int w = 0; w < OW; ++w) {
        __m512 acc[OB][NV];
        for (int o = 0; o < OB; ++o)
          for (int v = 0; v < NV; ++v) acc[o][v] = _mm512_set1_ps(b[o0 + o]);
        for (int i = 0; i < I; ++i)
          for (int ky = 0; ky < K; ++ky)
            for (int kx = 0; kx < K; ++kx) {
              const float* in = x + ((i * H + h + ky) * W + w + kx) * N + n0;
              __m512 xv[NV];
              for (int v = 0; v < NV; ++v) xv[v] = _mm512_loadu_ps(in + 16 * v);
              for (int o = 0; o < OB; ++o) {
                const __m512 wv = _mm512_set1_ps(wt[(((o0 + o) * I + i) * K + ky) * K + kx]);
                for (int v = 0; v < NV; ++v) acc[o][v] = _mm512_fmadd_ps(wv, xv[v], acc[o][v]);
              }
            }
        for (int o = 0; o < OB; ++o)
          for (int v = 0; v < NV; ++v) _mm512_storeu_ps(y + (((o0 + o) * OH + h) * OW + w) * N + n0 + 16 * v, acc[o][v]);
      }
}

// dw[o][i][ky][kx] = sum_h,w,n dy[o][h][w][n] x[i][h+ky][w+kx][n]: per input channel and kernel
// row, vector sums for OB output channels x 5 taps, which share each x and dy load.
template <int I, int O, int H, int W>
void backward_weights(const float* x, const float* dy, float* dw) {
  constexpr int OH = H - K + 1, OW = W - K + 1, OB = O % 4 == 0 ? 4 : (O % 3 == 0 ? 3 : 1);
  for (int o0 = 0; o0 < O; o0 += OB)
    for (int i = 0; i < I; ++i)
      for (int ky = 0; ky < K; ++ky) {
        __m512 acc[OB][K];
        for (int o = 0; o < OB; ++o)
          for (int kx = 0; kx < K; ++kx) acc[o][kx] = _mm512_setzero_ps();
        for (int v = 0; v < 4; ++v)
          for (int h = 0; h < OH; ++h)
            for (int w = 0; w < OW; ++w) {
              __m512 xv[K];
              for (int kx = 0; kx < K; ++kx) xv[kx] = _mm512_loadu_ps(x + ((i * H + h + ky) * W + w + kx) * N + 16 * v);
              for (int o = 0; o < OB; ++o) {
                const __m512 g = _mm512_loadu_ps(dy + (((o0 + o) * OH + h) * OW + w) * N + 16 * v);
                for (int kx = 0; kx < K; ++kx) acc[o][kx] = _mm512_fmadd_ps(g, xv[kx], acc[o][kx]);
              }
            }
        for (int o = 0; o < OB; ++o)
          for (int kx = 0; kx < K; ++kx) dw[(((o0 + o) * I + i) * K + ky) * K + kx] += _mm512_reduce_add_ps(acc[o][kx]);
      }
}

// dx[i][h][w][n] = sum_o,ky,kx w[o][i][ky][kx] dy[o][h-ky][w-kx][n] (zero outside dy): every input
// channel at once, the taps' range cut to dy's edges.
template <int I, int O, int H, int W>
void backward_data(const float* dy, const float* wt, float* dx) {
  constexpr int OH = H - K + 1, OW = W - K + 1, NV = 24 / I > 4 ? 4 : 24 / I;
  for (int n0 = 0; n0 < N; n0 += 16 * NV)
    for (int h = 0; h < H; ++h)
      for (int w = 0; w < W; ++w) {
        __m512 acc[I][NV];
        for (int i = 0; i < I; ++i)
          for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
        const int ky0 = h - OH + 1 > 0 ? h - OH + 1 : 0, ky1 = h < K - 1 ? h : K - 1;
        const int kx0 = w - OW + 1 > 0 ? w - OW + 1 : 0, kx1 = w < K - 1 ? w : K - 1;
        for (int o = 0; o < O; ++o)
          for (int ky = ky0; ky <= ky1; ++ky)
            for (int kx = kx0; kx <= kx1; ++kx) {
              const float* g = dy + ((o * OH + h - ky) * OW + w - kx) * N + n0;
              __m512 gv[NV];
              for (int v = 0; v < NV; ++v) gv[v] = _mm512_loadu_ps(g + 16 * v);
              for (int i = 0; i < I; ++i) {
                const __m512 wv = _mm512_set1_ps(wt[((o * I + i) * K + ky) * K + kx]);
                for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(wv, gv[v], acc[i][v]);
              }
            }
        for (int i = 0; i < I; ++i)
          for (int v = 0; v < NV; ++v) _mm512_storeu_ps(dx + ((i * H + h) * W + w) * N + n0 + 16 * v, acc[i][v]);
      }
}

template <class F>
double best_ms(F&& f) {
  double best = 1e9;
  for (int r = 0; r < 7; ++r) {
    const auto t = Clock::now();
    for (int k = 0; k < 20; ++k) f();
    best = std::min(best, std::chrono::duration<double, std::milli>(Clock::now() - t).count() / 20);
  }
  return best;
}

std::vector<float> rnd(size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(std::rand()) / RAND_MAX - 0.5f;
  return v;
}

template <int I, int O, int H, int W, int OB, int NV>
void probe(const char* name) {
  constexpr int OH = H - K + 1, OW = W - K + 1;
  auto x = rnd(I * H * W * N), wt = rnd(O * I * K * K), b = rnd(O), dy = rnd(O * OH * OW * N);
  std::vector<float> y(O * OH * OW * N), dx(I * H * W * N), dw(O * I * K * K);
  // Random points of each pass against a scalar sum in double.
  forward<I, O, H, W, OB, NV>(x.data(), wt.data(), b.data(), y.data());
  backward_data<I, O, H, W>(dy.data(), wt.data(), dx.data());
  std::fill(dw.begin(), dw.end(), 0.f);
  backward_weights<I, O, H, W>(x.data(), dy.data(), dw.data());
  double err = 0;
  for (int t = 0; t < 50; ++t) {
    const int o = std::rand() % O, h = std::rand() % OH, w = std::rand() % OW, n = std::rand() % N, i = std::rand() % I;
    double ref = b[o];
    for (int ii = 0; ii < I; ++ii)
      for (int ky = 0; ky < K; ++ky)
        for (int kx = 0; kx < K; ++kx) ref += wt[((o * I + ii) * K + ky) * K + kx] * x[((ii * H + h + ky) * W + w + kx) * N + n];
    err = std::max(err, std::fabs(ref - y[((o * OH + h) * OW + w) * N + n]));
    const int ky = std::rand() % K, kx = std::rand() % K;
    double refw = 0;
    for (int hh = 0; hh < OH; ++hh)
      for (int ww = 0; ww < OW; ++ww)
        for (int nn = 0; nn < N; ++nn) refw += dy[((o * OH + hh) * OW + ww) * N + nn] * x[((i * H + hh + ky) * W + ww + kx) * N + nn];
    err = std::max(err, std::fabs(refw - dw[((o * I + i) * K + ky) * K + kx]) / std::max(1.0, std::fabs(refw)));
    const int hx = std::rand() % H, wx = std::rand() % W;
    double refx = 0;
    for (int oo = 0; oo < O; ++oo)
      for (int ky2 = 0; ky2 < K; ++ky2)
        for (int kx2 = 0; kx2 < K; ++kx2) {
          const int hy = hx - ky2, wy = wx - kx2;
          if (hy >= 0 && hy < OH && wy >= 0 && wy < OW)
            refx += wt[((oo * I + i) * K + ky2) * K + kx2] * dy[((oo * OH + hy) * OW + wy) * N + n];
        }
    err = std::max(err, std::fabs(refx - dx[((i * H + hx) * W + wx) * N + n]));
  }
  const double flop = 2.0 * N * O * OH * OW * I * K * K;
  const double f = best_ms([&] { forward<I, O, H, W, OB, NV>(x.data(), wt.data(), b.data(), y.data()); });
  const double bw = best_ms([&] { backward_weights<I, O, H, W>(x.data(), dy.data(), dw.data()); });
  const double bd = best_ms([&] { backward_data<I, O, H, W>(dy.data(), wt.data(), dx.data()); });
  std::printf("%s (max error %.1e): forward %.3f ms (%.0f GFLOP/s), backward weights %.3f ms (%.0f), backward data %.3f ms (%.0f)\n",
              name, err, f, flop / f / 1e6, bw, flop / bw / 1e6, bd, flop / bd / 1e6);
}

int main() {
  // Forward register blocks: output channels x vectors of 16 images.
  probe<1, 6, 28, 28, 6, 4>("conv1 1->6, 28x28, forward 6 x 4");
  probe<6, 16, 12, 12, 4, 4>("conv2 6->16, 12x12, forward 4 x 4");
  probe<6, 16, 12, 12, 8, 2>("conv2 6->16, 12x12, forward 8 x 2");
}
