#include "athanor/observe/doctor.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "athanor/core/error.h"
#include "athanor/observe/health.h"

namespace athanor::observe {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double num(const json& j, const char* key, double fallback = 0) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (it->is_null()) return kNaN;  // non-finite numbers are written as null
  return it->is_number() ? it->get<double>() : fallback;
}

// config.yaml, flattened to dotted keys ("trainer.max_steps"); empty if absent.
std::map<std::string, std::string> read_config(const fs::path& path) {
  std::map<std::string, std::string> flat;
  if (!fs::exists(path)) return flat;
  YAML::Node root;
  try {
    root = YAML::LoadFile(path.string());
  } catch (const YAML::Exception& e) {
    ATH_FAIL("doctor", "cannot parse ", path.string(), ": ", e.what(), Hint{"fix or remove the file; the doctor can work without it"});
  }
  std::function<void(const YAML::Node&, const std::string&)> walk = [&](const YAML::Node& n, const std::string& prefix) {
    if (n.IsMap()) {
      for (const auto& kv : n) walk(kv.second, prefix.empty() ? kv.first.as<std::string>() : prefix + "." + kv.first.as<std::string>());
    } else if (n.IsScalar()) {
      flat[prefix] = n.as<std::string>();
    }
  };
  walk(root, "");
  return flat;
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
      out.lines.push_back(json::parse(raw[i]));
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
  m.loss_nonfinite = !std::isfinite(m.loss);
  if (auto it = j.find("nonfinite_params"); it != j.end() && it->is_array())
    for (const auto& p : *it) m.nonfinite_params.push_back(p.get<std::string>());
  if (auto it = j.find("layers"); it != j.end() && it->is_object())
    for (const auto& [name, v] : it->items()) m.layers.push_back({name, num(v, "grad"), num(v, "param")});
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
  return e;
}

std::string fmt(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : "inf";
  std::ostringstream o;
  o.precision(4);
  o << v;
  return o.str();
}

double get_number(const std::map<std::string, std::string>& cfg, const std::string& key, double fallback) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return fallback;
  try {
    return std::stod(it->second);
  } catch (...) {
    return fallback;
  }
}

// Mean of the finite losses in [begin, end).
double mean_loss(const std::vector<StepMetrics>& steps, size_t begin, size_t end) {
  double s = 0;
  int n = 0;
  for (size_t i = begin; i < end && i < steps.size(); ++i)
    if (std::isfinite(steps[i].loss)) s += steps[i].loss, ++n;
  return n ? s / n : kNaN;
}

}  // namespace

