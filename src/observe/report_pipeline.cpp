// The pipeline section of report.html (contract in report_pipeline.h): an inline SVG with one
// row per rank and a block per forward / backward / weight-gradient action, labelled with its
// micro-batch (and chunk), at its measured start and duration.
#include "observe/report_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "observe/report_svg.h"

namespace athanor::observe {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

struct Kind {
  const char* color;
  const char* label;
};
Kind kind_of(const std::string& k) {
  if (k == "forward") return {"#4c78a8", "F"};
  if (k == "backward") return {"#f58518", "B"};
  if (k == "backward_input") return {"#e45756", "B"};
  if (k == "backward_weight") return {"#54a24b", "W"};
  return {"#999", "?"};
}

std::string timeline_svg(const json& t) {
  const auto& ranks = t.at("ranks");
  double end = 0;
  for (const auto& r : ranks)
    for (const auto& e : r.at("events")) end = std::max(end, e.at(4).get<double>());
  if (ranks.empty() || end <= 0) return "<p>The timeline holds no actions.</p>\n";
  const int rows = static_cast<int>(ranks.size());
  const double left = 150, right = 20, top = 40, row_h = 26, width = 1100;
  const double plot_w = width - left - right, height = top + rows * row_h + 40;
  const double ms = end * 1e3;
  auto x = [&](double s) { return left + s * 1e3 / ms * plot_w; };
  std::ostringstream o;
  o << "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height << "\">\n";
  o << "<text class=\"title\" x=\"" << left << "\" y=\"20\">Pipeline timeline of step " << t.value("step", 0) << " ("
    << html_escape(t.value("schedule", std::string())) << ", " << t.value("micro_batches", 0) << " micro-batches): F forward, B backward"
    << (t.value("schedule", std::string()) == "zb-h1" ? " (input gradients), W weight gradients" : "") << "</text>\n";
  for (int i = 0; i < rows; ++i) {
    const auto& r = ranks[static_cast<std::size_t>(i)];
    const double y = top + i * row_h;
    o << "<text x=\"4\" y=\"" << y + row_h * 0.65 << "\" font-size=\"12\">rank " << r.value("rank", 0) << " (pp " << r.value("pp", 0)
      << ", tp " << r.value("tp", 0) << ", dp " << r.value("dp", 0) << ")</text>\n";
    o << "<rect x=\"" << left << "\" y=\"" << y + 2 << "\" width=\"" << plot_w << "\" height=\"" << row_h - 4
      << "\" fill=\"#f4f4f4\"/>\n";
    for (const auto& e : r.at("events")) {
      const Kind k = kind_of(e.at(0).get<std::string>());
      const double x0 = x(e.at(3).get<double>()), x1 = x(e.at(4).get<double>());
      const int mb = e.at(1).get<int>(), chunk = e.at(2).get<int>();
      std::string label = std::string(k.label) + std::to_string(mb) + (chunk > 0 ? "." + std::to_string(chunk) : "");
      o << "<rect x=\"" << fmt("%.2f", x0) << "\" y=\"" << y + 2 << "\" width=\"" << fmt("%.2f", std::max(0.5, x1 - x0))
        << "\" height=\"" << row_h - 4 << "\" fill=\"" << k.color << "\" stroke=\"#fff\" stroke-width=\"0.5\"><title>"
        << html_escape(e.at(0).get<std::string>()) << " of micro-batch " << mb << (chunk > 0 ? ", chunk " + std::to_string(chunk) : "")
        << ": " << fmt("%.3f", e.at(3).get<double>() * 1e3) << "-" << fmt("%.3f", e.at(4).get<double>() * 1e3) << " ms</title></rect>\n";
      if (x1 - x0 > 7.0 * static_cast<double>(label.size()))
        o << "<text x=\"" << fmt("%.2f", (x0 + x1) / 2) << "\" y=\"" << y + row_h * 0.65
          << "\" font-size=\"11\" fill=\"#fff\" text-anchor=\"middle\">" << label << "</text>\n";
    }
  }
  const double ya = top + rows * row_h + 4;
  o << "<line x1=\"" << left << "\" y1=\"" << ya << "\" x2=\"" << left + plot_w << "\" y2=\"" << ya << "\" stroke=\"#333\"/>\n";
  for (double tick : nice_ticks(0, ms, 8)) {
    const double xt = left + tick / ms * plot_w;
    if (xt > left + plot_w + 0.5) continue;
    o << "<line x1=\"" << xt << "\" y1=\"" << ya << "\" x2=\"" << xt << "\" y2=\"" << ya + 4 << "\" stroke=\"#333\"/>"
      << "<text x=\"" << xt << "\" y=\"" << ya + 16 << "\" font-size=\"11\" text-anchor=\"middle\">" << fmt("%g", tick) << "</text>\n";
  }
  o << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << ya + 32 << "\" font-size=\"12\" text-anchor=\"middle\">time since the step's "
    << "start (ms)</text>\n</svg>\n";
  return o.str();
}
}  // namespace

std::string pipeline_html(const std::string& run_dir, const std::vector<PipelineStepRow>& steps) {
  const fs::path path = fs::path(run_dir) / "pipeline_timeline.json";
  if (steps.empty() && !fs::exists(path)) return "";
  std::ostringstream o;
  if (!steps.empty()) {
    // The first step pays one-time costs (allocation, warm caches): left out when there are more.
    double b = 0, t = 0;
    int n = 0;
    for (const auto& s : steps)
      if (steps.size() == 1 || s.step > steps.front().step) {
        b += s.bubble;
        t += s.theory;
        ++n;
      }
    o << "<table class=\"summary\"><tr><th>schedule</th><td>" << html_escape(steps.back().schedule) << "</td></tr>"
      << "<tr><th>bubble, measured (idle / step time, mean over ranks and " << n << " steps)</th><td>" << fmt("%.1f%%", 100 * b / n)
      << "</td></tr><tr><th>bubble, the schedule's theory</th><td>" << fmt("%.1f%%", 100 * t / n) << "</td></tr></table>\n";
  }
  if (fs::exists(path)) {
    try {
      std::ifstream f(path);
      const json t = json::parse(f);
      o << timeline_svg(t);
      o << "<table class=\"summary\"><tr><th>rank</th><th>busy (ms)</th><th>bubble in this step</th></tr>\n";
      const double step_s = t.value("schedule_s", 0.0);
      for (const auto& r : t.at("ranks")) {
        double busy = 0;
        for (const auto& e : r.at("events")) busy += e.at(4).get<double>() - e.at(3).get<double>();
        o << "<tr><td>" << r.value("rank", 0) << "</td><td>" << fmt("%.3f", busy * 1e3) << "</td><td>"
          << (step_s > 0 ? fmt("%.1f%%", 100 * (1 - busy / step_s)) : std::string("-")) << "</td></tr>\n";
      }
      o << "</table>\n";
    } catch (const json::exception& e) {
      o << "<p class=\"warn\">pipeline_timeline.json could not be read: " << html_escape(e.what()) << "</p>\n";
    }
  }
  return o.str();
}

}  // namespace athanor::observe
