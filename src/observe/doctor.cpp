// `athanor doctor`: reading a run directory and writing the diagnosis (observe/doctor.h).
// The causes themselves are worked out in doctor_findings.cpp.
#include "athanor/observe/doctor.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "athanor/core/error.h"
#include "athanor/observe/health.h"
#include "observe/doctor_run.h"

namespace athanor::observe {
namespace fs = std::filesystem;
using nlohmann::json;

namespace detail {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double num(const json& j, const char* key, double fallback = 0) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (it->is_null()) return kNaN;  // non-finite numbers are written as null
  return it->is_number() ? it->get<double>() : fallback;
}

struct ParsedLines {
  std::vector<json> lines;
  bool truncated_last = false;
};

ParsedLines read_jsonl(const fs::path& path) {
  std::ifstream f(path);
  ATH_CHECK(f.good(), "doctor", "cannot read ", path.string(), Hint{"check the file's permissions"});
  std::vector<std::string> raw;
  for (std::string line; std::getline(f, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) raw.push_back(line);
  ParsedLines out;
  for (size_t i = 0; i < raw.size(); ++i) {
    try {
      json j = json::parse(raw[i]);
      ATH_CHECK(j.is_object(), "doctor", path.string(), " line ", i + 1, " is not a JSON object",
                Hint{"the file was edited or corrupted; remove the bad line to diagnose the rest"});
      out.lines.push_back(std::move(j));
    } catch (const json::parse_error& e) {
      if (i + 1 == raw.size()) {
        out.truncated_last = true;  // a crash in the middle of writing the last line
        break;
      }
      ATH_FAIL("doctor", path.string(), " line ", i + 1, " is not valid JSON (", e.what(), ")",
               Hint{"the file was edited or corrupted; remove the bad line to diagnose the rest"});
    }
  }
  return out;
}

StepMetrics step_from_json(const json& j) {
  StepMetrics m;
  m.step = j.value("step", int64_t{0});
  m.loss = num(j, "loss");
  m.lr = num(j, "lr");
  m.grad_norm = num(j, "grad_norm");
  m.grad_norm_clipped = num(j, "grad_norm_clipped");
  m.skipped = j.value("skipped", false);
  m.skipped_total = j.value("skipped_total", int64_t{0});
  m.loss_scale = num(j, "loss_scale");
  m.step_seconds = num(j, "step_s");
  m.data_seconds = num(j, "data_s");
  m.forward_seconds = num(j, "forward_s");
  m.backward_seconds = num(j, "backward_s");
  m.optimizer_seconds = num(j, "optimizer_s");
  m.comm_seconds = num(j, "comm_s");
  m.loss_nonfinite = !std::isfinite(m.loss);
  if (auto it = j.find("nonfinite_params"); it != j.end() && it->is_array())
    for (const auto& p : *it) m.nonfinite_params.push_back(p.is_string() ? p.get<std::string>() : p.dump());
  if (auto it = j.find("layers"); it != j.end() && it->is_object())
    for (const auto& [name, v] : it->items())
      m.layers.push_back({name, num(v, "grad"), num(v, "param"), num(v, "update", -1), static_cast<int>(num(v, "dim", 0))});
  if (auto it = j.find("acts"); it != j.end() && it->is_object())
    for (const auto& [name, v] : it->items()) {
      ActivationStats a;
      a.name = name;
      a.mean = num(v, "mean");
      a.std = num(v, "std");
      a.absmax = num(v, "absmax");
      a.zero_frac = num(v, "zero");
      a.dead_frac = num(v, "dead", -1);
      a.saturated_frac = num(v, "sat", -1);
      a.units = static_cast<int64_t>(num(v, "units"));
      m.activations.push_back(a);
    }
  if (auto it = j.find("input"); it != j.end() && it->is_object()) {
    InputStats& in = m.input;
    in.present = true;
    in.mean = num(*it, "mean");
    in.std = num(*it, "std");
    in.absmax = num(*it, "absmax");
    in.samples = static_cast<int64_t>(num(*it, "samples"));
    in.max_id = static_cast<int64_t>(num(*it, "max_id", -1));
    in.max_absmax = num(*it, "max_absmax");
    in.median_absmax = num(*it, "median_absmax");
    if (auto ids = it->find("nonfinite_ids"); ids != it->end() && ids->is_array())
      for (const auto& v : *ids)
        if (v.is_number_integer()) in.nonfinite_ids.push_back(v.get<int64_t>());
  }
  m.elapsed_seconds = num(j, "elapsed_s", -1);
  if (auto it = j.find("totals"); it != j.end() && it->is_object()) {
    PhaseTotals& t = m.totals;
    t.steps = static_cast<int64_t>(num(*it, "steps"));
    t.step_s = num(*it, "step_s");
    t.data_s = num(*it, "data_s");
    t.forward_s = num(*it, "forward_s");
    t.backward_s = num(*it, "backward_s");
    t.optimizer_s = num(*it, "optimizer_s");
    t.comm_s = num(*it, "comm_s");
  }
  if (auto it = j.find("ranks"); it != j.end() && it->is_object())
    if (auto c = it->find("compute_s"); c != it->end() && c->is_array())
      for (const auto& v : *c) m.rank_compute_seconds.push_back(v.is_number() ? v.get<double>() : kNaN);
  return m;
}

HealthEvent event_from_json(const json& j) {
  HealthEvent e;
  e.step = j.value("step", int64_t{0});
  e.kind = j.value("kind", std::string("unknown"));
  e.severity = j.value("severity", std::string("warning"));
  e.message = j.value("message", std::string());
  if (auto it = j.find("suggestions"); it != j.end() && it->is_array())
    for (const auto& s : *it) e.suggestions.push_back(s.is_string() ? s.get<std::string>() : s.dump());
  if (auto it = j.find("details"); it != j.end() && it->is_object())
    for (const auto& [k, v] : it->items()) e.details[k] = v.is_string() ? v.get<std::string>() : v.dump();
  if (auto it = j.find("fix"); it != j.end() && it->is_object())
    for (const auto& [k, v] : it->items()) e.fix[k] = v.is_string() ? v.get<std::string>() : v.dump();
  return e;
}

}  // namespace

double median_loss(const std::vector<StepMetrics>& steps, size_t begin, size_t end) {
  std::vector<double> v;
  for (size_t i = begin; i < end && i < steps.size(); ++i)
    if (std::isfinite(steps[i].loss)) v.push_back(steps[i].loss);
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

RunRecord read_run(const std::string& run_dir) {
  const fs::path dir(run_dir);
  ATH_CHECK(fs::is_directory(dir), "doctor", "'", run_dir, "' is not a directory",
            Hint{"pass the run directory (the one holding metrics.jsonl), e.g. runs/my_run"});
  const fs::path metrics_path = dir / "metrics.jsonl";
  ATH_CHECK(fs::exists(metrics_path), "doctor", "no metrics.jsonl in '", run_dir, "'",
            Hint{"the doctor needs the metrics the Trainer writes; pass a run directory of `athanor train` (it may not have "
                 "reached its first step)"});
  RunRecord run;
  run.dir = run_dir;
  if (fs::exists(dir / "config.yaml")) {
    std::ifstream f(dir / "config.yaml");
    std::stringstream ss;
    ss << f.rdbuf();
    run.settings = RunSettings::from_yaml(ss.str(), (dir / "config.yaml").string());
  }
  if (fs::exists(dir / "run.json")) {
    try {
      std::ifstream f(dir / "run.json");
      const json j = json::parse(f);
      run.has_run_info = true;
      run.label_entropy = num(j, "label_entropy", -1);
      run.label_classes = static_cast<int64_t>(num(j, "label_classes", 0));
      run.global_batch = static_cast<int64_t>(num(j, "global_batch", 0));
      run.world_size = static_cast<int64_t>(num(j, "world_size", 1));
    } catch (const json::exception& e) {
      ATH_FAIL("doctor", (dir / "run.json").string(), " is not valid JSON (", e.what(), ")",
               Hint{"remove it: the doctor then recomputes the health checks from metrics.jsonl"});
    }
  }
  const ParsedLines metrics = read_jsonl(metrics_path);
  for (const json& j : metrics.lines) {
    if (j.contains("val_loss")) {
      EvalMetrics e;
      e.step = j.value("step", int64_t{0});
      e.loss = num(j, "val_loss");
      e.accuracy = num(j, "val_accuracy", -1);
      run.evals.push_back(e);
    } else if (j.contains("loss")) {
      run.steps.push_back(step_from_json(j));
    }
  }
  if (metrics.truncated_last) run.truncated = true, run.truncated_file = "metrics.jsonl";

  std::set<std::pair<std::string, int64_t>> seen;
  if (fs::exists(dir / "health.jsonl")) {
    const ParsedLines recorded = read_jsonl(dir / "health.jsonl");
    if (recorded.truncated_last && !run.truncated) run.truncated = true, run.truncated_file = "health.jsonl";
    for (const json& j : recorded.lines) {
      HealthEvent e = event_from_json(j);
      if (seen.insert({e.kind, e.step}).second) run.events.push_back(std::move(e));
    }
  }
  // Without run.json the run predates the online checks' full set (or was written by
  // other means): recompute the step-level checks from the logged steps.
  if (!run.has_run_info) {
    HealthOptions ho;
    ho.spike_window = static_cast<int64_t>(run.settings.number("health.spike_window", static_cast<double>(ho.spike_window)));
    ho.loss_spike_z = run.settings.number("health.loss_spike_z", ho.loss_spike_z);
    ho.grad_spike_z = run.settings.number("health.grad_spike_z", ho.grad_spike_z);
    // Logged steps are a sample of the run: a window of a fifth as many of them is warm.
    ho.min_samples = std::max<int64_t>(5, ho.spike_window / 5);
    HealthMonitor monitor(ho, run.settings);
    for (const StepMetrics& m : run.steps) {
      std::vector<HealthEvent> found = monitor.check_inputs(m);
      for (HealthEvent& e : monitor.check(m)) found.push_back(std::move(e));
      for (HealthEvent& e : found)
        if (seen.insert({e.kind, e.step}).second) run.events.push_back(std::move(e));
    }
  }
  std::stable_sort(run.events.begin(), run.events.end(), [](const HealthEvent& a, const HealthEvent& b) { return a.step < b.step; });
  return run;
}

}  // namespace detail

namespace {

using detail::fmt;

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0) return "n/a";
  std::ostringstream o;
  const int64_t t = static_cast<int64_t>(s);
  if (t >= 3600) o << t / 3600 << "h " << (t % 3600) / 60 << "m";
  else if (t >= 60) o << t / 60 << "m " << t % 60 << "s";
  else o << fmt(s) << "s";
  return o.str();
}

