#include "athanor/observe/report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "athanor/core/error.h"
#include "observe/report_pipeline.h"
#include "observe/report_svg.h"

namespace athanor::observe {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kMiB = 1024.0 * 1024.0;

// A number from a record; absent, null (non-finite when written) or not a number: NaN.
double number(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : kNaN;
}
std::string text(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

struct StepRow {
  double step = kNaN, loss = kNaN, lr = kNaN, grad_norm = kNaN, grad_norm_clipped = kNaN, loss_scale = kNaN;
  double throughput = kNaN, step_s = kNaN, data_s = kNaN, forward_s = kNaN, backward_s = kNaN, optimizer_s = kNaN,
         comm_s = kNaN, skipped_total = kNaN;
  bool skipped = false;
  std::map<std::string, std::pair<double, double>> mem;  // tag -> (current, peak) bytes
  std::map<std::string, std::pair<double, double>> comm;  // mesh dimension -> (bytes, seconds)
  double elapsed_s = kNaN;
  json totals;  // {"steps", "step_s", "data_s", …} over every step so far
  // Per-layer statistics (layer-statistics steps only): name -> {grad, param, update, dim}
  std::vector<std::pair<std::string, std::array<double, 4>>> layers;
  std::vector<std::pair<std::string, std::array<double, 4>>> acts;  // name -> {mean, std, zero, dead}
};
struct EvalRow {
  double step = kNaN, loss = kNaN, accuracy = kNaN;
};
struct HealthRow {
  double step = kNaN;
  std::string kind, severity, message;
  std::vector<std::string> suggestions;
  std::vector<std::pair<std::string, std::string>> details;
};

struct RunData {
  std::vector<StepRow> steps;
  std::vector<EvalRow> evals;
  std::vector<HealthRow> health;
  std::vector<PipelineStepRow> pipeline;
  int bad_metric_lines = 0, bad_health_lines = 0;
  bool has_health_file = false;
  std::string config;
  bool has_config = false;
  json lr_find, batch_find;  // lr_find.json, batch_find.json (null when absent)
};

// Calls fn(object) for each line that parses as a JSON object; returns how many did not.
template <class Fn> int for_each_json_line(const fs::path& path, Fn fn) {
  std::ifstream in(path);
  int bad = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number()) {
      ++bad;
      continue;
    }
    try {
      fn(j);
    } catch (const json::exception&) {  // a field of an unexpected type
      ++bad;
    }
  }
  return bad;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

RunData load_run(const fs::path& dir) {
  RunData run;
  run.bad_metric_lines = for_each_json_line(dir / "metrics.jsonl", [&](const json& j) {
    if (j.contains("val_loss") || j.contains("val_accuracy")) {
      run.evals.push_back({number(j, "step"), number(j, "val_loss"), number(j, "val_accuracy")});
      return;
    }
    StepRow r;
    r.step = number(j, "step");
    r.loss = number(j, "loss");
    r.lr = number(j, "lr");
    r.grad_norm = number(j, "grad_norm");
    r.grad_norm_clipped = number(j, "grad_norm_clipped");
    r.loss_scale = number(j, "loss_scale");
    r.throughput = number(j, "throughput");
    r.step_s = number(j, "step_s");
    r.data_s = number(j, "data_s");
    r.forward_s = number(j, "forward_s");
    r.backward_s = number(j, "backward_s");
    r.optimizer_s = number(j, "optimizer_s");
    r.comm_s = number(j, "comm_s");
    r.skipped_total = number(j, "skipped_total");
    r.skipped = j.contains("skipped") && j["skipped"].is_boolean() && j["skipped"].get<bool>();
    if (j.contains("mem") && j["mem"].is_object())
      for (const auto& [tag, m] : j["mem"].items())
        if (m.is_object()) r.mem[tag] = {number(m, "cur"), number(m, "peak")};
    if (j.contains("comm") && j["comm"].is_object())
      for (const auto& [dim, c] : j["comm"].items())
        if (c.is_object()) r.comm[dim] = {number(c, "bytes"), number(c, "s")};
    if (j.contains("pipeline") && j["pipeline"].is_object())
      run.pipeline.push_back({r.step, number(j["pipeline"], "bubble"), number(j["pipeline"], "theory"), text(j["pipeline"], "schedule")});
    r.elapsed_s = number(j, "elapsed_s");
    if (j.contains("totals") && j["totals"].is_object()) r.totals = j["totals"];
    if (j.contains("layers") && j["layers"].is_object())
      for (const auto& [name, v] : j["layers"].items())
        if (v.is_object()) r.layers.push_back({name, {number(v, "grad"), number(v, "param"), number(v, "update"), number(v, "dim")}});
    if (j.contains("acts") && j["acts"].is_object())
      for (const auto& [name, v] : j["acts"].items())
        if (v.is_object()) r.acts.push_back({name, {number(v, "mean"), number(v, "std"), number(v, "zero"), number(v, "dead")}});
    run.steps.push_back(std::move(r));
  });
  if (fs::exists(dir / "health.jsonl")) {
    run.has_health_file = true;
    run.bad_health_lines = for_each_json_line(dir / "health.jsonl", [&](const json& j) {
      HealthRow h;
      h.step = number(j, "step");
      h.kind = text(j, "kind");
      h.severity = text(j, "severity");
      h.message = text(j, "message");
      if (j.contains("suggestions") && j["suggestions"].is_array())
        for (const auto& s : j["suggestions"]) h.suggestions.push_back(s.is_string() ? s.get<std::string>() : s.dump());
      if (j.contains("details") && j["details"].is_object())
        for (const auto& [k, v] : j["details"].items()) h.details.emplace_back(k, v.is_string() ? v.get<std::string>() : v.dump());
      run.health.push_back(std::move(h));
    });
  }
  if (fs::exists(dir / "config.yaml")) {
    run.has_config = true;
    run.config = read_text(dir / "config.yaml");
  }
  for (auto [file, into] : {std::pair{"lr_find.json", &run.lr_find}, std::pair{"batch_find.json", &run.batch_find}})
    if (fs::exists(dir / file)) {
      *into = json::parse(read_text(dir / file), nullptr, /*allow_exceptions=*/false);
      if (into->is_discarded() || !into->is_object()) *into = json();  // a damaged file draws nothing
    }
  return run;
}

std::string num(double v, const char* format = "%.4g") {
  if (!std::isfinite(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

std::string duration(double seconds) {
  if (!std::isfinite(seconds)) return "n/a";
  char buf[64];
  const auto s = static_cast<long long>(seconds);
  if (s >= 3600) std::snprintf(buf, sizeof(buf), "%lldh %02lldm %02llds", s / 3600, s / 60 % 60, s % 60);
  else if (s >= 60) std::snprintf(buf, sizeof(buf), "%lldm %02llds", s / 60, s % 60);
  else std::snprintf(buf, sizeof(buf), "%.2fs", seconds);
  return buf;
}

template <class Row> ChartSeries series_of(const std::vector<Row>& rows, double Row::*field, std::string name, std::string color,
                                           double scale = 1.0, bool dashed = false) {
  ChartSeries s{std::move(name), {}, std::move(color), dashed};
  for (const Row& r : rows) s.points.emplace_back(r.step, r.*field * scale);
  return s;
}

bool any_finite(const ChartSeries& s) {
  return std::any_of(s.points.begin(), s.points.end(), [](const auto& p) { return std::isfinite(p.second); });
}

const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string summary_html(const RunData& run) {
  double last_step = kNaN, total_time = 0, throughput_sum = 0, final_loss = kNaN, skipped_total = kNaN;
  int throughput_n = 0, time_n = 0, skipped_count = 0;
  for (const StepRow& r : run.steps) {
    if (std::isfinite(r.step)) last_step = std::isfinite(last_step) ? std::max(last_step, r.step) : r.step;
    if (std::isfinite(r.throughput)) throughput_sum += r.throughput, ++throughput_n;
    if (std::isfinite(r.step_s)) total_time += r.step_s, ++time_n;
    if (std::isfinite(r.skipped_total)) skipped_total = r.skipped_total;
    skipped_count += r.skipped;
    final_loss = r.loss;
  }
  double final_val = kNaN, best_val = kNaN, best_val_step = kNaN, final_acc = kNaN;
  for (const EvalRow& e : run.evals) {
    final_val = e.loss;
    if (std::isfinite(e.accuracy)) final_acc = e.accuracy;
    if (std::isfinite(e.loss) && !(e.loss >= best_val)) best_val = e.loss, best_val_step = e.step;
  }
  const double skipped = std::isfinite(skipped_total) ? skipped_total : skipped_count;
  // Training time: wall-clock from the start of training to the last step, and the phases
  // summed over every step (the trainer's running totals), not only the logged ones.
  std::string time_text = "n/a", phases_text;
  const StepRow* last = run.steps.empty() ? nullptr : &run.steps.back();
  if (last && std::isfinite(last->elapsed_s)) time_text = duration(last->elapsed_s) + " wall-clock (start of training to the last step)";
  if (last && last->totals.is_object() && number(last->totals, "steps") > 0) {
    const json& t = last->totals;
    const double total = number(t, "step_s");
    std::ostringstream ph;
    ph << "over all " << num(number(t, "steps"), "%.0f") << " steps: step time " << duration(total);
    for (const char* k : {"data_s", "forward_s", "backward_s", "optimizer_s", "comm_s"}) {
      const double v = number(t, k);
      if (!std::isfinite(v) || (std::string(k) == "comm_s" && v == 0)) continue;
      ph << ", " << std::string(k, std::strlen(k) - 2) << " " << duration(v) << " (" << num(total > 0 ? 100 * v / total : kNaN, "%.1f") << "%)";
    }
    phases_text = ph.str();
    if (time_text == "n/a") time_text = duration(total) + " (sum of all step times)";
  } else if (time_n) {  // runs written before the totals existed
    if (time_text == "n/a") time_text = duration(total_time) + " (sum of the " + std::to_string(time_n) + " logged steps' times only)";
  }
  std::ostringstream o;
  o << "<table class=\"summary\">\n"
    << "<tr><th>steps</th><td>" << num(last_step, "%.0f") << " (" << run.steps.size() << " step records, " << run.evals.size()
    << " eval records)</td></tr>\n"
    << "<tr><th>final train loss</th><td>" << num(final_loss) << "</td></tr>\n"
    << "<tr><th>final val loss</th><td>" << num(final_val) << "</td></tr>\n"
    << "<tr><th>best val loss</th><td>" << num(best_val) << (std::isfinite(best_val) ? " at step " + num(best_val_step, "%.0f") : "")
    << "</td></tr>\n"
    << "<tr><th>final val accuracy</th><td>" << (std::isfinite(final_acc) ? num(100 * final_acc, "%.2f") + " %" : "n/a") << "</td></tr>\n"
    << "<tr><th>mean throughput</th><td>" << (throughput_n ? num(throughput_sum / throughput_n, "%.1f") + " targets/s" : "n/a")
    << "</td></tr>\n"
    << "<tr><th>skipped steps</th><td>" << num(skipped, "%.0f") << "</td></tr>\n"
    << "<tr><th>training time</th><td>" << html_escape(time_text) << "</td></tr>\n"
    << (phases_text.empty() ? std::string() : "<tr><th>time per phase</th><td>" + html_escape(phases_text) + "</td></tr>\n")
    << "<tr><th>health events</th><td>" << run.health.size() << "</td></tr>\n"
    << "</table>\n";
  if (run.bad_metric_lines || run.bad_health_lines)
    o << "<p class=\"warn\">Skipped unreadable lines: " << run.bad_metric_lines << " in metrics.jsonl, " << run.bad_health_lines
      << " in health.jsonl (truncated by a crash, or written by an older version).</p>\n";
  return o.str();
}

std::string charts_html(const RunData& run) {
  const auto& S = run.steps;
  const bool classifier = std::any_of(run.evals.begin(), run.evals.end(), [](const EvalRow& e) { return std::isfinite(e.accuracy); });
  std::ostringstream o;
  o << svg_line_chart({"Loss", "step", "loss (mean cross-entropy, nats)"},
                      {series_of(S, &StepRow::loss, "train", kPalette[0]), series_of(run.evals, &EvalRow::loss, "val", kPalette[1])});
  if (classifier)
    o << svg_line_chart({"Validation accuracy", "step", "accuracy (%)"}, {series_of(run.evals, &EvalRow::accuracy, "val", kPalette[1], 100.0)});
  o << svg_line_chart({"Learning rate", "step", "learning rate"}, {series_of(S, &StepRow::lr, "lr", kPalette[2])});
  o << svg_line_chart({"Gradient norm", "step", "global L2 norm", true},
                      {series_of(S, &StepRow::grad_norm, "pre-clip", kPalette[3]),
                       series_of(S, &StepRow::grad_norm_clipped, "post-clip", kPalette[0], 1.0, true)});
  const ChartSeries scale = series_of(S, &StepRow::loss_scale, "loss scale", kPalette[4]);
  if (any_finite(scale)) o << svg_line_chart({"Loss scale (f16 GradScaler)", "step", "scale", true}, {scale});
  o << svg_line_chart({"Throughput", "step", classifier ? "samples/s" : "tokens/s"},
                      {series_of(S, &StepRow::throughput, "throughput", kPalette[2])});
  o << svg_line_chart({"Step time split", "step", "time (ms)", false, true},
                      {series_of(S, &StepRow::step_s, "whole step", "#000", 1e3, true),
                       series_of(S, &StepRow::data_s, "data", kPalette[0], 1e3),
                       series_of(S, &StepRow::forward_s, "forward", kPalette[1], 1e3),
                       series_of(S, &StepRow::backward_s, "backward", kPalette[2], 1e3),
                       series_of(S, &StepRow::optimizer_s, "optimizer", kPalette[3], 1e3),
                       series_of(S, &StepRow::comm_s, "comm", kPalette[4], 1e3)});
  std::map<std::string, ChartSeries> peak;
  for (const StepRow& r : S)
    for (const auto& [tag, m] : r.mem) {
      auto [it, fresh] = peak.try_emplace(tag, ChartSeries{tag + " (peak)", {}, kPalette[peak.size() % 10]});
      it->second.points.emplace_back(r.step, m.second / kMiB);
    }
  std::vector<ChartSeries> mem;
  for (auto& [tag, s] : peak) mem.push_back(std::move(s));
  o << svg_line_chart({"Memory by tag (peak within each step)", "step", "memory (MiB)", false, true}, mem);
  // Distributed runs: the step's collectives by mesh dimension (bytes, and time from posting to completion).
  std::map<std::string, ChartSeries> bytes, secs;
  for (const StepRow& r : S)
    for (const auto& [dim, c] : r.comm) {
      auto [b, fb] = bytes.try_emplace(dim, ChartSeries{dim, {}, kPalette[bytes.size() % 10]});
      b->second.points.emplace_back(r.step, c.first / kMiB);
      auto [t, ft] = secs.try_emplace(dim, ChartSeries{dim, {}, kPalette[secs.size() % 10]});
      t->second.points.emplace_back(r.step, c.second * 1e3);
    }
  if (!bytes.empty()) {
    std::vector<ChartSeries> bs, ts;
    for (auto& [d, s] : bytes) bs.push_back(std::move(s));
    for (auto& [d, s] : secs) ts.push_back(std::move(s));
    o << svg_line_chart({"Communication per step by mesh dimension", "step", "data (MiB)", false, true}, bs);
    o << svg_line_chart({"Communication time per step by mesh dimension (posting to completion)", "step", "time (ms)", false, true}, ts);
  }
  return o.str();
}

std::string health_html(const RunData& run) {
  std::ostringstream o;
  if (run.health.empty()) {
    o << "<p class=\"ok\">No health events" << (run.has_health_file ? "" : " (no health.jsonl in the run directory)") << ".</p>\n";
    return o.str();
  }
  o << "<table class=\"health\">\n<tr><th>step</th><th>kind</th><th>severity</th><th>message</th><th>suggestions</th><th>details</th></tr>\n";
  for (const HealthRow& h : run.health) {
    o << "<tr class=\"sev-" << html_escape(h.severity) << "\"><td>" << num(h.step, "%.0f") << "</td><td>" << html_escape(h.kind)
      << "</td><td>" << html_escape(h.severity) << "</td><td>" << html_escape(h.message) << "</td><td><ul>";
    for (const auto& s : h.suggestions) o << "<li>" << html_escape(s) << "</li>";
    o << "</ul></td><td>";
    for (const auto& [k, v] : h.details) o << "<div><b>" << html_escape(k) << "</b>: " << html_escape(v) << "</div>";
    o << "</td></tr>\n";
  }
  o << "</table>\n";
  return o.str();
}

// The per-layer views: heat maps over the layer-statistics steps (update-to-weight ratio,
// gradient norm, dead or zero activations) and the last step's numbers in a table.
std::string layers_html(const RunData& run) {
  std::vector<const StepRow*> rows;
  for (const StepRow& r : run.steps)
    if (!r.layers.empty() || !r.acts.empty()) rows.push_back(&r);
  if (rows.empty())
    return "<p>No per-layer statistics in metrics.jsonl (observe.layer_stats was off, or the run predates them).</p>\n";
  // Weight matrices (dim >= 2) in the network's order; all parameters when dims are unknown.
  std::vector<std::string> names, act_names;
  for (const StepRow* r : rows) {
    for (const auto& [n, v] : r->layers)
      if ((v[3] >= 2 || !std::isfinite(v[3])) && std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    for (const auto& [n, v] : r->acts)
      if (std::find(act_names.begin(), act_names.end(), n) == act_names.end()) act_names.push_back(n);
  }
  std::vector<double> xs;
  for (const StepRow* r : rows) xs.push_back(r->step);
  auto grid = [&](const std::vector<std::string>& which, bool acts, auto value) {
    std::vector<std::vector<double>> g(which.size(), std::vector<double>(rows.size(), kNaN));
    for (size_t c = 0; c < rows.size(); ++c)
      for (const auto& [n, v] : acts ? rows[c]->acts : rows[c]->layers) {
        const auto it = std::find(which.begin(), which.end(), n);
        if (it != which.end()) g[static_cast<size_t>(it - which.begin())][c] = value(v);
      }
    return g;
  };
  auto log10_or_nan = [](double v) { return v > 0 && std::isfinite(v) ? std::log10(v) : kNaN; };
  std::ostringstream o;
  o << "<p>Per layer, on every logged step: how far each weight matrix moved in the step relative to its size "
       "(||&Delta;W|| / ||W||; ~1e-3 is the healthy order: blue = too small to learn, red = large enough to destabilise), "
       "the gradient norm, and the share of each layer's outputs that are zero (for ReLU layers: the units that were 0 "
       "for the whole batch, i.e. dead).</p>\n";
  o << svg_heat_map({"Update / weight ratio per layer (log10)", "step", "log10 ||dW|| / ||W||", -6, -3, 0}, names, xs,
                    grid(names, false, [&](const std::array<double, 4>& v) { return log10_or_nan(v[2]); }));
  o << svg_heat_map({"Gradient norm per layer (log10)", "step", "log10 ||grad||", -6, -2, 2}, names, xs,
                    grid(names, false, [&](const std::array<double, 4>& v) { return log10_or_nan(v[0]); }));
  if (!act_names.empty())
    o << svg_heat_map({"Dead (ReLU) or zero fraction of each layer's outputs", "step", "fraction", 0, 0, 1}, act_names, xs,
                      grid(act_names, true, [](const std::array<double, 4>& v) { return std::isfinite(v[3]) && v[3] >= 0 ? v[3] : v[2]; }));
  const StepRow& last = *rows.back();
  o << "<table class=\"layers\">\n<tr><th>layer (step " << num(last.step, "%.0f")
    << ")</th><th>grad norm</th><th>weight norm</th><th>grad / weight</th><th>update / weight</th></tr>\n";
  for (const auto& [n, v] : last.layers)
    o << "<tr><td>" << html_escape(n) << "</td><td>" << num(v[0]) << "</td><td>" << num(v[1]) << "</td><td>"
      << num(v[1] > 0 ? v[0] / v[1] : kNaN) << "</td><td>" << num(v[2]) << "</td></tr>\n";
  o << "</table>\n";
  if (!last.acts.empty()) {
    o << "<table class=\"layers\">\n<tr><th>layer output (step " << num(last.step, "%.0f")
      << ")</th><th>mean</th><th>std</th><th>zero</th><th>dead units</th></tr>\n";
    for (const auto& [n, v] : last.acts)
      o << "<tr><td>" << html_escape(n) << "</td><td>" << num(v[0]) << "</td><td>" << num(v[1]) << "</td><td>"
        << num(100 * v[2], "%.1f") << " %</td><td>" << (std::isfinite(v[3]) && v[3] >= 0 ? num(100 * v[3], "%.1f") + " %" : "")
        << "</td></tr>\n";
    o << "</table>\n";
  }
  return o.str();
}

std::string lr_find_html(const json& j) {
  ChartSeries raw{"loss", {}, kPalette[0]}, smooth{"smoothed", {}, kPalette[3]};
  if (j.contains("points") && j["points"].is_array())
    for (const auto& p : j["points"])
      if (p.is_object()) {
        raw.points.emplace_back(number(p, "lr"), number(p, "loss"));
        smooth.points.emplace_back(number(p, "lr"), number(p, "smoothed"));
      }
  std::vector<ChartSeries> series{raw, smooth};
  // The suggestions as vertical marks: two points spanning the smoothed loss's range.
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& [x, y] : smooth.points)
    if (std::isfinite(y)) lo = std::min(lo, y), hi = std::max(hi, y);
  auto mark = [&](const char* key, const char* name, const char* colour) {
    const double v = number(j, key);
    if (!std::isfinite(v) || v <= 0 || !std::isfinite(lo)) return;
    std::string label = name;
    label += ' ';
    label += num(v);
    series.push_back({label, {{v, lo}, {v, hi}}, colour, true});
  };
  mark("steepest_lr", "steepest descent", kPalette[2]);
  mark("diverged_lr", "diverged at", kPalette[1]);
  mark("suggested_lr", "suggested", kPalette[4]);
  mark("config_lr", "config's lr", "#000");
  std::ostringstream o;
  o << "<p>Learning-rate range test (<code>athanor lr-find</code>, " << html_escape(text(j, "config"))
    << "): the lr grows exponentially from " << num(number(j, "min_lr")) << " to " << num(number(j, "max_lr")) << " over "
    << num(number(j, "steps"), "%.0f") << " steps from a fresh initialisation. Suggested lr: <b>" << num(number(j, "suggested_lr"))
    << "</b> (" << html_escape(text(j, "suggestion_rule")) << ").</p>\n";
  o << svg_line_chart({"Loss against learning rate", "learning rate", "loss", false, false, true}, series);
  return o.str();
}

std::string batch_find_html(const json& j) {
  ChartSeries peak{"peak memory", {}, kPalette[0]};
  std::ostringstream rows;
  if (j.contains("probes") && j["probes"].is_array())
    for (const auto& p : j["probes"])
      if (p.is_object()) {
        const bool fits = p.value("fits", false);
        peak.points.emplace_back(number(p, "batch"), number(p, "peak_bytes") / kMiB);
        rows << "<tr><td>" << num(number(p, "batch"), "%.0f") << "</td><td>" << num(number(p, "peak_bytes") / kMiB, "%.1f")
             << " MiB</td><td>" << (fits ? "fits" : "over budget") << "</td><td>" << num(number(p, "throughput"), "%.1f")
             << "</td><td>" << html_escape(text(p, "note")) << "</td></tr>\n";
      }
  ChartSeries budget{"budget", {}, kPalette[3], true};
  for (const auto& [x, y] : peak.points) budget.points.emplace_back(x, number(j, "memory_budget") / kMiB);
  std::ostringstream o;
  o << "<p>Micro-batch search (<code>athanor batch-find</code>, " << html_escape(text(j, "config")) << "): the largest micro-batch "
    << "within " << num(number(j, "memory_budget") / kMiB, "%.0f") << " MiB is <b>" << num(number(j, "max_micro_batch"), "%.0f")
    << "</b>; a global batch of " << num(number(j, "target_global_batch"), "%.0f") << " then takes <b>"
    << num(number(j, "accum_steps"), "%.0f") << "</b> gradient-accumulation steps (x " << num(number(j, "world_size"), "%.0f")
    << " ranks).</p>\n";
  o << svg_line_chart({"Peak memory of one training step against the micro-batch", "micro-batch (samples)", "memory (MiB)", false, true},
                      {peak, budget});
  o << "<table class=\"layers\">\n<tr><th>micro-batch</th><th>peak memory</th><th></th><th>samples/s</th><th></th></tr>\n"
    << rows.str() << "</table>\n";
  return o.str();
}

constexpr const char* kStyle = R"(body{font-family:sans-serif;margin:24px;color:#222;max-width:1160px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
table.summary th{background:#f5f5f5}svg.chart{display:block;margin:12px 0;border:1px solid #eee}
svg .title{font-size:15px;font-weight:bold}tr.sev-error td{background:#fde8e8}tr.sev-warning td{background:#fff6e0}
pre{background:#f7f7f7;padding:10px;font-size:12px;overflow:auto}.warn{color:#a15c00}.ok{color:#2a7a2a}ul{margin:0;padding-left:18px})";
}  // namespace

std::string write_report(const std::string& run_dir) {
  const fs::path dir(run_dir);
  ATH_CHECK(fs::is_directory(dir), "report", "run directory '", run_dir, "' does not exist",
            Hint{"pass the directory a training run wrote (it holds metrics.jsonl), e.g. `athanor report runs/my_run`"});
  ATH_CHECK(fs::exists(dir / "metrics.jsonl") || fs::exists(dir / "lr_find.json") || fs::exists(dir / "batch_find.json"), "report",
            "'", run_dir, "' has no metrics.jsonl (nor lr_find.json or batch_find.json)",
            Hint{"pass the directory a training run wrote; metrics.jsonl appears after its first logged step"});
  const RunData run = load_run(dir);
  std::ostringstream html;
  const std::string name = html_escape(fs::absolute(dir).lexically_normal().filename().string());
  html << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>athanor report: " << name
       << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n<h1>Training report: " << name << "</h1>\n<p>"
       << html_escape(fs::absolute(dir).lexically_normal().string()) << "</p>\n<h2>Summary</h2>\n"
       << summary_html(run) << "<h2>Charts</h2>\n" << charts_html(run) << "<h2>Per-layer views</h2>\n" << layers_html(run);
  if (const std::string p = pipeline_html(dir.string(), run.pipeline); !p.empty()) html << "<h2>Pipeline</h2>\n" << p;
  if (run.lr_find.is_object()) html << "<h2>Learning-rate range test</h2>\n" << lr_find_html(run.lr_find);
  if (run.batch_find.is_object()) html << "<h2>Micro-batch search</h2>\n" << batch_find_html(run.batch_find);
  html << "<h2>Health events</h2>\n" << health_html(run)
       << "<h2>Resolved config</h2>\n"
       << (run.has_config ? "<pre>" + html_escape(run.config) + "</pre>\n" : "<p>No config.yaml in the run directory.</p>\n")
       << "</body>\n</html>\n";
  const fs::path out = dir / "report.html";
  const fs::path tmp = dir / "report.html.tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << html.str();
    ATH_CHECK(f.good(), "report", "cannot write '", tmp.string(), "'", Hint{"check permissions and free space of the run directory"});
  }
  std::error_code ec;
  fs::rename(tmp, out, ec);  // whole file or nothing, for a browser that has it open
  ATH_CHECK(!ec, "report", "cannot rename '", tmp.string(), "' to '", out.string(), "': ", ec.message(),
            Hint{"check permissions of the run directory"});
  return out.string();
}

}  // namespace athanor::observe