DoctorReport diagnose(const std::string& run_dir) {
  const fs::path dir(run_dir);
  ATH_CHECK(fs::is_directory(dir), "doctor", "'", run_dir, "' is not a directory",
            Hint{"pass the run directory (the one holding metrics.jsonl), e.g. runs/my_run"});
  const fs::path metrics_path = dir / "metrics.jsonl";
  ATH_CHECK(fs::exists(metrics_path), "doctor", "no metrics.jsonl in '", run_dir, "'",
            Hint{"the doctor needs the metrics the Trainer writes; pass a run directory of `athanor train` (it may not have "
                 "reached its first step)"});

  const auto cfg = read_config(dir / "config.yaml");
  const ParsedLines metrics = read_jsonl(metrics_path);
  std::vector<StepMetrics> steps;
  std::vector<std::pair<int64_t, double>> evals;
  for (const json& j : metrics.lines) {
    if (j.contains("val_loss")) evals.emplace_back(j.value("step", int64_t{0}), num(j, "val_loss"));
    else if (j.contains("loss")) steps.push_back(step_from_json(j));
  }

  // Offline health check with the run's settings, merged with the recorded events.
  HealthOptions ho;
  ho.spike_window = static_cast<int64_t>(get_number(cfg, "health.spike_window", ho.spike_window));
  ho.loss_spike_z = get_number(cfg, "health.loss_spike_z", ho.loss_spike_z);
  ho.grad_spike_z = get_number(cfg, "health.grad_spike_z", ho.grad_spike_z);
  HealthMonitor monitor(ho);
  std::vector<HealthEvent> problems;
  std::set<std::pair<std::string, int64_t>> seen;
  bool health_truncated = false;
  if (fs::exists(dir / "health.jsonl")) {
    const ParsedLines recorded = read_jsonl(dir / "health.jsonl");
    health_truncated = recorded.truncated_last;
    for (const json& j : recorded.lines) {
      HealthEvent e = event_from_json(j);
      if (seen.insert({e.kind, e.step}).second) problems.push_back(std::move(e));
    }
  }
  for (const StepMetrics& m : steps)
    for (HealthEvent& e : monitor.check(m))
      if (seen.insert({e.kind, e.step}).second) problems.push_back(std::move(e));
  std::stable_sort(problems.begin(), problems.end(), [](const HealthEvent& a, const HealthEvent& b) { return a.step < b.step; });

  DoctorReport r;
  std::ostringstream o;
  o << "athanor doctor: " << run_dir << "\n";
  const int64_t last_step = steps.empty() ? 0 : steps.back().step;
  const double max_steps = get_number(cfg, "trainer.max_steps", -1);
  if (max_steps > 0) {
    r.finished = last_step >= static_cast<int64_t>(max_steps);
    o << "status: " << (r.finished ? "finished" : "stopped early") << " (last step " << last_step << " of trainer.max_steps "
      << static_cast<int64_t>(max_steps) << ")\n";
  } else {
    o << "status: last step " << last_step << " (no trainer.max_steps in config.yaml to compare with)\n";
  }
  if (metrics.truncated_last || health_truncated)
    o << "note: the last line of " << (metrics.truncated_last ? "metrics.jsonl" : "health.jsonl")
      << " is cut off: the run was probably killed or crashed while writing it\n";

  if (steps.empty()) {
    o << "loss: no step lines in metrics.jsonl\n";
  } else {
    const size_t n = steps.size(), tail = std::max<size_t>(1, n / 10);
    size_t best = n;
    for (size_t i = 0; i < n; ++i)
      if (std::isfinite(steps[i].loss) && (best == n || steps[i].loss < steps[best].loss)) best = i;
    const double first = mean_loss(steps, 0, tail), last = mean_loss(steps, n - tail, n);
    o << "loss: " << fmt(first) << " (first " << tail << " steps) -> " << fmt(last) << " (last " << tail << " steps)";
    if (best < n) o << ", lowest " << fmt(steps[best].loss) << " at step " << steps[best].step;
    if (std::isfinite(first) && std::isfinite(last))
      o << (last < 0.98 * first ? "; decreasing" : last > 1.02 * first ? "; INCREASING (diverging)" : "; flat");
    o << "\n";
    int64_t nonfinite = 0;
    for (const auto& m : steps) nonfinite += !std::isfinite(m.loss);
    if (nonfinite) o << "non-finite loss on " << nonfinite << " of " << n << " steps\n";
  }
  if (!evals.empty()) o << "validation loss: " << fmt(evals.back().second) << " at step " << evals.back().first << "\n";

  if (problems.empty()) {
    o << "no problems found\n";
  } else {
    o << "problems found: " << problems.size() << "\n";
    for (const HealthEvent& e : problems) {
      r.errors += e.severity == "error";
      o << "  [" << e.severity << "] step " << e.step << " " << e.kind << ": " << e.message << "\n";
      for (const auto& [k, v] : e.details) o << "      " << k << ": " << v << "\n";
      for (const auto& s : e.suggestions) o << "      try: " << s << "\n";
    }
  }
  // The most likely causes, in one line each, before the details above are read.
  std::vector<std::string> causes;
  auto any = [&](std::initializer_list<const char*> kinds) {
    for (const auto& e : problems)
      for (const char* k : kinds)
        if (e.kind == k) return &e;
    return static_cast<const HealthEvent*>(nullptr);
  };
  if (const HealthEvent* e = any({"nan_origin"})) {
    auto d = [&](const char* k) { auto it = e->details.find(k); return it == e->details.end() ? std::string("?") : it->second; };
    std::string c = "NaN/Inf first appeared at step " + std::to_string(e->step) + " in op '" + d("op") + "'";
    if (e->details.count("module")) c += " of module " + d("module");
    if (e->details.count("phase")) c += " (" + d("phase") + ")";
    if (e->details.count("file")) c += "; its inputs are saved in " + d("file") + " for replay";
    causes.push_back(c);
  }
  else if (const HealthEvent* e = any({"nonfinite"}))
    causes.push_back("non-finite loss or gradients from step " + std::to_string(e->step) +
                     " with no recorded origin: set health.diagnose_nonfinite: true and rerun from the last checkpoint "
                     "to find the op and module");
  if (any({"loss_spike", "grad_spike", "exploding_gradients"})) {
    auto lr = cfg.find("optimizer.lr");
    causes.push_back("training is unstable, most often a learning rate too high for the model/batch: lower optimizer.lr" +
                     (lr == cfg.end() ? std::string() : " (now " + lr->second + ")") +
                     " (e.g. divide by 3-10), add schedule.warmup_steps, set optimizer.grad_clip: 1.0");
  }
  if (any({"scale_collapse"}))
    causes.push_back("f16 keeps overflowing (the loss scale collapses): use trainer.precision: bf16");
  if (any({"vanishing_gradients"}))
    causes.push_back("some layers barely get gradient: check activations, normalization and initialization");
  if (!causes.empty()) {
    o << "likely causes:\n";
    for (const auto& c : causes) o << "  - " << c << "\n";
  }
  r.problems = std::move(problems);
  r.text = o.str();
  return r;
}

}  // namespace athanor::observe
