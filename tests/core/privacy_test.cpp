#include <cmath>

#include <fax/train/privacy.h>

#include "helpers.h"

namespace fax {
namespace {

// A_alpha summed directly in long double (no logs), for moderate orders.
double direct_rdp(double q, double sigma, int alpha) {
  long double total = 0;
  for (int k = 0; k <= alpha; ++k) {
    const long double binomial = std::exp(std::lgamma(alpha + 1.0L) - std::lgamma(k + 1.0L) - std::lgamma(alpha - k + 1.0L));
    total += binomial * std::pow(1.0L - q, alpha - k) * std::pow(static_cast<long double>(q), k) *
             std::exp((static_cast<long double>(k) * k - k) / (2.0L * sigma * sigma));
  }
  return static_cast<double>(std::log(total) / (alpha - 1));
}

// The exact delta of the Gaussian mechanism at epsilon (Balle & Wang 2018, Theorem 8).
double gaussian_delta(double epsilon, double sigma) {
  auto phi = [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); };
  return phi(1.0 / (2 * sigma) - epsilon * sigma) - std::exp(epsilon) * phi(-1.0 / (2 * sigma) - epsilon * sigma);
}

TEST(Privacy, GaussianMechanismClosedForm) {
  for (double sigma : {0.5, 1.0, 3.7}) {
    for (int alpha : {2, 3, 10, 64, 256}) EXPECT_DOUBLE_EQ(sgm_rdp(1.0, sigma, alpha), alpha / (2 * sigma * sigma));
  }
  EXPECT_EQ(sgm_rdp(0.0, 1.0, 8), 0.0);
}

TEST(Privacy, SampledGaussianAgainstDirectSummation) {
  for (double q : {0.001, 0.01, 0.1, 0.5}) {
    for (double sigma : {0.8, 1.1, 4.0}) {
      for (int alpha : {2, 3, 5, 8, 16, 32}) {
        const double expected = direct_rdp(q, sigma, alpha);
        EXPECT_NEAR(sgm_rdp(q, sigma, alpha), expected, 1e-6 * std::max(1e-3, std::abs(expected)))
            << "q " << q << " sigma " << sigma << " alpha " << alpha;
      }
    }
  }
  // Sampling only helps: less privacy loss than the unsampled mechanism, more with larger q.
  EXPECT_LT(sgm_rdp(0.01, 1.0, 10), sgm_rdp(0.1, 1.0, 10));
  EXPECT_LT(sgm_rdp(0.1, 1.0, 10), sgm_rdp(1.0, 1.0, 10));
}

TEST(Privacy, EpsilonIsAValidBoundOnTheExactGaussianMechanism) {
  for (double sigma : {1.0, 2.0, 5.0}) {
    const double delta = 1e-5;
    const PrivacySpent spent = sgm_epsilon(1.0, sigma, 1, delta);
    EXPECT_GE(spent.order, 2);
    // The exact mechanism at the reported epsilon has delta no larger than promised...
    EXPECT_LE(gaussian_delta(spent.epsilon, sigma), delta * (1 + 1e-9)) << "sigma " << sigma;
    // ...and the bound is not far above the exact optimum (found by bisection).
    double lo = 0, hi = spent.epsilon;
    for (int i = 0; i < 200; ++i) {
      const double mid = 0.5 * (lo + hi);
      (gaussian_delta(mid, sigma) > delta ? lo : hi) = mid;
    }
    EXPECT_LT(spent.epsilon, 1.5 * hi) << "sigma " << sigma << ": exact epsilon " << hi;
  }
}

TEST(Privacy, EpsilonGrowsWithRoundsAndSamplingAndValidatesInput) {
  const double one = sgm_epsilon(0.01, 1.0, 100, 1e-5).epsilon;
  EXPECT_LT(one, sgm_epsilon(0.01, 1.0, 1000, 1e-5).epsilon);
  EXPECT_LT(one, sgm_epsilon(0.05, 1.0, 100, 1e-5).epsilon);
  EXPECT_GT(one, sgm_epsilon(0.01, 2.0, 100, 1e-5).epsilon);
  // The reported epsilon is the conversion at the reported order.
  const PrivacySpent s = sgm_epsilon(0.02, 1.3, 500, 1e-6);
  const double a = s.order;
  EXPECT_NEAR(s.epsilon, 500 * sgm_rdp(0.02, 1.3, s.order) + std::log((a - 1) / a) - (std::log(1e-6) + std::log(a)) / (a - 1),
              1e-12);
  EXPECT_THROW(sgm_rdp(1.5, 1.0, 4), Error);
  EXPECT_THROW(sgm_rdp(0.5, 0.0, 4), Error);
  EXPECT_THROW(sgm_epsilon(0.5, 1.0, 10, 0.0), Error);
}

}  // namespace
}  // namespace fax
