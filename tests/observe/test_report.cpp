// report.html from synthetic run directories: every chart, the health table,
// escaping, damaged metrics.jsonl lines and the error for a missing run.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "athanor/observe/report.h"
#include "observe/report_svg.h"
#include "test_util.h"

namespace athanor::observe {
namespace {
namespace fs = std::filesystem;

std::string step_line(int step, bool with_scale) {
  std::ostringstream o;
  o << "{\"step\":" << step << ",\"loss\":" << 3.0 * std::exp(-0.01 * step) << ",\"lr\":" << 1e-3 * std::min(1.0, step / 10.0)
    << ",\"grad_norm\":" << 2.0 + std::sin(step) << ",\"grad_norm_clipped\":1.0,\"skipped\":false,\"skipped_total\":1";
  if (with_scale) o << ",\"loss_scale\":" << 65536.0 / (step > 20 ? 2 : 1);
  o << ",\"targets\":4096,\"throughput\":" << 10000 + step << ",\"step_s\":0.4,\"data_s\":0.01,\"forward_s\":0.12,"
    << "\"backward_s\":0.22,\"optimizer_s\":0.05,\"comm_s\":0,\"mem\":{\"parameter\":{\"cur\":1048576,\"peak\":1048576},"
    << "\"activation\":{\"cur\":0,\"peak\":" << 8388608 + step * 1024 << "}}}";
  return o.str();
}

std::string read(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// A run of 40 steps with evals every 10, optional loss scale, optional health file.
std::string make_run(const std::string& name, bool with_scale, bool with_health, const std::string& extra_metrics = "") {
  const std::string dir = testing::fresh_temp_dir(name);
  std::ofstream m(dir + "/metrics.jsonl");
  for (int s = 1; s <= 40; ++s) {
    m << step_line(s, with_scale) << "\n";
    if (s % 10 == 0) m << "{\"step\":" << s << ",\"val_loss\":" << 3.1 * std::exp(-0.008 * s) << ",\"val_accuracy\":" << 0.02 * s << "}\n";
  }
  m << extra_metrics;
  m.close();
  if (with_health) {
    std::ofstream h(dir + "/health.jsonl");
    h << R"x({"step":17,"kind":"loss_spike","severity":"warning","message":"loss jumped to 9.1 (<5x> the running mean)",)x"
      << R"("suggestions":["lower the learning rate","raise warmup & check data"],"details":{"sample_ids":"[3, 9]"}})" << "\n";
  }
  std::ofstream(dir + "/config.yaml") << "model:\n  kind: gpt\n  name: \"<script>alert(1)</script>\"\ntrain:\n  lr: 0.001\n";
  return dir;
}

TEST(Report, HasEveryChartHealthTableAndConfig) {
  const std::string dir = make_run("report_full", /*with_scale=*/true, /*with_health=*/true);
  const std::string path = write_report(dir);
  EXPECT_EQ(path, dir + "/report.html");
  const std::string html = read(path);
  for (const char* title : {"Loss", "Learning rate", "Gradient norm", "Loss scale (f16 GradScaler)", "Throughput", "Step time split",
                            "Memory by tag (peak within each step)", "Validation accuracy"})
    EXPECT_NE(html.find(std::string("class=\"title\" x=\"550\" y=\"24\" text-anchor=\"middle\">") + title + "</text>"), std::string::npos)
        << title;
  EXPECT_EQ(count(html, "<svg "), 8u);
  // train+val loss, acc, lr, 2 grad norms, scale, throughput, 6 time lines, 2 memory tags
  EXPECT_EQ(count(html, "<path class=\"series\""), 2u + 1 + 1 + 2 + 1 + 1 + 6 + 2);
  // 40 step points on the train loss line: one M and 39 L
  const std::regex path_re("<path class=\"series\" d=\"([^\"]*)\"");
  std::smatch first;
  ASSERT_TRUE(std::regex_search(html, first, path_re));
  EXPECT_EQ(count(first[1].str(), "M"), 1u);
  EXPECT_EQ(count(first[1].str(), "L"), 39u);
  EXPECT_NE(html.find("<table class=\"health\">"), std::string::npos);
  EXPECT_NE(html.find("loss_spike"), std::string::npos);
  EXPECT_NE(html.find("loss jumped to 9.1 (&lt;5x&gt; the running mean)"), std::string::npos);
  EXPECT_NE(html.find("<li>raise warmup &amp; check data</li>"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);  // nothing executable, nothing fetched
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));
  EXPECT_EQ(html.find("https://"), std::string::npos);
  // summary: 40 steps, best val loss = the last (decreasing), final accuracy 80 %
  EXPECT_NE(html.find("<th>steps</th><td>40 (40 step records, 4 eval records)"), std::string::npos);
  char best[64];
  std::snprintf(best, sizeof(best), "%.4g at step 40", 3.1 * std::exp(-0.008 * 40));
  EXPECT_NE(html.find(best), std::string::npos) << best;
  EXPECT_NE(html.find("<th>final val accuracy</th><td>80.00 %"), std::string::npos);
  EXPECT_NE(html.find("<th>mean throughput</th><td>10020.5 targets/s"), std::string::npos);
  EXPECT_NE(html.find("<th>skipped steps</th><td>1</td>"), std::string::npos);
  EXPECT_EQ(html.find("Skipped unreadable lines"), std::string::npos);
}

TEST(Report, NoScaleChartAndExplicitNoHealthEvents) {
  const std::string dir = make_run("report_plain", /*with_scale=*/false, /*with_health=*/false);
  const std::string html = read(write_report(dir));
  EXPECT_EQ(html.find("Loss scale"), std::string::npos);
  EXPECT_NE(html.find("No health events"), std::string::npos);
  EXPECT_EQ(html.find("<table class=\"health\">"), std::string::npos);
}

TEST(Report, SkipsTruncatedAndOldLines) {
  // An older run without timing/memory keys, a null (non-finite) loss, junk, and a line cut by a crash.
  const std::string extra = "{\"step\":41,\"loss\":null,\"lr\":0.001}\nnot json at all\n[1,2]\n{\"step\":42,\"loss\":2.0,\"lr\":0.0";
  const std::string dir = make_run("report_truncated", false, true, extra);
  const std::string html = read(write_report(dir));
  EXPECT_NE(html.find("Skipped unreadable lines: 3 in metrics.jsonl, 0 in health.jsonl"), std::string::npos);
  EXPECT_NE(html.find("<th>steps</th><td>41 (41 step records"), std::string::npos);
  EXPECT_NE(html.find("<th>final train loss</th><td>n/a"), std::string::npos);  // step 41 had a null loss
}

TEST(Report, ChartOfOnlyMissingValuesSaysSo) {
  const std::string dir = testing::fresh_temp_dir("report_sparse");
  std::ofstream(dir + "/metrics.jsonl") << "{\"step\":1,\"loss\":1.5}\n";
  const std::string html = read(write_report(dir));
  EXPECT_NE(html.find("no finite values recorded"), std::string::npos);
  EXPECT_NE(html.find("No config.yaml"), std::string::npos);
}

TEST(Report, MissingRunDirOrMetricsIsAnError) {
  const std::string dir = testing::fresh_temp_dir("report_empty");
  std::string msg = testing::error_message([&] { write_report(dir); });
  EXPECT_NE(msg.find("has no metrics.jsonl"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir), std::string::npos) << msg;
  msg = testing::error_message([&] { write_report(dir + "/nope"); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
}

TEST(ReportSvg, NiceTicksCoverTheRange) {
  const auto t = nice_ticks(0.13, 9.7, 6);
  ASSERT_GE(t.size(), 2u);
  EXPECT_LE(t.front(), 0.13);
  EXPECT_GE(t.back(), 9.7);
  const double step = t[1] - t[0];
  EXPECT_NEAR(step, 2.0, 1e-12);  // 9.57 / 6 = 1.6 rounds up to 2
  for (size_t i = 1; i < t.size(); ++i) EXPECT_NEAR(t[i] - t[i - 1], step, 1e-9);
  EXPECT_EQ(html_escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
}

TEST(ReportSvg, PointsLandWhereTheAxesSay) {
  // y = x on [0, 10]: ticks 0..10 step 2 (x) and 0..10 step 2 (y); the plot area is 820 x 225 at (90, 40).
  ChartSeries s{"line", {{0, 0}, {10, 10}}, "#000"};
  const std::string svg = svg_line_chart({"T", "x", "y"}, {s});
  EXPECT_NE(svg.find("d=\"M90.0 265.0 L910.0 40.0 \""), std::string::npos) << svg;
  // a NaN in the middle breaks the line into two pieces
  s.points = {{0, 0}, {1, NAN}, {2, 4}, {3, 6}};
  const std::string broken = svg_line_chart({"T", "x", "y"}, {s});
  const size_t d = broken.find(" d=\"");
  EXPECT_EQ(count(broken.substr(d, broken.find('"', d + 4) - d), "M"), 2u);
}

TEST(ReportSvg, LogAxisLabelsArePowersOfTenOrRoundValues) {
  ChartSeries s{"g", {{0, 1}, {1, 1000}, {2, -5}}, "#000"};  // the non-positive value is left out
  const std::string decades = svg_line_chart({"T", "x", "y", true}, {s});
  for (const char* label : {">1</text>", ">10</text>", ">100</text>", ">1000</text>"}) EXPECT_NE(decades.find(label), std::string::npos) << label;
  EXPECT_NE(decades.find("(log scale)"), std::string::npos);
  s.points = {{0, 16384}, {1, 65536}};
  const std::string narrow = svg_line_chart({"T", "x", "y", true}, {s});
  for (const char* label : {">20000</text>", ">40000</text>", ">60000</text>"}) EXPECT_NE(narrow.find(label), std::string::npos) << label;
}

}  // namespace

TEST(Report, TrainingTimeIsWallClockAndPhasesAreSummedOverEveryStep) {
  // Only 3 of 1500 steps are logged (0.4 s each): the summary must not be 1.2 s.
  const std::string dir = testing::fresh_temp_dir("report_time");
  {
    std::ofstream m(dir + "/metrics.jsonl");
    for (int s : {1, 750, 1500}) {
      std::string line = step_line(s, false);
      line.pop_back();  // the closing brace
      m << line << ",\"elapsed_s\":" << 0.2 * s << ",\"totals\":{\"steps\":" << s << ",\"step_s\":" << 0.19 * s
        << ",\"data_s\":" << 0.01 * s << ",\"forward_s\":" << 0.06 * s << ",\"backward_s\":" << 0.1 * s
        << ",\"optimizer_s\":" << 0.02 * s << ",\"comm_s\":0}";
      if (s > 1)
        m << ",\"layers\":{\"h.0.w\":{\"grad\":0.5,\"param\":10,\"update\":0.001,\"dim\":2},"
          << "\"h.0.b\":{\"grad\":0.1,\"param\":1,\"update\":0.002,\"dim\":1},"
          << "\"h.1.w\":{\"grad\":0.2,\"param\":8,\"update\":0.00001,\"dim\":2}},"
          << "\"acts\":{\"h.0:linear_relu\":{\"mean\":0.5,\"std\":1,\"absmax\":4,\"zero\":0.6,\"dead\":0.25,\"units\":64}}";
      m << "}\n";
    }
  }
  std::ofstream(dir + "/lr_find.json") << R"({"config":"c.yaml","steps":3,"min_lr":1e-6,"max_lr":1,"steepest_lr":0.001,)"
                                       << R"("diverged_lr":0.3,"suggested_lr":0.001,"suggestion_rule":"steepest","config_lr":0.002,)"
                                       << R"("points":[{"lr":1e-6,"loss":3,"smoothed":3},{"lr":1e-3,"loss":2,"smoothed":2.5},)"
                                       << R"({"lr":1,"loss":9,"smoothed":6}]})";
  const std::string html = read(write_report(dir));
  EXPECT_NE(html.find("5m 00s wall-clock (start of training to the last step)"), std::string::npos);
  EXPECT_NE(html.find("over all 1500 steps: step time 4m 45s, data 15.00s (5.3%), forward 1m 30s (31.6%)"), std::string::npos)
      << html.substr(html.find("time per phase"), 300);
  EXPECT_EQ(html.find("sum of step times"), std::string::npos);
  // The per-layer views: heat maps over the logged steps, weight matrices only (not h.0.b).
  EXPECT_EQ(count(html, "class=\"chart heatmap\""), 3u);
  EXPECT_NE(html.find("<title>h.1.w @ 750: -5.0</title>"), std::string::npos);  // log10 of 1e-5
  EXPECT_EQ(html.find("<title>h.0.b @"), std::string::npos);
  EXPECT_NE(html.find("<td>h.0:linear_relu</td>"), std::string::npos);
  EXPECT_NE(html.find("Learning-rate range test"), std::string::npos);
  EXPECT_NE(html.find("Suggested lr: <b>0.001</b>"), std::string::npos);
  // A run written before the totals: the logged steps' sum, said to be only that.
  const std::string old = make_run("report_time_old", false, false);
  EXPECT_NE(read(write_report(old)).find("(sum of the 40 logged steps&#39; times only)"), std::string::npos);
}

}  // namespace athanor::observe
