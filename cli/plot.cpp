#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include <fax/config.h>
#include <fax/error.h>
#include <fax/report.h>
#include <fax/run_log.h>
#include <fax/sweep.h>

#include "commands.h"

namespace fax::cli {
namespace {
namespace fs = std::filesystem;

struct Run {
  std::string path;
  std::vector<std::pair<std::string, std::string>> settings;
};

// The run logs behind the arguments: a sweep index stands for its finished trials.
std::vector<Run> collect_runs(const std::vector<std::string>& files) {
  std::vector<Run> runs;
  for (const auto& file : files) {
    std::vector<std::string> paths{file};
    if (SweepIndex::is_index(file)) {
      paths.clear();
      const SweepIndex index = SweepIndex::read(file);
      for (const auto& t : index.trials) {
        if (t.status == "done") paths.push_back((fs::path(file).parent_path() / (t.name + ".h5")).string());
      }
      if (paths.empty()) warn(file + ": no finished trial to plot");
    }
    for (const auto& path : paths) {
      const RunLogReader log(path);
      runs.push_back({path, Config::from_yaml(log.config(), path + ":/config").settings()});
    }
  }
  FAX_CHECK(!runs.empty(), "nothing to plot: no run log among {}", fmt::join(files, ", "));
  return runs;
}

const std::string* find_setting(const Run& run, const std::string& key) {
  for (const auto& [name, value] : run.settings)
    if (name == key) return &value;
  return nullptr;
}

// A legend label per run: the settings that differ between the runs (the executor count never
// changes a result, so it is left out); the file name when nothing differs.
std::vector<std::string> labels(const std::vector<Run>& runs) {
  std::vector<std::string> out(runs.size());
  // The seed goes last: curves are told apart by their settings first.
  std::vector<std::pair<std::string, std::string>> keys = runs.front().settings;
  std::stable_partition(keys.begin(), keys.end(), [](const auto& s) { return s.first != "seed"; });
  for (const auto& [key, value] : keys) {
    if (key == "execution.executors") continue;
    bool differs = false;
    for (const auto& run : runs) {
      const std::string* v = find_setting(run, key);
      differs |= v == nullptr || *v != value;
    }
    if (!differs) continue;
    for (size_t i = 0; i < runs.size(); ++i) {
      const std::string* v = find_setting(runs[i], key);
      out[i] += fmt::format("{}{}={}", out[i].empty() ? "" : " ", key, v == nullptr ? "-" : *v);
    }
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    if (out[i].empty()) out[i] = fs::path(runs[i].path).stem().string();
  }
  return out;
}

}  // namespace

int plot_command(const PlotOptions& options) {
  const std::vector<Run> runs = collect_runs(options.runs);
  const std::vector<std::string> names = labels(runs);
  std::vector<Series> series;
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunLogReader log(runs[i].path);
    const std::vector<std::string> metrics = log.metric_names();
    FAX_CHECK(std::find(metrics.begin(), metrics.end(), options.metric) != metrics.end(),
              "{}: no metric '{}' (it has: {})", runs[i].path, options.metric, fmt::join(metrics, ", "));
    Series s{names[i], {}, log.metric(options.metric)};
    for (int64_t r : log.rounds()) s.x.push_back(static_cast<double>(r));
    series.push_back(std::move(s));
  }
  ChartOptions chart;
  chart.title = options.title.empty() ? options.metric : options.title;
  chart.y_label = options.metric;
  chart.log_y = options.log_y;
  chart.width = options.width;
  chart.height = options.height;
  const std::string svg = svg_line_chart(series, chart);
  std::ofstream out(options.output);
  out << svg;
  out.close();
  FAX_CHECK(out.good(), "{}: cannot write the chart (is the directory writable?)", options.output);
  std::printf("wrote %s: %s of %zu run%s\n", options.output.c_str(), options.metric.c_str(), runs.size(),
              runs.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace fax::cli
