#include <fax/tools/charts.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <fax/base/error.h>

namespace fax {
namespace {

std::string xml_escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// Enough decimals to tell ticks `step` apart, and no more.
std::string tick_label(double value, double step) {
  if (std::abs(value) < step * 1e-9) value = 0;
  const double magnitude = std::max(std::abs(value), step);
  if (magnitude >= 1e6 || magnitude < 1e-4) return fmt::format("{:.3g}", value);
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", value, decimals);
}

// Tab10, the palette most plotting tools default to: distinct, and readable for most colour vision.
constexpr const char* kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr const char* kDashes[] = {"", "6,3", "2,2", "8,3,2,3"};

struct Range {
  double low = std::numeric_limits<double>::infinity();
  double high = -std::numeric_limits<double>::infinity();
  void add(double v) {
    low = std::min(low, v);
    high = std::max(high, v);
  }
  bool empty() const { return low > high; }
};

// Ticks of a log10 axis in log10 units: whole decades, with 2 and 5 between them on a short axis.
std::vector<double> log_ticks(double low, double high) {
  std::vector<double> ticks;
  const double first = std::floor(low), last = std::max(std::ceil(high), first + 1);
  const bool subdivide = last - first <= 2;
  for (double d = first; d <= last; ++d) {
    ticks.push_back(d);
    if (subdivide && d < last) {
      ticks.push_back(d + std::log10(2.0));
      ticks.push_back(d + std::log10(5.0));
    }
  }
  return ticks;
}

}  // namespace

std::string sparkline(const std::vector<double>& values, size_t width) {
  std::vector<double> finite;
  for (double v : values)
    if (std::isfinite(v)) finite.push_back(v);
  if (finite.empty() || width == 0) return "";
  const size_t bins = std::min(width, finite.size());
  std::vector<double> means(bins);
  for (size_t b = 0; b < bins; ++b) {
    const size_t begin = b * finite.size() / bins, end = (b + 1) * finite.size() / bins;
    double sum = 0;
    for (size_t i = begin; i < end; ++i) sum += finite[i];
    means[b] = sum / static_cast<double>(end - begin);
  }
  static const char* blocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  const auto [low, high] = std::minmax_element(means.begin(), means.end());
  std::string out;
  for (double m : means) {
    const double t = *high > *low ? (m - *low) / (*high - *low) : 0.5;
    out += blocks[std::min(7, static_cast<int>(t * 8))];
  }
  return out;
}

std::vector<double> nice_ticks(double low, double high, int count, double min_step) {
  FAX_ASSERT(std::isfinite(low) && std::isfinite(high) && low <= high && count >= 2, "nice_ticks({}, {}, {})", low, high,
             count);
  if (high - low < 1e-12 * std::max(1.0, std::abs(high))) {
    // A flat line: a unit-sized window around it.
    const double pad = std::abs(low) > 0 ? std::abs(low) * 0.1 : 1;
    low -= pad;
    high += pad;
  }
  const double rough = (high - low) / (count - 1);
  const double power = std::pow(10.0, std::floor(std::log10(rough)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * power;
    if (step >= rough) break;
  }
  step = std::max(step, min_step);
  std::vector<double> ticks;
  const double first = std::floor(low / step + 1e-9) * step;
  for (double t = first; t < high + step * (1 - 1e-9); t += step) ticks.push_back(t);
  if (ticks.back() < high - step * 1e-9) ticks.push_back(ticks.back() + step);
  return ticks;
}

std::string svg_line_chart(const std::vector<Series>& series, const ChartOptions& options) {
  auto y_of = [&](double v) { return options.log_y ? std::log10(v) : v; };
  auto drawable = [&](double x, double y) { return std::isfinite(x) && std::isfinite(y) && (!options.log_y || y > 0); };
  Range xs, ys;
  size_t longest_label = 0;
  for (const auto& s : series) {
    FAX_ASSERT(s.x.size() == s.y.size(), "series '{}': {} x for {} y", s.label, s.x.size(), s.y.size());
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!drawable(s.x[i], s.y[i])) continue;
      xs.add(s.x[i]);
      ys.add(y_of(s.y[i]));
    }
    longest_label = std::max(longest_label, s.label.size());
  }
  FAX_CHECK(!xs.empty(), "nothing to plot: no series has a finite{} value", options.log_y ? " positive" : "");

