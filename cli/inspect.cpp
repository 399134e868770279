#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include <fax/config.h>
#include <fax/run_log.h>

#include "commands.h"

namespace fax::cli {

int inspect_command(const InspectOptions& options) {
  const RunLogReader log(options.run);
  const Config config = Config::from_yaml(log.config(), options.run + ":/config");
  const std::vector<int64_t> rounds = log.rounds();

  std::printf("run log: %s\n", options.run.c_str());
  std::printf("  algorithm %s, data %s, model %s; %lld of %s rounds logged, cohort %s, seed %s\n",
              config.raw("algorithm.name", "?").c_str(), config.raw("data.name", "?").c_str(),
              config.raw("model.name", "?").c_str(), static_cast<long long>(rounds.size()),
              config.raw("rounds", "?").c_str(), config.raw("cohort.size", "?").c_str(),
              config.raw("seed", "?").c_str());
  for (const auto& [key, value] : log.env()) std::printf("  %-22s %s\n", key.c_str(), value.c_str());
  const auto checkpoints = log.checkpoint_rounds();
  if (!checkpoints.empty()) std::printf("  checkpoints after rounds: %s\n", fmt::format("{}", fmt::join(checkpoints, ", ")).c_str());

  const std::vector<std::string> names = log.metric_names();
  std::vector<std::vector<double>> columns;
  for (const auto& name : names) columns.push_back(log.metric(name));
  const size_t shown = std::min<size_t>(rounds.size(), static_cast<size_t>(options.last));
  std::printf("\nlast %zu rounds:\n%8s", shown, "round");
  for (const auto& name : names) std::printf("  %14s", name.c_str());
  std::printf("\n");
  for (size_t i = rounds.size() - shown; i < rounds.size(); ++i) {
    std::printf("%8lld", static_cast<long long>(rounds[i]));
    for (const auto& column : columns) {
      if (std::isnan(column[i])) std::printf("  %14s", "-");
      else std::printf("  %14.6g", column[i]);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace fax::cli
