#pragma once

#include <cstdint>
#include <vector>

namespace fax {

/// Rényi differential privacy of the sampled Gaussian mechanism (Mironov, Talwar, Zhang 2019) at
/// integer order alpha >= 2: each record is included with probability q, the query has L2
/// sensitivity 1 and Gaussian noise of standard deviation sigma. q = 1 gives the Gaussian
/// mechanism's alpha / (2 sigma^2).
double sgm_rdp(double q, double sigma, int alpha);

struct PrivacySpent {
  double epsilon = 0;
  int order = 0;  ///< the Rényi order that gave it
};

/// The PLD grid the gaussian stage and `fax-run privacy` use unless told otherwise.
constexpr double kPldInterval = 1e-3;

/// (epsilon, delta)-DP after `steps` compositions of the sampled Gaussian mechanism, minimised over
/// integer orders 2..256, with the conversion of Balle et al. 2020 (Theorem 21):
/// epsilon = rdp + log((alpha - 1) / alpha) - (log(delta) + log(alpha)) / (alpha - 1).
PrivacySpent sgm_epsilon(double q, double sigma, int64_t steps, double delta);

/// A privacy loss distribution (PLD) on a grid of losses k * interval, with a mass at +infinity:
/// the distribution of log(P(x) / Q(x)) for x drawn from P, (P, Q) a dominating pair of a mechanism.
/// delta(epsilon) is the hockey-stick divergence sum_l p_l (1 - e^(epsilon - l))_+ (+ the mass at
/// infinity); composing mechanisms convolves their PLDs.
class PrivacyLoss {
 public:
  /// The Poisson-subsampled Gaussian mechanism (sampling rate q, sensitivity 1, noise sigma) in one
  /// of the two directions of add/remove adjacency (`remove`: P = (1-q) N(0, s^2) + q N(1, s^2),
  /// Q = N(0, s^2); otherwise the pair swapped). Discretised by "connect the dots" (Doroshenko et
  /// al. 2022): the masses are chosen so that the grid PLD's delta equals the mechanism's exact
  /// delta at every grid point and interpolates it linearly in e^epsilon between them, which lies
  /// above the (convex) exact curve: a pessimistic bound with an error second order in the interval.
  /// The loss range is cut at the top where delta falls to `tail` (delta there goes to infinity)
  /// and at the bottom where less than `tail` lies below (moved up to the lowest loss): both
  /// pessimistic.
  static PrivacyLoss sampled_gaussian(double q, double sigma, bool remove, double interval, double tail);

  /// This composed with itself `times` times (times >= 0), by repeated squaring with FFT
  /// convolutions, each result's tails cut as above.
  PrivacyLoss self_compose(int64_t times, double tail) const;
  PrivacyLoss compose(const PrivacyLoss& other, double tail) const;

  double delta(double epsilon) const;
  /// The smallest epsilon >= 0 with delta(epsilon) <= delta (infinity when the mass at infinity
  /// alone exceeds delta).
  double epsilon(double delta) const;

  int64_t size() const { return static_cast<int64_t>(mass_.size()); }
  double infinity_mass() const { return infinity_; }

 private:
  PrivacyLoss(double interval, int64_t lowest, std::vector<double> mass, double infinity);
  PrivacyLoss truncated(double tail) const;

  double interval_;
  int64_t lowest_;            ///< the loss of mass_[0] is lowest_ * interval_
  std::vector<double> mass_;
  double infinity_;
};

/// (epsilon, delta)-DP after `steps` compositions of the Poisson-subsampled Gaussian mechanism under
/// add/remove adjacency, by the PLD accountant: the larger epsilon of the two directions. Tighter
/// than sgm_epsilon (the Rényi bound), at the cost of FFTs over about (loss range / interval) points.
double sgm_epsilon_pld(double q, double sigma, int64_t steps, double delta, double interval = kPldInterval);

/// The noise multiplier of the Gaussian mechanism that releases a sum of sensitivity 1 with noise
/// multiplier `z` and a count of sensitivity 1/2 with noise std `count_noise` (adaptive clipping's
/// centred count) together: (z^-2 + (2 count_noise)^-2)^-1/2 (Andrew et al. 2021, Theorem 1);
/// `z` when count_noise is 0 (no count released).
double combined_noise_multiplier(double z, double count_noise);

}  // namespace fax
