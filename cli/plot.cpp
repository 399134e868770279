#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include <fax/base/config.h>
#include <fax/base/error.h>
#include <fax/io/config_yaml.h>
#include <fax/io/files.h>
#include <fax/io/run_log.h>
#include <fax/tools/charts.h>
#include <fax/tools/sweep.h>

#include "commands.h"
#include "options.h"

namespace fax::cli {
namespace {
namespace fs = std::filesystem;

struct Run {
  std::string path;
  RunLogReader log;
  /// What tells it apart: a sweep trial's overrides, or a run log's whole resolved config.
  std::vector<std::pair<std::string, std::string>> settings;
};

// The run logs behind the arguments: a sweep index stands for its finished trials.
std::vector<Run> collect_runs(const std::vector<std::string>& files) {
  std::vector<Run> runs;
  for (const auto& file : files) {
    if (!SweepIndex::is_index(file)) {
      RunLogReader log(file);
      const auto settings = parse_config(log.config(), file + ":/config").settings();
      runs.push_back({file, std::move(log), settings});
      continue;
    }
    const SweepIndex index = SweepIndex::read(file);
    const size_t before = runs.size();
    for (const auto& t : index.trials) {
      if (t.status != "done") continue;
      const std::string path = (fs::path(file).parent_path() / (t.name + ".h5")).string();
      runs.push_back({path, RunLogReader(path), t.overrides});
    }
    if (runs.size() == before) warn(file + ": no finished trial to plot");
  }
  FAX_CHECK(!runs.empty(), "nothing to plot: no run log among {}", fmt::join(files, ", "));
  return runs;
}

const std::string* find_setting(const Run& run, const std::string& key) {
  for (const auto& [name, value] : run.settings)
    if (name == key) return &value;
  return nullptr;
}

struct Legend {
  std::string label;
  std::string setting;  ///< the label without the seed: one colour per setting
  std::string seed;
};

// A legend entry per run: the settings that differ between the runs, in first-seen order with the
// seed last (the executor count never changes a result, so it is left out); the file name when
// nothing differs.
std::vector<Legend> legends(const std::vector<Run>& runs) {
  std::vector<std::string> keys;
  for (const auto& run : runs)
    for (const auto& s : run.settings)
      if (std::find(keys.begin(), keys.end(), s.first) == keys.end()) keys.push_back(s.first);
  std::stable_partition(keys.begin(), keys.end(), [](const std::string& k) { return k != "seed"; });
  std::vector<Legend> out(runs.size());
  for (const auto& key : keys) {
    if (key == "execution.executors") continue;
    const std::string* first = find_setting(runs.front(), key);
    bool differs = false;
    for (const auto& run : runs) {
      const std::string* v = find_setting(run, key);
      differs |= (v == nullptr) != (first == nullptr) || (v != nullptr && *v != *first);
    }
    if (!differs) continue;
    for (size_t i = 0; i < runs.size(); ++i) {
      const std::string* v = find_setting(runs[i], key);
      if (v == nullptr) continue;
      Legend& l = out[i];
      l.label += fmt::format("{}{}={}", l.label.empty() ? "" : " ", key, *v);
      if (key == "seed") l.seed = *v;
      else l.setting = l.label;
    }
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    if (out[i].label.empty()) out[i].label = out[i].setting = fs::path(runs[i].path).stem().string();
  }
  return out;
}

constexpr const char* kSimulatedTime = "time/simulated_s";

}  // namespace

int plot_command(const PlotOptions& options) {
  const std::vector<Run> runs = collect_runs(options.runs);
  std::vector<std::string> inputs = options.runs;
  for (const auto& run : runs) inputs.push_back(run.path);
  const std::string output = resolve_output(options.output);
  check_output_path(output, inputs, "the chart");
  const std::vector<Legend> legend = legends(runs);
  // Repeats of a setting over seeds share its colour and differ in dash.
  std::vector<std::string> settings;
  std::vector<Series> series;
  const bool by_time = options.x == "time";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunLogReader& log = runs[i].log;
    const std::vector<std::string> metrics = log.metric_names();
    FAX_CHECK(std::find(metrics.begin(), metrics.end(), options.metric) != metrics.end(),
              "{}: no metric '{}' (it has: {})", runs[i].path, options.metric, fmt::join(metrics, ", "));
    FAX_CHECK(!by_time || std::find(metrics.begin(), metrics.end(), kSimulatedTime) != metrics.end(),
              "{}: --x time needs the metric {}; the run had no simulated clock (clients.speed.distribution)",
              runs[i].path, kSimulatedTime);
    Series s{legend[i].label, {}, log.metric(options.metric)};
    auto it = std::find(settings.begin(), settings.end(), legend[i].setting);
    s.colour = static_cast<int>(it - settings.begin());
    if (it == settings.end()) settings.push_back(legend[i].setting);
    s.dash = 0;
    for (size_t j = 0; j < i; ++j) s.dash += legend[j].setting == legend[i].setting;
    if (by_time) {
      s.x = log.metric(kSimulatedTime);
    } else {
      for (int64_t r : log.rounds()) s.x.push_back(static_cast<double>(r));
    }
    series.push_back(std::move(s));
  }
  ChartOptions chart;
  if (by_time) {
    // Seconds, minutes or hours, whichever keeps the axis' numbers readable.
    double longest = 0;
    for (const Series& s : series)
      for (double x : s.x) longest = std::max(longest, x);
    const auto [unit, per] = longest >= 7200 ? std::pair("h", 3600.0) : longest >= 120 ? std::pair("min", 60.0)
                                                                                        : std::pair("s", 1.0);
    for (Series& s : series)
      for (double& x : s.x) x /= per;
    chart.x_label = fmt::format("simulated time ({})", unit);
  }
  chart.title = options.title.empty() ? options.metric : options.title;
  chart.y_label = options.metric;
  chart.log_y = options.log_y;
  chart.width = options.width;
  chart.height = options.height;
  const std::string svg = svg_line_chart(series, chart);
  write_file_atomically(output, svg);
  std::printf("wrote %s: %s of %zu run%s\n", output.c_str(), options.metric.c_str(), runs.size(),
              runs.size() == 1 ? "" : "s");
  return 0;
}

Subcommand add_plot_subcommand(CLI::App& app) {
  auto o = std::make_shared<PlotOptions>();
  CLI::App* cmd = app.add_subcommand("plot", "draw a metric of run logs (or of a sweep's trials) as an SVG line chart");
  cmd->add_option("runs", o->runs, "run logs, or sweep indexes (<dir>/sweep.h5: every finished trial)")
      ->required()->type_name("FILE.h5...");
  cmd->add_option("--metric", o->metric, "the metric to draw (default: eval/accuracy)")->type_name("NAME");
  cmd->add_option("--x", o->x, "the x axis: round (default), or time: the simulated time of runs with a clock")
      ->check(CLI::IsMember({"round", "time"}));
  cmd->add_option("-o,--output", o->output, "the SVG file to write (default: plot.svg)")->type_name("OUT.svg");
  cmd->add_option("--title", o->title, "the chart's title (default: the metric)");
  cmd->add_flag("--log-y", o->log_y, "logarithmic y axis");
  cmd->add_option("--width", o->width, "plot width in pixels, without the legend")->check(CLI::Range(200, 10000));
  cmd->add_option("--height", o->height, "plot height in pixels")->check(CLI::Range(150, 10000));
  return {cmd, [o] { return plot_command(*o); }};
}

}  // namespace fax::cli
