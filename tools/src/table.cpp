#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include <fax/base/error.h>
#include <fax/io/run_log.h>
#include <fax/tools/sweep.h>

namespace fax {
namespace {

bool under(const std::string& key, const std::string& prefix) {
  return key == prefix || key.rfind(prefix + ".", 0) == 0;
}

// The overrides of `trial` under `prefix` ("under") or under neither prefix nor seed ("rest"), as
// "key=value" with the prefix's own part dropped, joined by ", ".
std::string label(const std::vector<Override>& overrides, const std::string& prefix, bool rest, const std::string& other) {
  std::vector<std::string> parts;
  for (const auto& [key, value] : overrides) {
    const bool mine = rest ? !under(key, prefix) && !under(key, other) && key != "seed" : under(key, prefix);
    if (!mine) continue;
    const std::string shown = rest ? key.substr(key.rfind('.') + 1) : key == prefix ? key : key.substr(prefix.size() + 1);
    parts.push_back(shown + "=" + value);
  }
  if (!rest && parts.size() == 1) return parts[0].substr(parts[0].find('=') + 1);  // one key: its value
  return fmt::format("{}", fmt::join(parts, ", "));
}

// A column of runs_table: "name", "name@round", "name@lastK" or "name@other>=x" (or <=), then an
// optional "%".
struct Column {
  std::string metric;
  int64_t round = 0;  // > 0: the value at this round
  int64_t last = 1;   // else the mean of the last `last` finite values
  std::string reach;  // else, when set: the value at the first round where `reach` >= (<=) `target`
  bool at_least = true;
  double target = 0;
  bool percent = false;
};

constexpr const char* kColumnForms =
    "expected METRIC, METRIC@ROUND, METRIC@lastK or METRIC@OTHER>=X (at the first round where OTHER >= X; or <=), "
    "with an optional % (e.g. eval/accuracy@last4%, time/simulated_s@eval/accuracy>=0.8)";

Column parse_column(const std::string& text) {
  Column c;
  std::string spec = text;
  if (!spec.empty() && spec.back() == '%') {
    c.percent = true;
    spec.pop_back();
  }
  const size_t at = spec.find('@');
  c.metric = spec.substr(0, at);
  const auto positive = [&](const std::string& digits) {
    FAX_CHECK(!digits.empty() && digits.size() < 10 && std::all_of(digits.begin(), digits.end(), ::isdigit) &&
                  std::stoll(digits) > 0,
              "table column '{}': {}", text, kColumnForms);
    return std::stoll(digits);
  };
  if (at != std::string::npos) {
    const std::string when = spec.substr(at + 1);
    const size_t op = std::min(when.find(">="), when.find("<="));
    if (op != std::string::npos) {
      c.reach = when.substr(0, op);
      c.at_least = when[op] == '>';
      const std::string x = when.substr(op + 2);
      char* end = nullptr;
      c.target = std::strtod(x.c_str(), &end);
      FAX_CHECK(!c.reach.empty() && !x.empty() && end == x.c_str() + x.size() && std::isfinite(c.target),
                "table column '{}': {}", text, kColumnForms);
    } else if (when.rfind("last", 0) == 0) {
      c.last = positive(when.substr(4));
    } else {
      c.round = positive(when);
    }
  }
  FAX_CHECK(!c.metric.empty(), "table column '{}': names no metric", text);
  return c;
}

double column_value(const RunLogReader& log, const std::vector<int64_t>& rounds, const Column& c) {
  const double none = std::numeric_limits<double>::quiet_NaN();
  // The round numbers are a metric too (round@eval/accuracy>=0.8: the round that reached it).
  const auto metric = [&](const std::string& name) {
    return name == "round" ? std::vector<double>(rounds.begin(), rounds.end()) : log.metric(name);
  };
  if (!log.has("/metrics/" + c.metric)) return none;
  const std::vector<double> values = metric(c.metric);
  if (!c.reach.empty()) {
    if (!log.has("/metrics/" + c.reach)) return none;
    const std::vector<double> reach = metric(c.reach);
    for (size_t i = 0; i < reach.size() && i < values.size(); ++i) {
      if (c.at_least ? reach[i] >= c.target : reach[i] <= c.target) return values[i];
    }
    return none;
  }
  if (c.round == 0) return mean_of_last(values, c.last);
  const auto it = std::find(rounds.begin(), rounds.end(), c.round);
  return it == rounds.end() ? none : values[static_cast<size_t>(it - rounds.begin())];
}

// Labels in order of first appearance.
void add_once(std::vector<std::string>& order, const std::string& label) {
  if (std::find(order.begin(), order.end(), label) == order.end()) order.push_back(label);
}

}  // namespace

std::string format_duration(double seconds) {
  if (std::round(seconds * 10) < 600) return fmt::format("{:.1f} s", seconds);  // not "60.0 s"
  const auto whole = static_cast<int64_t>(std::llround(seconds));
  if (whole < 3600) return fmt::format("{} min {} s", whole / 60, whole % 60);
  const int64_t minutes = (whole + 30) / 60;
  return fmt::format("{} h {} min", minutes / 60, minutes % 60);
}

std::string sweep_table(const SweepIndex& index, const std::string& rows, const std::string& cols, double scale,
                        bool minutes) {
  FAX_CHECK(!rows.empty() && !cols.empty() && rows != cols, "a table needs two different keys for rows and columns");
  std::vector<std::string> row_order, col_order;
  for (const TrialRecord& t : index.trials) {
    add_once(row_order, label(t.overrides, rows, false, cols));
    add_once(col_order, label(t.overrides, cols, false, rows));
  }
  struct Cell {
    const SettingSummary* best = nullptr;
    std::string variant;
    int settings = 0;
  };
  std::map<std::pair<std::string, std::string>, Cell> cells;
  const std::vector<SettingSummary> summaries = summarize(index);  // best first
  size_t most = 0;
  for (const SettingSummary& s : summaries) {
    const std::vector<Override>& o = index.trials[s.trials.front()].overrides;
    Cell& cell = cells[{label(o, rows, false, cols), label(o, cols, false, rows)}];
    if (cell.best == nullptr) {
      cell.best = &s;
      cell.variant = label(o, rows, true, cols);
    }
    ++cell.settings;
    most = std::max(most, s.trials.size());
  }
  // A cell with no finished trial: "failed" when one of its trials failed (the prose says why), "-"
  // while none has run.
  std::set<std::pair<std::string, std::string>> failed;
  for (const TrialRecord& t : index.trials)
    if (t.status == "failed") failed.insert({label(t.overrides, rows, false, cols), label(t.overrides, cols, false, rows)});
  std::string out = fmt::format("| {} | {} |\n|---|", rows, fmt::join(col_order, " | "));
  for (size_t c = 0; c < col_order.size(); ++c) out += "---|";
  out += "\n";
  for (const std::string& row : row_order) {
    out += "| " + row + " |";
    for (const std::string& col : col_order) {
      const auto it = cells.find({row, col});
      if (it == cells.end()) {
        out += failed.count({row, col}) > 0 ? " failed |" : " - |";
        continue;
      }
      const Cell& cell = it->second;
      double mean = cell.best->mean * scale, spread = cell.best->std * scale;
      if (minutes) {
        std::vector<double> values;
        for (size_t t : cell.best->trials) values.push_back(index.trials[t].seconds / 60);
        std::tie(mean, spread) = mean_and_std(values);
      }
      // One trial has no spread to show.
      out += cell.best->trials.size() > 1 ? fmt::format(" {:.1f} ± {:.1f}", mean, spread) : fmt::format(" {:.1f}", mean);
      if (cell.best->trials.size() < most) out += fmt::format(" (n={})", cell.best->trials.size());
      if (cell.settings > 1) out += fmt::format(" ({})", cell.variant);
      out += " |";
    }
    out += "\n";
  }
  return out;
}

SweepIndex select_trials(const SweepIndex& index, const std::vector<std::string>& where) {
  SweepIndex out = index;
  out.trials.clear();
  std::vector<Override> wanted;
  for (const std::string& w : where) {
    const size_t eq = w.find('=');
    FAX_CHECK(eq != std::string::npos && eq > 0, "--where {}: expected KEY=VALUE", w);
    wanted.emplace_back(w.substr(0, eq), w.substr(eq + 1));
  }
  for (const TrialRecord& t : index.trials) {
    const bool all = std::all_of(wanted.begin(), wanted.end(), [&](const Override& o) {
      return std::find(t.overrides.begin(), t.overrides.end(), o) != t.overrides.end();
    });
    if (all) out.trials.push_back(t);
  }
  FAX_CHECK(!out.trials.empty() || wanted.empty(), "--where {}: no trial of the sweep has these settings",
            fmt::join(where, " "));
  return out;
}

std::string runs_table(const std::vector<std::string>& logs, const std::vector<std::string>& columns) {
  std::vector<Column> parsed;
  for (const std::string& c : columns) parsed.push_back(parse_column(c));
  std::string out = fmt::format("| run | rounds | {} | time in rounds |\n|---|---|", fmt::join(columns, " | "));
  for (size_t c = 0; c < columns.size(); ++c) out += "---|";
  out += "---|\n";
  for (const std::string& path : logs) {
    const RunLogReader log(path);
    const std::vector<int64_t> rounds = log.rounds();
    out += fmt::format("| {} | {} |", std::filesystem::path(path).stem().string(), rounds.empty() ? 0 : rounds.back());
    for (const Column& c : parsed) {
      const double v = column_value(log, rounds, c);
      if (!std::isfinite(v)) out += " - |";
      else if (c.percent) out += fmt::format(" {:.1f}% |", 100 * v);
      else out += fmt::format(" {:.4g} |", v);
    }
    double seconds = 0;
    if (log.has("/metrics/time/round_s")) {
      for (double t : log.metric("time/round_s"))
        if (std::isfinite(t)) seconds += t;
    }
    out += " " + format_duration(seconds) + " |\n";
  }
  return out;
}

}  // namespace fax
