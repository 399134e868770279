// One thread of oneDNN's sgemm (the product fax's float layers call) at the MLP's per-client
// shapes, B = 20 rows, against the 2048^3 product: each shape cycles over `clients` operand sets,
// as a chunk's step loop does (1: operands stay in cache). Best of 5 timings; GFLOP/s.
//   g++ -O2 -o /tmp/gemm_small experiments/bench/gemm_small.cpp -ldnnl && OMP_NUM_THREADS=1 /tmp/gemm_small
#include <chrono>
#include <cstdio>
#include <vector>

#include <oneapi/dnnl/dnnl.h>

namespace {

double gflops(char ta, char tb, int m, int n, int k, int clients, int calls) {
  std::vector<std::vector<float>> a(clients, std::vector<float>(size_t(m) * k, 0.5f));
  std::vector<std::vector<float>> b(clients, std::vector<float>(size_t(k) * n, 0.25f));
  std::vector<std::vector<float>> c(clients, std::vector<float>(size_t(m) * n, 0.f));
  const int lda = ta == 'N' ? k : m, ldb = tb == 'N' ? n : k, rounds = calls / clients + 1;
  double best = 1e30;
  for (int t = 0; t < 5; ++t) {
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < rounds; ++r)
      for (int i = 0; i < clients; ++i)
        dnnl_sgemm(ta, tb, m, n, k, 1.f, a[i].data(), lda, b[i].data(), ldb, 0.f, c[i].data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s / (rounds * clients) < best) best = s / (rounds * clients);
  }
  return 2.0 * m * n * k / best / 1e9;
}

}  // namespace

int main() {
  struct Shape {
    const char* what;
    char ta, tb;
    int m, n, k;
  };
  const Shape shapes[] = {
      {"layer 1 forward, x W1 (20x784 . 784x200)", 'N', 'N', 20, 200, 784},
      {"layer 2 forward, h W2 (20x200 . 200x200)", 'N', 'N', 20, 200, 200},
      {"layer 2 dW2 = h^T g (200x20 . 20x200)", 'T', 'N', 200, 200, 20},
      {"layer 2 dh = g W2^T (20x200 . (200x200)^T)", 'N', 'T', 20, 200, 200},
      {"layer 3 forward (20x200 . 200x10)", 'N', 'N', 20, 10, 200},
  };
  std::printf("2048^3 product: %.1f GFLOP/s\n\n| product | 1 client | 5 clients | 32 clients |\n|---|---|---|---|\n",
              gflops('N', 'N', 2048, 2048, 2048, 1, 3));
  for (const Shape& s : shapes)
    std::printf("| %s | %.1f | %.1f | %.1f |\n", s.what, gflops(s.ta, s.tb, s.m, s.n, s.k, 1, 5000),
                gflops(s.ta, s.tb, s.m, s.n, s.k, 5, 5000), gflops(s.ta, s.tb, s.m, s.n, s.k, 32, 5000));
}
