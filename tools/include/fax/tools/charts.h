#pragma once

#include <string>
#include <vector>

namespace fax {

/// A one-line chart of `values` in Unicode blocks (▁ to █), at most `width` characters, each the
/// mean of its share of the values; NaNs are skipped. Empty when no value is finite.
std::string sparkline(const std::vector<double>& values, size_t width = 40);

/// About `count` evenly spaced round numbers (1, 2 or 5 times a power of ten apart) covering
/// [low, high]: the first tick is at or below `low`, the last at or above `high`. The step is at
/// least `min_step` (1 for whole rounds).
std::vector<double> nice_ticks(double low, double high, int count = 6, double min_step = 0);

/// One line of a chart; points whose y is NaN (rounds without an evaluation) are skipped.
struct Series {
  std::string label;
  std::vector<double> x;
  std::vector<double> y;
  int colour = -1;  ///< index into the palette; -1: the series' position
  int dash = -1;    ///< 0 solid, 1.. dashed patterns; -1: solid for the first palette round, then dashed
};

struct ChartOptions {
  std::string title;
  std::string x_label = "round";
  std::string y_label;
  bool log_y = false;  ///< points with y <= 0 are skipped
  int width = 800;     ///< the plot, without the legend to its right
  int height = 480;
};

/// A self-contained SVG line chart: a line per series in a distinct colour, markers when a line
/// has few points, gridlines, labelled axes, a title and a legend. Throws fax::Error when no
/// series has a point to draw.
std::string svg_line_chart(const std::vector<Series>& series, const ChartOptions& options);

}  // namespace fax
