// svg_heat_map (report_svg.h): per-layer statistics over the steps as coloured cells.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "observe/report_svg.h"

namespace athanor::observe {
namespace {
std::string f1(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}
// White at mid, blue (below) and red (above) at the ends.
std::string colour(double v, const HeatMapSpec& s) {
  if (!std::isfinite(v)) return "#cccccc";
  const double t = v < s.mid ? -std::min(1.0, (s.mid - v) / std::max(s.mid - s.lo, 1e-12))
                             : std::min(1.0, (v - s.mid) / std::max(s.hi - s.mid, 1e-12));
  int r = 255, g = 255, b = 255;
  if (t < 0) r = g = static_cast<int>(255 * (1 + t) + 40 * -t), b = 255;
  else g = b = static_cast<int>(255 * (1 - t) + 30 * t), r = 255 - static_cast<int>(40 * t);
  char buf[16];
  std::snprintf(buf, sizeof(buf), "#%02x%02x%02x", std::clamp(r, 0, 255), std::clamp(g, 0, 255), std::clamp(b, 0, 255));
  return buf;
}
}  // namespace

std::string svg_heat_map(const HeatMapSpec& spec, const std::vector<std::string>& rows, const std::vector<double>& xs,
                         const std::vector<std::vector<double>>& values) {
  const double left = 300, right = 110, top = 40, bottom = 50, W = 1100;
  const double row_h = std::clamp(360.0 / std::max<size_t>(1, rows.size()), 8.0, 22.0);
  const double H = top + bottom + row_h * static_cast<double>(std::max<size_t>(1, rows.size()));
  const double pw = W - left - right;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart heatmap\" width=\"" << W << "\" height=\"" << f1(H) << "\" viewBox=\"0 0 "
    << W << " " << f1(H) << "\" role=\"img\" aria-label=\"" << html_escape(spec.title) << "\">\n"
    << "<rect x=\"0\" y=\"0\" width=\"" << W << "\" height=\"" << f1(H) << "\" fill=\"#fff\"/>\n"
    << "<text class=\"title\" x=\"" << W / 2 << "\" y=\"24\" text-anchor=\"middle\">" << html_escape(spec.title) << "</text>\n";
  if (rows.empty() || xs.empty()) {
    o << "<text x=\"" << W / 2 << "\" y=\"" << f1(H / 2 + 10) << "\" text-anchor=\"middle\" fill=\"#888\">no per-layer statistics recorded</text>\n</svg>\n";
    return o.str();
  }
  const double cw = pw / static_cast<double>(xs.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const double y = top + row_h * static_cast<double>(r);
    o << "<text x=\"" << left - 6 << "\" y=\"" << f1(y + row_h * 0.75) << "\" text-anchor=\"end\" font-size=\""
      << f1(std::min(12.0, row_h * 0.9)) << "\">" << html_escape(rows[r]) << "</text>\n";
    for (size_t c = 0; c < xs.size(); ++c) {
      const double v = r < values.size() && c < values[r].size() ? values[r][c] : std::nan("");
      o << "<rect x=\"" << f1(left + cw * static_cast<double>(c)) << "\" y=\"" << f1(y) << "\" width=\"" << f1(cw + 0.5)
        << "\" height=\"" << f1(row_h + 0.5) << "\" fill=\"" << colour(v, spec) << "\"><title>" << html_escape(rows[r]) << " @ "
        << xs[c] << ": " << (std::isfinite(v) ? f1(v) : std::string("n/a")) << "</title></rect>\n";
    }
  }
  // x labels: about 8 of the columns
  const size_t every = std::max<size_t>(1, xs.size() / 8);
  for (size_t c = 0; c < xs.size(); c += every) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f", xs[c]);
    o << "<text x=\"" << f1(left + cw * (static_cast<double>(c) + 0.5)) << "\" y=\"" << f1(H - bottom + 16)
      << "\" text-anchor=\"middle\" font-size=\"12\">" << buf << "</text>\n";
  }
  o << "<text x=\"" << left + pw / 2 << "\" y=\"" << f1(H - 10) << "\" text-anchor=\"middle\" font-size=\"12\">" << html_escape(spec.x_label)
    << "</text>\n";
  // colour bar
  const double bx = W - right + 20, bh = std::max(60.0, H - top - bottom);
  for (int i = 0; i < 20; ++i) {
    const double v = spec.hi - (spec.hi - spec.lo) * (i + 0.5) / 20;
    o << "<rect x=\"" << bx << "\" y=\"" << f1(top + bh * i / 20) << "\" width=\"16\" height=\"" << f1(bh / 20 + 0.5) << "\" fill=\""
      << colour(v, spec) << "\"/>\n";
  }
  for (double v : {spec.hi, spec.mid, spec.lo})
    o << "<text x=\"" << bx + 22 << "\" y=\"" << f1(top + bh * (spec.hi - v) / (spec.hi - spec.lo) + 4) << "\" font-size=\"11\">" << f1(v)
      << "</text>\n";
  o << "<text transform=\"translate(" << W - 8 << "," << f1(top + bh / 2) << ") rotate(-90)\" text-anchor=\"middle\" font-size=\"11\">"
    << html_escape(spec.value_label) << "</text>\n</svg>\n";
  return o.str();
}

}  // namespace athanor::observe