json event_json(const HealthEvent& e) {
  json j{{"step", e.step}, {"kind", e.kind}, {"severity", e.severity}, {"message", e.message}, {"suggestions", e.suggestions}};
  j["details"] = json::object();
  for (const auto& [k, v] : e.details) j["details"][k] = v;
  j["fix"] = json::object();
  for (const auto& [k, v] : e.fix) j["fix"][k] = v;
  return j;
}

}  // namespace

std::string DoctorReport::json() const {
  nlohmann::json j;
  j["healthy"] = healthy();
  j["finished"] = finished;
  j["errors"] = errors;
  j["findings"] = nlohmann::json::array();
  for (const auto& f : findings) j["findings"].push_back(event_json(f));
  j["problems"] = nlohmann::json::array();
  for (const auto& p : problems) j["problems"].push_back(event_json(p));
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

DoctorReport diagnose(const std::string& run_dir, const DoctorOptions& options) {
  const detail::RunRecord run = detail::read_run(run_dir);
  std::optional<detail::RunRecord> baseline;
  if (!options.baseline_dir.empty()) baseline = detail::read_run(options.baseline_dir);

  DoctorReport r;
  std::ostringstream o;
  o << "athanor doctor: " << run_dir << "\n";
  const auto& steps = run.steps;
  const int64_t last_step = steps.empty() ? 0 : steps.back().step;
  const double max_steps = run.settings.number("trainer.max_steps", -1);
  const double epochs = run.settings.number("trainer.epochs", 0);
  if (max_steps > 0 && epochs <= 0) {
    r.finished = last_step >= static_cast<int64_t>(max_steps);
    o << "status: " << (r.finished ? "finished" : "stopped early") << " (last step " << last_step << " of trainer.max_steps "
      << static_cast<int64_t>(max_steps) << ")\n";
  } else {
    o << "status: last step " << last_step
      << (epochs > 0 ? " (trainer.epochs " + fmt(epochs) + ")" : std::string(" (no trainer.max_steps in config.yaml to compare with)"))
      << "\n";
  }
  if (run.truncated)
    o << "note: the last line of " << run.truncated_file << " is cut off: the run was probably killed or crashed while writing it\n";

  if (steps.empty()) {
    o << "loss: no step lines in metrics.jsonl\n";
  } else {
    const size_t n = steps.size(), tail = std::max<size_t>(1, n / 10);
    size_t best = n;
    for (size_t i = 0; i < n; ++i)
      if (std::isfinite(steps[i].loss) && (best == n || steps[i].loss < steps[best].loss)) best = i;
    const double first = detail::median_loss(steps, 0, tail), last = detail::median_loss(steps, n - tail, n);
    o << "loss: " << fmt(first) << " (first " << tail << " logged steps) -> " << fmt(last) << " (last " << tail << ")";
    if (best < n) o << ", lowest " << fmt(steps[best].loss) << " at step " << steps[best].step;
    if (std::isfinite(first) && std::isfinite(last))
      o << (last < 0.98 * first ? "; decreasing" : last > 1.02 * first ? "; INCREASING (diverging)" : "; flat");
    o << "\n";
    int64_t nonfinite = 0;
    for (const auto& m : steps) nonfinite += !std::isfinite(m.loss);
    if (nonfinite) o << "non-finite loss on " << nonfinite << " of " << n << " logged steps\n";
    const StepMetrics& lastm = steps.back();
    if (lastm.totals.steps > 0) {
      const PhaseTotals& t = lastm.totals;
      auto share = [&](double v) { return fmt(t.step_s > 0 ? 100 * v / t.step_s : 0) + "%"; };
      o << "time: " << duration(lastm.elapsed_seconds) << " wall-clock; over all " << t.steps << " steps: data " << share(t.data_s)
        << ", forward " << share(t.forward_s) << ", backward " << share(t.backward_s) << ", optimizer " << share(t.optimizer_s);
      if (t.comm_s > 0) o << ", gradient wait " << share(t.comm_s);
      o << "\n";
    }
  }
  if (!run.evals.empty()) o << "validation loss: " << fmt(run.evals.back().loss) << " at step " << run.evals.back().step << "\n";
  std::vector<std::string> debug_keys;
  // The TEST ONLY knobs (config_schema.cpp) at values that change the run.
  static const std::map<std::string, double> kDebugOff = {{"debug.sample_delay_ms", 0}, {"debug.input_scale", 1},
                                                          {"debug.slow_rank", -1}};
  for (const auto& [k, v] : run.settings.values()) {
    if (k.rfind("debug.", 0) != 0) continue;
    const bool on = k == "debug.shuffle_labels"    ? v == "true"
                    : k == "debug.corrupt_samples" ? v != "[]"
                    : kDebugOff.count(k)           ? run.settings.number(k, kDebugOff.at(k)) != kDebugOff.at(k)
                                                   : false;
    if (on) debug_keys.push_back(k + ": " + v);
  }
  if (!debug_keys.empty()) {
    o << "note: this run has TEST ONLY fault knobs set:";
    for (const auto& k : debug_keys) o << " " << k << ";";
    o << "\n";
  }

  r.findings = detail::find_causes(run, baseline ? &*baseline : nullptr);
  r.problems = run.events;
  for (const auto& f : r.findings) r.errors += f.severity == "error";
  if (r.findings.empty()) {
    o << "no problems found\n";
  } else {
    o << "diagnosis: " << r.findings.size() << " problem" << (r.findings.size() > 1 ? "s" : "") << ", most likely cause first\n";
    int i = 0;
    for (const HealthEvent& f : r.findings) {
      o << "  " << ++i << ". [" << f.severity << "] " << f.kind << " (step " << f.step << "): " << f.message << "\n";
      if (!f.fix.empty()) {
        o << "      fix:";
        for (const auto& [k, v] : f.fix) o << " " << k << ": " << v << ";";
        o << "\n";
      }
      for (const auto& [k, v] : f.details) o << "      " << k << ": " << v << "\n";
      for (const auto& s : f.suggestions) o << "      try: " << s << "\n";
    }
    if (!run.events.empty()) {
      // One line per kind (its first event), with how many more and where they stopped.
      o << "evidence (health events, first of each kind):\n";
      std::set<std::string> shown;
      for (const HealthEvent& e : run.events) {
        if (!shown.insert(e.kind).second) continue;
        int64_t more = 0, last = e.step;
        for (const HealthEvent& x : run.events)
          if (x.kind == e.kind && &x != &e) ++more, last = std::max(last, x.step);
        o << "  [" << e.severity << "] step " << e.step << " " << e.kind << ": " << e.message;
        if (more) o << " (and " << more << " more, to step " << last << ")";
        o << "\n";
      }
    }
    o << "likely causes:\n";
    for (const HealthEvent& f : r.findings) {
      std::string line = f.message;
      if (const auto cut = line.find(": "); cut != std::string::npos && cut < 160) line = line.substr(0, cut);
      o << "  - " << f.kind << ": " << line;
      if (!f.fix.empty()) {
        o << " (fix:";
        for (const auto& [k, v] : f.fix) o << " " << k << ": " << v;
        o << ")";
      }
      o << "\n";
    }
  }
  r.text = o.str();
  return r;
}

}  // namespace athanor::observe
