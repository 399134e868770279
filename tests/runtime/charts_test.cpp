#include <cmath>
#include <regex>

#include <fax/base/error.h>
#include <fax/tools/charts.h>

#include "helpers.h"

namespace fax {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(SparklineTest, RisesWithTheValuesAndSkipsNaN) {
  EXPECT_EQ(sparkline({0, 1, 2, 3, 4, 5, 6, 7}), "▁▂▃▄▅▆▇█");
  EXPECT_EQ(sparkline({7, NAN, 0}), "█▁");
  EXPECT_EQ(sparkline({2, 2, 2}), "▅▅▅");
  EXPECT_EQ(sparkline({NAN}), "");
  // 100 values in 10 bins: means 4.5, 14.5, ..., 94.5, i.e. k/9 of the range, block floor(8k/9).
  std::vector<double> ramp;
  for (int i = 0; i < 100; ++i) ramp.push_back(i);
  EXPECT_EQ(sparkline(ramp, 10), "▁▁▂▃▄▅▆▇██");
}

TEST(NiceTicksTest, OneTwoFiveStepsCoveringTheRange) {
  EXPECT_EQ(nice_ticks(0, 1, 6), (std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}));
  const auto t = nice_ticks(3, 297, 8);  // rough step 42 -> 50
  EXPECT_DOUBLE_EQ(t.front(), 0);
  EXPECT_DOUBLE_EQ(t.back(), 300);
  EXPECT_DOUBLE_EQ(t[1] - t[0], 50);
  const auto n = nice_ticks(-0.013, 0.021, 5);  // rough 0.0085 -> 0.01
  EXPECT_NEAR(n.front(), -0.02, 1e-12);
  EXPECT_NEAR(n.back(), 0.03, 1e-12);
  EXPECT_EQ(nice_ticks(1, 4, 8, 1), (std::vector<double>{1, 2, 3, 4}));  // whole steps only
  const auto flat = nice_ticks(0.5, 0.5, 6);
  EXPECT_LT(flat.front(), 0.5);
  EXPECT_GT(flat.back(), 0.5);
}

TEST(SvgChartTest, DrawsALinePerSeriesWithLegendAndLabels) {
  const std::vector<Series> series{{"lr=0.1 <a&b>", {1, 2, 3, 4}, {0.1, NAN, 0.5, 0.7}},
                                   {"lr=1", {1, 2, 3, 4}, {0.2, 0.4, 0.6, 0.8}}};
  ChartOptions options;
  options.title = "eval/accuracy";
  options.y_label = "eval/accuracy";
  const std::string svg = svg_line_chart(series, options);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_THAT(svg, HasSubstr("</svg>"));
  EXPECT_EQ(count(svg, "<polyline"), 2u);
  EXPECT_EQ(count(svg, "<circle"), 7u);  // the NaN is skipped
  EXPECT_THAT(svg, HasSubstr(">lr=0.1 &lt;a&amp;b&gt;</text>"));
  EXPECT_THAT(svg, HasSubstr(">lr=1</text>"));
  EXPECT_THAT(svg, HasSubstr("class=\"axis-label x\""));
  EXPECT_THAT(svg, HasSubstr(">round</text>"));
  EXPECT_THAT(svg, HasSubstr("rotate(-90)"));
  // y from 0.1 to 0.8: ticks 0.0 .. 0.8 step 0.2; x (whole rounds) 1 .. 4 step 1.
  EXPECT_THAT(svg, HasSubstr(">0.0</text>"));
  EXPECT_THAT(svg, HasSubstr(">0.8</text>"));
  EXPECT_THAT(svg, HasSubstr(">4</text>"));
  EXPECT_THAT(svg, Not(HasSubstr(">1.5</text>")));
  // The plot area spans x 72..780 and y 424 (0.0) .. 44 (0.8): (1, 0.2) -> (72, 329), (4, 0.8) -> (780, 44).
  EXPECT_THAT(svg, HasSubstr("points=\"72.0,329.0 308.0,234.0 544.0,139.0 780.0,44.0\""));
}

TEST(SvgChartTest, SeriesMayShareAColourAndDifferInDash) {
  Series a{"lr=1 seed=0", {1, 2}, {1, 2}}, b{"lr=1 seed=1", {1, 2}, {2, 3}};
  a.colour = b.colour = 3;
  a.dash = 0;
  b.dash = 1;
  const std::string svg = svg_line_chart({a, b}, ChartOptions{});
  EXPECT_EQ(count(svg, "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points"), 1u);
  EXPECT_EQ(count(svg, "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" stroke-dasharray=\"6,3\""), 1u);
}

TEST(SvgChartTest, LogScaleSkipsNonPositiveValuesAndLabelsDecades) {
  ChartOptions options;
  options.log_y = true;
  options.y_label = "train/loss";
  const std::string svg = svg_line_chart({{"a", {1, 2, 3}, {1000, 0, 0.01}}}, options);
  EXPECT_EQ(count(svg, "<circle"), 2u);
  EXPECT_THAT(svg, HasSubstr(">0.01</text>"));
  EXPECT_THAT(svg, HasSubstr(">1000</text>"));
  EXPECT_THAT(svg, HasSubstr("train/loss (log scale)"));
  EXPECT_THROW(svg_line_chart({{"a", {1}, {-1}}}, options), Error);
  EXPECT_THROW(svg_line_chart({{"a", {1, 2}, {NAN, NAN}}}, ChartOptions{}), Error);
}

}  // namespace
}  // namespace fax
