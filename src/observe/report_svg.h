#pragma once
// Line charts as inline SVG for report.html: axes, nice tick labels, title, units, legend.
#include <string>
#include <utility>
#include <vector>

namespace athanor::observe {

struct ChartSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y); a non-finite y breaks the line
  std::string color;                              // CSS colour
  bool dashed = false;
};

struct ChartSpec {
  std::string title;
  std::string x_label;  // with unit, e.g. "step"
  std::string y_label;  // with unit, e.g. "loss (nats/target)"
  bool log_y = false;   // log10 axis (values <= 0 are left out)
  bool y_from_zero = false;  // linear axis that starts at 0 (amounts: memory, time)
  bool log_x = false;   // log10 x axis (values <= 0 are left out), e.g. a learning rate
};

// A self-contained <svg> element; text is HTML-escaped. With no finite point, a note says so.
std::string svg_line_chart(const ChartSpec& spec, const std::vector<ChartSeries>& series);

// A heat map: one row per name, one column per x (e.g. a step), colour by value on a
// diverging scale centred at `mid` (white), blue below and red above, clamped to [lo, hi];
// non-finite cells are grey. With a colour bar and, per row, the name.
struct HeatMapSpec {
  std::string title;
  std::string x_label;      // "step"
  std::string value_label;  // "log10(update / weight)"
  double lo = -6, mid = -3, hi = 0;
};
std::string svg_heat_map(const HeatMapSpec& spec, const std::vector<std::string>& rows, const std::vector<double>& xs,
                         const std::vector<std::vector<double>>& values);  // values[row][col]

std::string html_escape(const std::string& s);
// Ticks at 1, 2 or 5 times a power of ten covering [lo, hi] (about `target` of them).
std::vector<double> nice_ticks(double lo, double hi, int target);

}  // namespace athanor::observe
