#include "observe/report_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace athanor::observe {

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) {  // one value: a band around it
    const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) { step = m * mag; break; }
  std::vector<double> ticks;
  for (double t = std::floor(lo / step) * step; t <= hi + step * 0.5; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
    if (ticks.size() > 100) break;
  }
  return ticks;
}

namespace {
std::string format_tick(double v) {
  char buf[32];
  const double a = std::abs(v);
  if (v == 0) return "0";
  if (a >= 1e6 || a < 1e-3) std::snprintf(buf, sizeof(buf), "%.3g", v);
  else std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}
// Tick positions (log10 of the values) for a log axis spanning [lo, hi] in log10 units:
// powers of ten over a decade or more, else round values in between.
std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> out;
  if (hi - lo >= 1) {
    const double step = std::max(1.0, std::ceil((std::ceil(hi) - std::floor(lo)) / 6));
    for (double k = std::floor(lo); k <= std::ceil(hi) + 1e-9; k += step) out.push_back(k);
    return out;
  }
  for (double v : nice_ticks(std::pow(10.0, lo), std::pow(10.0, hi), 4))
    if (v > 0) out.push_back(std::log10(v));
  if (out.empty()) out = {lo, hi};
  return out;
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}
}  // namespace

std::string svg_line_chart(const ChartSpec& spec, const std::vector<ChartSeries>& series) {
  constexpr double W = 1100, H = 320, left = 90, right = 190, top = 40, bottom = 55;
  const double pw = W - left - right, ph = H - top - bottom;
  auto ty = [&](double y) { return spec.log_y ? std::log10(y) : y; };
  auto tx = [&](double x) { return spec.log_x ? std::log10(x) : x; };
  auto usable = [&](double y) { return std::isfinite(y) && (!spec.log_y || y > 0); };
  auto usable_x = [&](double x) { return std::isfinite(x) && (!spec.log_x || x > 0); };
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points)
      if (usable_x(x) && usable(y)) {
        xmin = std::min(xmin, tx(x)), xmax = std::max(xmax, tx(x));
        ymin = std::min(ymin, ty(y)), ymax = std::max(ymax, ty(y));
      }
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 "
    << W << " " << H << "\" role=\"img\" aria-label=\"" << html_escape(spec.title) << "\">\n"
    << "<rect x=\"0\" y=\"0\" width=\"" << W << "\" height=\"" << H << "\" fill=\"#fff\"/>\n"
    << "<text class=\"title\" x=\"" << W / 2 << "\" y=\"24\" text-anchor=\"middle\">" << html_escape(spec.title) << "</text>\n";
  if (!std::isfinite(xmin)) {
    o << "<text x=\"" << W / 2 << "\" y=\"" << H / 2 << "\" text-anchor=\"middle\" fill=\"#888\">no finite values recorded</text>\n</svg>\n";
    return o.str();
  }
  if (spec.y_from_zero && !spec.log_y) ymin = std::min(ymin, 0.0);
  const std::vector<double> xt = spec.log_x ? log_ticks(xmin, xmax) : nice_ticks(xmin, xmax, 10), yt = spec.log_y ? log_ticks(ymin, ymax) : nice_ticks(ymin, ymax, 6);
  const double x0 = std::min(xt.front(), xmin), x1 = std::max(xt.back(), xmax);
  const double y0 = std::min(yt.front(), ymin), y1 = std::max(yt.back(), ymax);
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + ph - (y - y0) / (y1 - y0) * ph; };
  // grid, ticks and labels
  o << "<g class=\"axes\" font-size=\"12\" fill=\"#333\">\n";
  for (double t : yt) {
    if (t < y0 || t > y1) continue;
    const std::string label = spec.log_y ? format_tick(std::pow(10.0, t)) : format_tick(t);
    o << "<line x1=\"" << left << "\" x2=\"" << left + pw << "\" y1=\"" << fmt(py(t)) << "\" y2=\"" << fmt(py(t))
      << "\" stroke=\"#e5e5e5\"/><text x=\"" << left - 6 << "\" y=\"" << fmt(py(t) + 4) << "\" text-anchor=\"end\">" << label << "</text>\n";
  }
  for (double t : xt) {
    if (t < x0 || t > x1) continue;
    o << "<line x1=\"" << fmt(px(t)) << "\" x2=\"" << fmt(px(t)) << "\" y1=\"" << top + ph << "\" y2=\"" << top + ph + 5
      << "\" stroke=\"#333\"/><text x=\"" << fmt(px(t)) << "\" y=\"" << top + ph + 19 << "\" text-anchor=\"middle\">"
      << (spec.log_x ? format_tick(std::pow(10.0, t)) : format_tick(t)) << "</text>\n";
  }
  o << "<line x1=\"" << left << "\" x2=\"" << left << "\" y1=\"" << top << "\" y2=\"" << top + ph << "\" stroke=\"#333\"/>\n"
    << "<line x1=\"" << left << "\" x2=\"" << left + pw << "\" y1=\"" << top + ph << "\" y2=\"" << top + ph << "\" stroke=\"#333\"/>\n"
    << "<text x=\"" << left + pw / 2 << "\" y=\"" << H - 12 << "\" text-anchor=\"middle\">"
    << html_escape(spec.x_label + (spec.log_x ? " (log scale)" : "")) << "</text>\n"
    << "<text transform=\"translate(18," << top + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
    << html_escape(spec.y_label + (spec.log_y ? " (log scale)" : "")) << "</text>\n</g>\n";
  // series and legend
  int legend_row = 0;
  for (const auto& s : series) {
    std::ostringstream d;
    bool pen_down = false;
    size_t drawn = 0;
    for (const auto& [x, y] : s.points) {
      if (!usable_x(x) || !usable(y)) {
        pen_down = false;
        continue;
      }
      d << (pen_down ? "L" : "M") << fmt(px(tx(x))) << " " << fmt(py(ty(y))) << " ";
      pen_down = true;
      ++drawn;
    }
    if (drawn == 0) continue;
    if (drawn == 1) {  // a lone point: a dot, since a one-point path draws nothing
      for (const auto& [x, y] : s.points)
        if (usable_x(x) && usable(y))
          o << "<circle cx=\"" << fmt(px(tx(x))) << "\" cy=\"" << fmt(py(ty(y))) << "\" r=\"3\" fill=\"" << s.color << "\"/>\n";
    }
    o << "<path class=\"series\" d=\"" << d.str() << "\" fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"1.6\""
      << (s.dashed ? " stroke-dasharray=\"5 3\"" : "") << "/>\n";
    const double ly = top + 10 + 18 * legend_row++;
    o << "<line x1=\"" << W - right + 15 << "\" x2=\"" << W - right + 40 << "\" y1=\"" << ly << "\" y2=\"" << ly << "\" stroke=\""
      << s.color << "\" stroke-width=\"2\"" << (s.dashed ? " stroke-dasharray=\"5 3\"" : "") << "/><text x=\"" << W - right + 46
      << "\" y=\"" << ly + 4 << "\" font-size=\"12\">" << html_escape(s.name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace athanor::observe
