#include <fax/train/privacy.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <limits>
#include <vector>

#include <fax/base/error.h>

namespace fax {

double sgm_rdp(double q, double sigma, int alpha) {
  FAX_CHECK(q >= 0 && q <= 1, "sampling rate {} is not in [0, 1]", q);
  FAX_CHECK(sigma > 0, "noise multiplier must be positive (got {})", sigma);
  FAX_CHECK(alpha >= 2, "Rényi order must be at least 2 (got {})", alpha);
  if (q == 0) return 0;
  if (q == 1) return alpha / (2 * sigma * sigma);
  // log A_alpha = log sum_k C(alpha, k) (1-q)^(alpha-k) q^k exp((k^2 - k) / (2 sigma^2)), by log-sum-exp.
  std::vector<double> terms;
  for (int k = 0; k <= alpha; ++k) {
    const double log_binomial = std::lgamma(alpha + 1.0) - std::lgamma(k + 1.0) - std::lgamma(alpha - k + 1.0);
    terms.push_back(log_binomial + (alpha - k) * std::log1p(-q) + k * std::log(q) +
                    (static_cast<double>(k) * k - k) / (2 * sigma * sigma));
  }
  double largest = -std::numeric_limits<double>::infinity();
  for (double t : terms) largest = std::max(largest, t);
  double total = 0;
  for (double t : terms) total += std::exp(t - largest);
  return (largest + std::log(total)) / (alpha - 1);
}

PrivacySpent sgm_epsilon(double q, double sigma, int64_t steps, double delta) {
  FAX_CHECK(delta > 0 && delta < 1, "delta must be in (0, 1) (got {})", delta);
  FAX_CHECK(steps >= 0, "steps must be non-negative (got {})", steps);
  PrivacySpent best{std::numeric_limits<double>::infinity(), 0};
  for (int alpha = 2; alpha <= 256; ++alpha) {
    const double rdp = static_cast<double>(steps) * sgm_rdp(q, sigma, alpha);
    const double epsilon =
        rdp + std::log((alpha - 1.0) / alpha) - (std::log(delta) + std::log(static_cast<double>(alpha))) / (alpha - 1);
    if (epsilon < best.epsilon) best = {epsilon, alpha};
  }
  best.epsilon = std::max(best.epsilon, 0.0);
  return best;
}

// --- The PLD accountant.
namespace {

double normal_upper(double x) { return 0.5 * std::erfc(x / std::sqrt(2.0)); }  // P(N(0,1) > x)
double normal_lower(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// A loss threshold's probabilities under the pair (P, Q): P(L > e), P(L <= e), Q(L > e), Q(L <= e).
struct Tails {
  double p_above, p_below, q_above, q_below;
};

// The sampled Gaussian's losses are monotone in x: L > e exactly when x passes a threshold t(e).
struct SampledGaussianPair {
  double q, sigma;
  bool remove;

  // x with log((1-q) + q exp((2x - 1) / (2 sigma^2))) = e, for e > log(1 - q).
  double threshold(double e) const {
    return sigma * sigma * (e + std::log1p(-(1 - q) * std::exp(-e)) - std::log(q)) + 0.5;
  }
  bool reachable(double e) const { return q == 1 || e > std::log1p(-q); }  // f(x) > e for some x

  Tails at(double e) const {
    if (remove) {  // x ~ P = (1-q) N(0) + q N(1), L = f(x)
      if (!reachable(e)) return {1, 0, 1, 0};
      const double t = threshold(e);
      return {(1 - q) * normal_upper(t / sigma) + q * normal_upper((t - 1) / sigma),
              (1 - q) * normal_lower(t / sigma) + q * normal_lower((t - 1) / sigma), normal_upper(t / sigma),
              normal_lower(t / sigma)};
    }
    // x ~ Q = N(0), L = -f(x): L > e when f(x) < -e.
    if (!reachable(-e)) return {0, 1, 0, 1};
    const double t = threshold(-e);
    return {normal_lower(t / sigma), normal_upper(t / sigma),
            (1 - q) * normal_lower(t / sigma) + q * normal_lower((t - 1) / sigma),
            (1 - q) * normal_upper(t / sigma) + q * normal_upper((t - 1) / sigma)};
  }
  double delta(double e) const { return delta_of(e, at(e)); }

  static double delta_of(double e, const Tails& s) { return std::max(0.0, s.p_above - std::exp(e) * s.q_above); }
  // delta(e) - (1 - e^e) = e^e Q(L <= e) - P(L <= e) >= 0: small, and exact from lower tails, left
  // of the bulk, where delta itself is 1 - e^e up to rounding.
  static double excess_of(double e, const Tails& s) { return std::max(0.0, std::exp(e) * s.q_below - s.p_below); }
};

// The e where a condition that holds from some point up starts to hold, to within `resolution`.
template <class Holds>
double first_where(Holds holds, double resolution) {
  double far = 1;
  while (!holds(far) || holds(-far)) {
    far *= 2;
    FAX_CHECK(far < 1e6, "the privacy loss range does not close (noise multiplier too small?)");
  }
  double in = far, out = -far;
  while (in - out > resolution) {
    const double mid = 0.5 * (in + out);
    (holds(mid) ? in : out) = mid;
  }
  return in;
}

// In-place radix-2 FFT (size a power of two); `inverse` leaves the result unscaled.
void fft(std::vector<std::complex<double>>& a, bool inverse) {
  const size_t n = a.size();
  for (size_t i = 1, j = 0; i < n; ++i) {
    size_t bit = n >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) std::swap(a[i], a[j]);
  }
  // Twiddles from one table of the n-th roots, each computed directly (no accumulated rotation).
  std::vector<std::complex<double>> roots(n / 2);
  for (size_t k = 0; k < n / 2; ++k) roots[k] = std::polar(1.0, (inverse ? 2 : -2) * M_PI * k / n);
  for (size_t len = 2; len <= n; len <<= 1) {
    const size_t stride = n / len;
    for (size_t i = 0; i < n; i += len) {
      for (size_t k = 0; k < len / 2; ++k) {
        const std::complex<double> u = a[i + k], v = a[i + k + len / 2] * roots[k * stride];
        a[i + k] = u + v;
        a[i + k + len / 2] = u - v;
      }
    }
  }
}

std::vector<double> convolve(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t out = a.size() + b.size() - 1;
  size_t n = 1;
  while (n < out) n <<= 1;
  // At 2^25 points the two transforms, the twiddles and the result take 1.5 GiB: refuse beyond,
  // before allocating.
  FAX_CHECK(n <= (size_t{1} << 25),
            "the privacy loss distribution needs {} points: raise the PLD interval or use the rdp accountant", out);
  std::vector<std::complex<double>> fa(n), fb;
  std::copy(a.begin(), a.end(), fa.begin());
  fft(fa, false);
  if (&a == &b) {
    for (auto& x : fa) x *= x;
  } else {
    fb.assign(n, 0);
    std::copy(b.begin(), b.end(), fb.begin());
    fft(fb, false);
    for (size_t i = 0; i < n; ++i) fa[i] *= fb[i];
  }
  fft(fa, true);
  std::vector<double> c(out);
  // Rounding leaves tiny negative values where the mass is zero.
  for (size_t i = 0; i < out; ++i) c[i] = std::max(0.0, fa[i].real() / static_cast<double>(n));
  return c;
}

}  // namespace

PrivacyLoss::PrivacyLoss(double interval, int64_t lowest, std::vector<double> mass, double infinity)
    : interval_(interval), lowest_(lowest), mass_(std::move(mass)), infinity_(infinity) {}

PrivacyLoss PrivacyLoss::sampled_gaussian(double q, double sigma, bool remove, double interval, double tail) {
  FAX_CHECK(q > 0 && q <= 1, "sampling rate {} is not in (0, 1]", q);
  FAX_CHECK(sigma > 0, "noise multiplier must be positive (got {})", sigma);
  FAX_CHECK(interval >= 1e-7 && interval <= 1, "PLD interval must be in [1e-7, 1] (got {})", interval);
  FAX_CHECK(tail > 0 && tail < 1e-3, "PLD tail must be in (0, 1e-3) (got {})", tail);
  const SampledGaussianPair pair{q, sigma, remove};
  const double top = first_where([&](double e) { return pair.delta(e) <= tail; }, interval);
  const double bottom = first_where([&](double e) { return pair.at(e).p_below > tail; }, interval);
  const auto lo = static_cast<int64_t>(std::floor(bottom / interval));
  const auto hi = std::max(lo + 1, static_cast<int64_t>(std::ceil(top / interval)));
  FAX_CHECK(hi - lo < (int64_t{1} << 25), "the privacy loss distribution needs {} points: raise the PLD interval",
            hi - lo + 1);
  const size_t m = static_cast<size_t>(hi - lo + 1);
  const auto loss = [&](size_t j) { return static_cast<double>(lo + static_cast<int64_t>(j)) * interval; };
  std::vector<double> d(m), excess(m), below(m);
  for (size_t j = 0; j < m; ++j) {
    const Tails t = pair.at(loss(j));
    d[j] = SampledGaussianPair::delta_of(loss(j), t);
    excess[j] = SampledGaussianPair::excess_of(loss(j), t);
    below[j] = t.p_below;
  }
  // Delta_j = d_j - d_(j+1), segment by segment. Left of the median, d = 1 - e^e + excess with
  // the excess small: there Delta_j = e^(e_j) (e^h - 1) + excess_j - excess_(j+1), which keeps
  // the masses' absolute error near 1e-16 of e^e instead of 1e-16 / h (which, clamped at 0,
  // would put spurious mass in the low tail, more the finer the grid).
  std::vector<double> step(m - 1);
  for (size_t j = 0; j + 1 < m; ++j) {
    step[j] = below[j + 1] < 0.5 ? std::exp(loss(j)) * std::expm1(interval) + excess[j] - excess[j + 1]
                                 : d[j] - d[j + 1];
  }
  // Masses whose delta passes through every (e_j, d_j), linear in e^e between them: p_j =
  // Delta_(j-1) / (1 - e^-h) - Delta_j / (e^h - 1); below the lowest point the line runs to
  // delta = 1 at e = -infinity (p_0 = 1 - d_0 - Delta_0 / (e^h - 1), with 1 - d_0 = e^(e_0) -
  // excess_0 left of the median), above the highest one d_(m-1) is at infinity.
  const double down = -std::expm1(-interval), up = std::expm1(interval);
  const double first = below[0] < 0.5 ? std::exp(loss(0)) - excess[0] : 1 - d[0];
  std::vector<double> mass(m);
  for (size_t j = 0; j < m; ++j) {
    const double before = j == 0 ? first : step[j - 1] / down;
    const double after = j + 1 == m ? 0 : step[j] / up;
    mass[j] = std::max(0.0, before - after);
  }
  return PrivacyLoss(interval, lo, std::move(mass), d[m - 1]);
}

PrivacyLoss PrivacyLoss::truncated(double tail) const {
  size_t first = 0, last = mass_.size();
  double below = 0, above = 0;
  while (first + 1 < last && below + mass_[first] <= tail) below += mass_[first++];
  while (last - 1 > first && above + mass_[last - 1] <= tail) above += mass_[--last];
  std::vector<double> kept(mass_.begin() + static_cast<std::ptrdiff_t>(first),
                           mass_.begin() + static_cast<std::ptrdiff_t>(last));
  kept.front() += below;  // a smaller loss raised: pessimistic
  return PrivacyLoss(interval_, lowest_ + static_cast<int64_t>(first), std::move(kept), infinity_ + above);
}

PrivacyLoss PrivacyLoss::compose(const PrivacyLoss& other, double tail) const {
  FAX_CHECK(interval_ == other.interval_, "composing PLDs on different grids ({} and {})", interval_, other.interval_);
  return PrivacyLoss(interval_, lowest_ + other.lowest_, convolve(mass_, other.mass_),
                     infinity_ + other.infinity_ - infinity_ * other.infinity_)
      .truncated(tail);
}

PrivacyLoss PrivacyLoss::self_compose(int64_t times, double tail) const {
  FAX_CHECK(times >= 0, "composition count must be non-negative (got {})", times);
  if (times == 0) return PrivacyLoss(interval_, 0, {1.0}, 0);
  PrivacyLoss power = *this;
  for (; (times & 1) == 0; times >>= 1) power = power.compose(power, tail);
  PrivacyLoss result = power;
  while (times >>= 1) {
    power = power.compose(power, tail);
    if (times & 1) result = result.compose(power, tail);
  }
  return result;
}

double PrivacyLoss::delta(double epsilon) const {
  double total = infinity_;
  for (size_t i = mass_.size(); i-- > 0;) {
    const double loss = static_cast<double>(lowest_ + static_cast<int64_t>(i)) * interval_;
    if (loss <= epsilon) break;
    total += mass_[i] * -std::expm1(epsilon - loss);
  }
  return std::min(1.0, total);
}

double PrivacyLoss::epsilon(double delta) const {
  FAX_CHECK(delta > 0 && delta < 1, "delta must be in (0, 1) (got {})", delta);
  if (infinity_ > delta) return std::numeric_limits<double>::infinity();
  // From the top: with A the mass at losses >= l_i (and at infinity) and S = sum p_j e^(l_i - l_j)
  // over those losses, delta(e) = A - e^(e - l_i) S for e in [l_(i-1), l_i].
  const double shrink = std::exp(-interval_);
  double above = infinity_, scaled = 0;
  for (size_t i = mass_.size(); i-- > 0;) {
    above += mass_[i];
    scaled = mass_[i] + shrink * scaled;
    if (scaled <= 0) continue;
    if (i == 0 || above - shrink * scaled > delta) {
      const double loss = static_cast<double>(lowest_ + static_cast<int64_t>(i)) * interval_;
      return std::max(0.0, loss + std::log((above - delta) / scaled));
    }
  }
  return 0;
}

double combined_noise_multiplier(double z, double count_noise) {
  FAX_CHECK(z > 0 && count_noise >= 0, "noise multiplier {} and count noise {}: need z > 0 and count noise >= 0", z,
            count_noise);
  if (count_noise == 0) return z;
  return 1 / std::sqrt(1 / (z * z) + 1 / (4 * count_noise * count_noise));
}

double sgm_epsilon_pld(double q, double sigma, int64_t steps, double delta, double interval) {
  FAX_CHECK(q >= 0 && q <= 1, "sampling rate {} is not in [0, 1]", q);
  FAX_CHECK(steps >= 0, "steps must be non-negative (got {})", steps);
  FAX_CHECK(delta > 0 && delta < 1, "delta must be in (0, 1) (got {})", delta);
  if (q == 0 || steps == 0) return 0;
  // A smaller cut would not help: the FFTs' roundoff, about 1e-16 of the largest mass, is spread
  // over every point, so tails below it cannot be told from zero.
  constexpr double kTail = 1e-15;
  double epsilon = 0;
  for (bool remove : {true, false}) {
    const PrivacyLoss composed = PrivacyLoss::sampled_gaussian(q, sigma, remove, interval, kTail).self_compose(steps, kTail);
    // The cut tails (about steps x 1e-15) sit at infinity: a delta near them would read as infinite
    // epsilon, and one within 100x of them is dominated by the cut rather than the mechanism.
    FAX_CHECK(composed.infinity_mass() * 100 <= delta,
              "delta {} is below what the PLD accountant resolves after {} rounds ({:.2g} of its mass is cut "
              "tails): use a larger delta or the rdp accountant", delta, steps, composed.infinity_mass());
    epsilon = std::max(epsilon, composed.epsilon(delta));
  }
  return epsilon;
}

}  // namespace fax
