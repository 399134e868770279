#include <cmath>
#include <vector>

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


// --- The PLD accountant.

// epsilon of the Gaussian mechanism at delta, by bisection on the closed form.
double gaussian_epsilon(double delta, double sigma) {
  double lo = 0, hi = 1e3;
  for (int i = 0; i < 300; ++i) {
    const double mid = 0.5 * (lo + hi);
    (gaussian_delta(mid, sigma) > delta ? lo : hi) = mid;
  }
  return hi;
}

// The sampled Gaussian's hockey-stick divergence by quadrature: integral of (p(x) - e^eps q(x))_+,
// p = (1-q) N(0, s^2) + q N(1, s^2) and q = N(0, s^2), swapped for the add direction.
double quadrature_delta(double rate, double sigma, bool remove, double epsilon) {
  auto normal = [sigma](double x, double mean) {
    return std::exp(-(x - mean) * (x - mean) / (2 * sigma * sigma)) / (sigma * std::sqrt(2 * M_PI));
  };
  const double lo = -40 * sigma, hi = 1 + 40 * sigma;
  const int n = 2000000;
  const double h = (hi - lo) / n;
  long double total = 0;
  for (int i = 0; i < n; ++i) {
    const double x = lo + (i + 0.5) * h;
    const double mixture = (1 - rate) * normal(x, 0) + rate * normal(x, 1), plain = normal(x, 0);
    total += std::max(0.0, remove ? mixture - std::exp(epsilon) * plain : plain - std::exp(epsilon) * mixture);
  }
  return static_cast<double>(total * h);
}

TEST(Privacy, PldOfOneStepHasTheMechanismsDeltaAtEveryGridPoint) {
  // Connect the dots: at grid losses the discretised delta is the exact one (here by quadrature),
  // between them it lies above; the masses (with the one at infinity) sum to 1.
  for (bool remove : {true, false}) {
    const double h = 1e-3;
    const PrivacyLoss pld = PrivacyLoss::sampled_gaussian(0.1, 1.0, remove, h, 1e-15);
    for (double epsilon : {0.0, 0.05, 0.2, 0.5}) {
      EXPECT_NEAR(pld.delta(epsilon), quadrature_delta(0.1, 1.0, remove, epsilon), 1e-9)
          << (remove ? "remove" : "add") << " epsilon " << epsilon;
      const double between = epsilon + h / 2;
      EXPECT_GE(pld.delta(between), quadrature_delta(0.1, 1.0, remove, between) - 1e-12);
    }
  }
  // On a fine grid too, where delta is 1 - e^e up to rounding left of the bulk: no spurious mass
  // there (masses from differences of delta would carry 1e-16 / h of noise each).
  const PrivacyLoss fine = PrivacyLoss::sampled_gaussian(1.0, 1.0, true, 1e-5, 1e-15);
  for (double epsilon : {-8.0, -6.0, -5.0, 0.5})
    EXPECT_NEAR(fine.delta(epsilon), gaussian_delta(epsilon, 1.0), 1e-10) << "epsilon " << epsilon;
  // The add direction's losses stop at -log(1 - q): nothing at infinity, delta 0 beyond.
  const PrivacyLoss add = PrivacyLoss::sampled_gaussian(0.1, 1.0, false, 1e-3, 1e-15);
  EXPECT_EQ(add.infinity_mass(), 0.0);
  EXPECT_EQ(add.delta(-std::log1p(-0.1) + 2e-3), 0.0);
  EXPECT_LE(add.epsilon(1e-5), -std::log1p(-0.1) + 1e-3);
}

TEST(Privacy, PldMatchesTheAnalyticGaussianMechanism) {
  // Without sampling, T steps of noise sigma are one Gaussian mechanism of noise sigma / sqrt(T),
  // whose exact epsilon the closed form gives (Balle & Wang 2018). The PLD bound is pessimistic and
  // within 1e-6 of it at the 1e-4 grid. (After FFT compositions the roundoff, about 1e-16 of the
  // largest mass, limits delta below about 1e-7: docs/privacy.md.)
  struct Case {
    double sigma;
    int64_t steps;
    std::vector<double> deltas;
  };
  const std::vector<Case> cases = {{0.5, 1, {1e-3, 1e-5, 1e-8}}, {1.0, 1, {1e-3, 1e-5, 1e-8}}, {3.0, 1, {1e-3, 1e-5, 1e-8}},
                                   {1.0, 10, {1e-3, 1e-5}},        {3.0, 10, {1e-3, 1e-5}},        {3.0, 100, {1e-3, 1e-5}}};
  for (const Case& c : cases) {
    // Without sampling both directions of add/remove have the same PLD: compose one, once.
    const PrivacyLoss pld = PrivacyLoss::sampled_gaussian(1.0, c.sigma, true, 1e-4, 1e-15).self_compose(c.steps, 1e-15);
    for (double delta : c.deltas) {
      const double exact = gaussian_epsilon(delta, c.sigma / std::sqrt(static_cast<double>(c.steps)));
      EXPECT_GE(pld.epsilon(delta), exact - 1e-9) << "sigma " << c.sigma << " steps " << c.steps << " delta " << delta;
      EXPECT_NEAR(pld.epsilon(delta), exact, 1e-6) << "sigma " << c.sigma << " steps " << c.steps << " delta " << delta;
    }
  }
  EXPECT_NEAR(sgm_epsilon_pld(1.0, 3.0, 10, 1e-5, 1e-4), gaussian_epsilon(1e-5, 3.0 / std::sqrt(10.0)), 1e-6);
}