  bool whole_x = true;
  for (const auto& s : series)
    for (double x : s.x) whole_x &= !std::isfinite(x) || x == std::floor(x);
  const std::vector<double> xt = nice_ticks(xs.low, xs.high, 8, whole_x ? 1 : 0);
  const std::vector<double> yt = options.log_y ? log_ticks(ys.low, ys.high) : nice_ticks(ys.low, ys.high, 6);
  const double x0 = xt.front(), x1 = xt.back(), y0 = yt.front(), y1 = yt.back();
  // Plot area inside the chart; the legend sits to its right, sized by its longest label (~7 px a character).
  const double left = 72, top = options.title.empty() ? 20 : 44, right = options.width - 20.0,
               bottom = options.height - 56.0;
  const int legend_width = static_cast<int>(std::min<size_t>(longest_label, 80) * 7 + 48);
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (right - left); };
  auto py = [&](double y) { return bottom - (y - y0) / (y1 - y0) * (bottom - top); };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1:.0f}\" viewBox=\"0 0 {0} {1:.0f}\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      options.width + legend_width, std::max<double>(options.height, top + 20 + 20.0 * static_cast<double>(series.size())));
  if (!options.title.empty()) {
    svg += fmt::format("<text x=\"{:.1f}\" y=\"26\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">{}</text>\n",
                       (left + right) / 2, xml_escape(options.title));
  }
  for (double t : xt) {
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#e0e0e0\"/>\n"
                       "<text class=\"tick x\" x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4}</text>\n",
                       px(t), top, bottom, bottom + 18, tick_label(t, xt[1] - xt[0]));
  }
  for (double t : yt) {
    const std::string label = options.log_y ? tick_label(std::pow(10.0, t), std::pow(10.0, std::floor(t + 1e-9)))
                                            : tick_label(t, yt[1] - yt[0]);
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#e0e0e0\"/>\n"
                       "<text class=\"tick y\" x=\"{3:.1f}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
                       left, py(t), right, left - 6, py(t) + 4, label);
  }
  svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#333\"/>\n",
                     left, top, right - left, bottom - top);
  svg += fmt::format("<text class=\"axis-label x\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n",
                     (left + right) / 2, bottom + 42.0, xml_escape(options.x_label));
  svg += fmt::format("<text class=\"axis-label y\" transform=\"translate(18 {:.1f}) rotate(-90)\" text-anchor=\"middle\" "
                     "font-size=\"14\">{}{}</text>\n",
                     (top + bottom) / 2, xml_escape(options.y_label), options.log_y ? " (log scale)" : "");

  for (size_t k = 0; k < series.size(); ++k) {
    const Series& s = series[k];
    const size_t colour_index = s.colour >= 0 ? static_cast<size_t>(s.colour) : k;
    const char* colour = kColours[colour_index % 10];
    const char* dash = kDashes[(s.dash >= 0 ? static_cast<size_t>(s.dash) : k / 10) % 4];
    const std::string dash_attr = *dash ? fmt::format(" stroke-dasharray=\"{}\"", dash) : "";
    std::string points;
    size_t n = 0;
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!drawable(s.x[i], s.y[i])) continue;
      points += fmt::format("{}{:.1f},{:.1f}", n++ ? " " : "", px(s.x[i]), py(y_of(s.y[i])));
    }
    svg += fmt::format("<g class=\"series\"><title>{}</title>\n", xml_escape(s.label));
    svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{} points=\"{}\"/>\n", colour, dash_attr, points);
    if (n <= 60) {
      for (size_t i = 0; i < s.x.size(); ++i) {
        if (!drawable(s.x[i], s.y[i])) continue;
        svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", px(s.x[i]), py(y_of(s.y[i])), colour);
      }
    }
    svg += "</g>\n";
    const double ly = top + 10 + 20.0 * static_cast<double>(k);
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"{3}\" stroke-width=\"2\"{4}/>\n"
                       "<text class=\"legend\" x=\"{5:.1f}\" y=\"{6:.1f}\">{7}</text>\n",
                       right + 14, ly, right + 38, colour, dash_attr, right + 44, ly + 4, xml_escape(s.label));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace fax
