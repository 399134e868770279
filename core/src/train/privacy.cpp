#include <fax/train/privacy.h>

#include <cmath>
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

}  // namespace fax
