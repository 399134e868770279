// fax-run privacy: the epsilon a DP run would log, before running it: the sampled Gaussian
// mechanism's (epsilon, delta) after some rounds, by the RDP and PLD accountants
// (docs/privacy.md), with the functions the gaussian stage's ledger calls.

#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include <fax/base/error.h>
#include <fax/train/privacy.h>

#include "commands.h"

namespace fax::cli {
namespace {

struct PrivacyOptions {
  double rate = -1;
  int64_t cohort = 0;
  int64_t population = 0;
  double noise_multiplier = 1.0;
  int64_t rounds = 0;
  double delta = 1e-5;
  std::string accountant = "both";
  double pld_interval = kPldInterval;
  double count_noise = 0;
};

int privacy_command(const PrivacyOptions& o) {
  const bool by_counts = o.cohort > 0 || o.population > 0;
  FAX_CHECK(by_counts != (o.rate >= 0), "give either --sampling-rate or --cohort and --population");
  FAX_CHECK(!by_counts || (o.cohort > 0 && o.population >= o.cohort),
            "--cohort ({}) must be positive and at most --population ({})", o.cohort, o.population);
  const double q = by_counts ? static_cast<double>(o.cohort) / static_cast<double>(o.population) : o.rate;
  const double z = combined_noise_multiplier(o.noise_multiplier, o.count_noise);
  std::printf("sampled Gaussian mechanism: q = %.6g, noise multiplier %g, %lld rounds, delta %g\n", q, z,
              static_cast<long long>(o.rounds), o.delta);
  if (o.count_noise > 0) {
    std::printf("(the sum's z %g and adaptive clipping's count noise %g, charged together)\n", o.noise_multiplier,
                o.count_noise);
  }
  if (o.accountant != "pld") {
    const PrivacySpent spent = sgm_epsilon(q, z, o.rounds, o.delta);
    std::printf("  rdp  epsilon %.6f  (Renyi order %d)\n", spent.epsilon, spent.order);
  }
  if (o.accountant != "rdp") {
    std::printf("  pld  epsilon %.6f  (interval %g)\n",
                sgm_epsilon_pld(q, z, o.rounds, o.delta, o.pld_interval), o.pld_interval);
  }
  return 0;
}

}  // namespace

Subcommand add_privacy_subcommand(CLI::App& app) {
  auto o = std::make_shared<PrivacyOptions>();
  CLI::App* cmd = app.add_subcommand(
      "privacy", "epsilon of the sampled Gaussian mechanism after some rounds, as a gaussian stage would log it");
  cmd->add_option("--sampling-rate", o->rate, "q, the chance a client takes part in a round")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--cohort", o->cohort, "cohort.size (q = cohort / population)")->check(CLI::PositiveNumber);
  cmd->add_option("--population", o->population, "the number of clients")->check(CLI::PositiveNumber);
  cmd->add_option("--noise-multiplier,-z", o->noise_multiplier, "z (default 1.0)")->check(CLI::PositiveNumber);
  cmd->add_option("--rounds", o->rounds, "rounds run")->required()->check(CLI::NonNegativeNumber);
  cmd->add_option("--delta", o->delta, "delta (default 1e-5)")->check(CLI::Range(1e-300, 0.999999));
  cmd->add_option("--accountant", o->accountant, "rdp, pld or both (default)")
      ->check(CLI::IsMember({"rdp", "pld", "both"}));
  cmd->add_option("--pld-interval", o->pld_interval, "the PLD grid (default 1e-3, as the stage's pld_interval)")
      ->check(CLI::Range(1e-4, 0.1));
  cmd->add_option("--count-noise", o->count_noise,
                  "adaptive clipping's aggregation.clip.count_noise (default 0: no count released)")
      ->check(CLI::NonNegativeNumber);
  return {cmd, [o] { return privacy_command(*o); }};
}

}  // namespace fax::cli