TEST(Privacy, PldIsAtOrBelowTheRenyiBound) {
  // PLD is the tighter accountant: on a grid of (q, sigma, steps) its epsilon is at most RDP's, and
  // sampling only helps (below the unsampled mechanism's exact epsilon).
  for (double q : {0.01, 0.1, 0.5}) {
    for (double sigma : {0.8, 1.0, 2.0}) {
      for (int64_t steps : {1, 10, 100}) {
        const double pld = sgm_epsilon_pld(q, sigma, steps, 1e-5, 1e-3);
        const double rdp = sgm_epsilon(q, sigma, steps, 1e-5).epsilon;
        EXPECT_LE(pld, rdp) << "q " << q << " sigma " << sigma << " steps " << steps;
        EXPECT_LT(pld, gaussian_epsilon(1e-5, sigma / std::sqrt(static_cast<double>(steps))))
            << "q " << q << " sigma " << sigma << " steps " << steps;
        EXPECT_GT(pld, 0.0);
      }
    }
  }
  // More steps, more sampling, less noise: more epsilon; a finer grid: a little less.
  const double base = sgm_epsilon_pld(0.05, 1.0, 50, 1e-5, 1e-3);
  EXPECT_LT(base, sgm_epsilon_pld(0.05, 1.0, 51, 1e-5, 1e-3));
  EXPECT_LT(base, sgm_epsilon_pld(0.06, 1.0, 50, 1e-5, 1e-3));
  EXPECT_LT(base, sgm_epsilon_pld(0.05, 0.9, 50, 1e-5, 1e-3));
  const double fine = sgm_epsilon_pld(0.05, 1.0, 50, 1e-5, 1e-4);
  EXPECT_LE(fine, base);
  EXPECT_NEAR(fine, base, 1e-3);
}

// Two rounds of the sampled Gaussian, by quadrature over (x, y): the integral of
// (p(x) p(y) - e^eps q(x) q(y))_+, each direction, against the composed PLD.
TEST(Privacy, PldOfTwoRoundsMatchesQuadrature) {
  const double rate = 0.2, sigma = 0.8, lo = -10 * sigma, hi = 1 + 10 * sigma;
  const int n = 4000;
  const double h = (hi - lo) / n;
  std::vector<double> mixture(n), plain(n);
  for (int i = 0; i < n; ++i) {
    const double x = lo + (i + 0.5) * h;
    const auto normal = [&](double mean) {
      return std::exp(-(x - mean) * (x - mean) / (2 * sigma * sigma)) / (sigma * std::sqrt(2 * M_PI));
    };
    mixture[i] = (1 - rate) * normal(0) + rate * normal(1);
    plain[i] = normal(0);
  }
  for (bool remove : {true, false}) {
    const std::vector<double>& p = remove ? mixture : plain;
    const std::vector<double>& q = remove ? plain : mixture;
    const PrivacyLoss two = PrivacyLoss::sampled_gaussian(rate, sigma, remove, 1e-4, 1e-15).self_compose(2, 1e-15);
    for (double epsilon : {0.1, 0.5, 1.0}) {
      long double total = 0;
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) total += std::max(0.0, p[i] * p[j] - std::exp(epsilon) * q[i] * q[j]);
      const double exact = static_cast<double>(total * h * h);
      EXPECT_NEAR(two.delta(epsilon), exact, 2e-6) << (remove ? "remove" : "add") << " epsilon " << epsilon;
      EXPECT_GE(two.delta(epsilon), exact - 2e-6);
    }
  }
}

TEST(Privacy, PldComposesAndValidatesInput) {
  const PrivacyLoss one = PrivacyLoss::sampled_gaussian(0.2, 1.5, true, 1e-3, 1e-15);
  // Composition is convolution: 3 = 1 + 2 = 2 + 1, whichever way it is grouped.
  const PrivacyLoss three = one.self_compose(3, 1e-15);
  EXPECT_NEAR(three.epsilon(1e-5), one.self_compose(2, 1e-15).compose(one, 1e-15).epsilon(1e-5), 1e-9);
  EXPECT_EQ(one.self_compose(0, 1e-15).epsilon(1e-5), 0.0);
  EXPECT_EQ(sgm_epsilon_pld(0.0, 1.0, 10, 1e-5), 0.0);
  EXPECT_EQ(sgm_epsilon_pld(0.5, 1.0, 0, 1e-5), 0.0);
  // delta(epsilon(d)) = d: the inverse is exact on the piecewise curve.
  const double epsilon = three.epsilon(1e-4);
  EXPECT_NEAR(three.delta(epsilon), 1e-4, 1e-12);
  EXPECT_THROW(sgm_epsilon_pld(1.5, 1.0, 10, 1e-5), Error);
  EXPECT_THROW(sgm_epsilon_pld(0.5, 0.0, 10, 1e-5), Error);
  EXPECT_THROW(sgm_epsilon_pld(0.5, 1.0, 10, 0.0), Error);
  EXPECT_THROW(sgm_epsilon_pld(0.5, 1.0, 10, 1e-5, 0.0), Error);
  EXPECT_THROW(sgm_epsilon_pld(0.5, 1.0, -1, 1e-5), Error);
  // A delta near the cut tails (about 1e-15 a round, at infinity) is refused, not read as infinite.
  EXPECT_THROW(sgm_epsilon_pld(0.01, 1.0, 1000, 1e-12, 1e-3), Error);
  EXPECT_TRUE(std::isfinite(sgm_epsilon_pld(0.01, 1.0, 1000, 1e-9, 1e-3)));
  // A grid too fine for the loss range is refused before anything is allocated.
  EXPECT_THROW(sgm_epsilon_pld(1.0, 0.01, 1, 1e-5, 1e-7), Error);
}

}  // namespace
}  // namespace fax
