#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include <fax/base/config.h>
#include <fax/base/error.h>
#include <fax/io/config_yaml.h>
#include <fax/io/run_log.h>
#include <fax/tools/charts.h>
#include <fax/tools/expect.h>
#include <fax/tools/sweep.h>

#include "commands.h"
#include "options.h"

namespace fax::cli {

int inspect_command(const InspectOptions& options) {
  if (SweepIndex::is_index(options.run)) {
    print_sweep_summary(SweepIndex::read(options.run), options.run, static_cast<size_t>(options.last));
    return 0;
  }
  const RunLogReader log(options.run);
  const Config config = parse_config(log.config(), options.run + ":/config");
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
  if (!rounds.empty()) {
    std::printf("\nmetrics over %zu rounds (first, last, min, max):\n", rounds.size());
    for (size_t m = 0; m < names.size(); ++m) {
      double first = NAN, last = NAN, low = INFINITY, high = -INFINITY;
      for (double v : columns[m]) {
        if (!std::isfinite(v)) continue;
        if (std::isnan(first)) first = v;
        last = v;
        low = std::min(low, v);
        high = std::max(high, v);
      }
      if (std::isnan(first)) continue;
      // Padded by hand: printf widths count bytes, and each block is three.
      const std::string line = sparkline(columns[m], 40);
      const size_t glyphs = line.size() / 3;
      std::printf("  %-22s %s%s %10.4g %10.4g %10.4g %10.4g\n", names[m].c_str(), line.c_str(),
                  std::string(40 - glyphs, ' ').c_str(), first, last, low, high);
    }
  }
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

Subcommand add_inspect_subcommand(CLI::App& app) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* cmd =
      app.add_subcommand("inspect", "summarise a run log (settings, environment, metric sparklines, last rounds) or a sweep index");
  cmd->add_option("run", o->run, "a run log, or a sweep index (<dir>/sweep.h5)")->required()->type_name("RUN.h5");
  cmd->add_option("--last", o->last, "rounds to show")->check(CLI::PositiveNumber);
  return {cmd, [o] { return inspect_command(*o); }};
}

int expect_command(const ExpectOptions& options) {
  const RunLogReader log(options.run);
  char date[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::localtime(&now));
  const std::string recorded_on =
      fmt::format("fax {}, LibTorch {}, host {}, {} hardware threads, {}", log.env("fax_version"),
                  log.env("torch_version"), log.env("host"), log.env("hardware_threads"), date);
  std::printf("%s", expect_section(log, options.metrics, options.tolerance, recorded_on).c_str());
  return 0;
}

Subcommand add_expect_subcommand(CLI::App& app) {
  auto o = std::make_shared<ExpectOptions>();
  CLI::App* cmd = app.add_subcommand(
      "expect", "print an expect: section from a run log's final metrics, to paste into its experiment (run --check)");
  cmd->add_option("run", o->run, "a run log")->required()->type_name("RUN.h5");
  cmd->add_option("--metric", o->metrics, "a metric to expect (repeatable; default eval/accuracy)")->type_name("NAME");
  cmd->add_option("--tolerance", o->tolerance, "how far a run may land from the recorded value (default 0.005)")
      ->check(CLI::NonNegativeNumber);
  return {cmd, [o] { return expect_command(*o); }};
}

int table_command(const TableOptions& options) {
  const std::string& first = options.inputs.front();
  const std::string path =
      std::filesystem::is_directory(first) ? (std::filesystem::path(first) / "sweep.h5").string() : first;
  if (!SweepIndex::is_index(path)) {
    FAX_CHECK(options.rows.empty() && options.cols.empty() && options.where.empty() && options.scale == 1.0 &&
                  !options.minutes,
              "{}: --rows, --cols, --where, --scale and --minutes are for a sweep; a table of run logs takes --metric "
              "columns",
              first);
    const std::vector<std::string> columns = options.metrics.empty() ? std::vector<std::string>{"eval/accuracy%"} : options.metrics;
    std::printf("%s", runs_table(options.inputs, columns).c_str());
    return 0;
  }
  FAX_CHECK(options.inputs.size() == 1, "{}: a table shows one sweep (or run logs only)", path);
  FAX_CHECK(!options.rows.empty() && !options.cols.empty(), "{}: a sweep's table needs --rows and --cols", path);
  FAX_CHECK(options.metrics.size() <= 1, "{}: a sweep's table shows one --metric", path);
  FAX_CHECK(!options.minutes || options.scale == 1.0, "{}: --minutes shows minutes; it takes no --scale", path);
  SweepIndex index = select_trials(SweepIndex::read(path), options.where);
  if (!options.metrics.empty()) {
    SweepSpec spec;
    spec.set_metric(options.metrics.front());
    index.metric = spec.metric;
    index.maximize = spec.maximize;
  }
  std::printf("%s", sweep_table(index, options.rows, options.cols, options.scale, options.minutes).c_str());
  return 0;
}

Subcommand add_table_subcommand(CLI::App& app) {
  auto o = std::make_shared<TableOptions>();
  CLI::App* cmd = app.add_subcommand(
      "table",
      "print results as a Markdown table: a sweep's (mean +- std over seeds per row and column setting) or run logs' "
      "(a row per log, a column per metric)");
  cmd->add_option("inputs", o->inputs, "a sweep directory or its sweep.h5; or run logs")->required()->type_name("SWEEP|RUN.h5...");
  cmd->add_option("--rows", o->rows, "a sweep: the key (or prefix, e.g. data) whose settings make the rows");
  cmd->add_option("--cols", o->cols, "a sweep: the key (or prefix) whose settings make the columns");
  cmd->add_option("--metric", o->metrics,
                  "a sweep: the metric (default: the sweep's); run logs: a column, repeatable: METRIC (its last value), "
                  "METRIC@ROUND, METRIC@lastK (mean of the last k values), METRIC@OTHER>=X (its value at the first round "
                  "where OTHER >= X, or <=: time/simulated_s@eval/accuracy>=0.8), a trailing % for percent "
                  "(default eval/accuracy%)")
      ->type_name("NAME");
  cmd->add_option("--where", o->where, "a sweep: only trials with this setting, e.g. algorithm.name=fedavg; repeatable")
      ->type_name("KEY=VALUE");
  cmd->add_option("--scale", o->scale, "a sweep: multiply values by this (100: percent)");
  cmd->add_flag("--minutes", o->minutes,
                "a sweep: each cell shows the wall time in minutes of the trials of the setting the metric picks "
                "(mean +- std over seeds; attempts cut off included)");
  return {cmd, [o] { return table_command(*o); }};
}

}  // namespace fax::cli
