#pragma once

#include <cstdint>

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

/// (epsilon, delta)-DP after `steps` compositions of the sampled Gaussian mechanism, minimised over
/// integer orders 2..256, with the conversion of Balle et al. 2020 (Theorem 21):
/// epsilon = rdp + log((alpha - 1) / alpha) - (log(delta) + log(alpha)) / (alpha - 1).
PrivacySpent sgm_epsilon(double q, double sigma, int64_t steps, double delta);

}  // namespace fax
