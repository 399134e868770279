#include <algorithm>
#include <cmath>
#include <map>

#include <fax/base/error.h>
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

// Labels in order of first appearance.
void add_once(std::vector<std::string>& order, const std::string& label) {
  if (std::find(order.begin(), order.end(), label) == order.end()) order.push_back(label);
}

}  // namespace

std::string sweep_table(const SweepIndex& index, const std::string& rows, const std::string& cols, double scale) {
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
  std::string out = fmt::format("| {} | {} |\n|---|", rows, fmt::join(col_order, " | "));
  for (size_t c = 0; c < col_order.size(); ++c) out += "---|";
  out += "\n";
  for (const std::string& row : row_order) {
    out += "| " + row + " |";
    for (const std::string& col : col_order) {
      const auto it = cells.find({row, col});
      if (it == cells.end()) {
        out += " - |";
        continue;
      }
      const Cell& cell = it->second;
      out += fmt::format(" {:.1f} ± {:.1f}", cell.best->mean * scale, cell.best->std * scale);
      if (cell.best->trials.size() < most) out += fmt::format(" (n={})", cell.best->trials.size());
      if (cell.settings > 1) out += fmt::format(" ({})", cell.variant);
      out += " |";
    }
    out += "\n";
  }
  return out;
}

}  // namespace fax
