// RunSettings (flattened config.yaml) and the remedies that read it (observe/run_settings.h).
#include "athanor/observe/run_settings.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <functional>

#include "athanor/core/error.h"

namespace athanor::observe {

RunSettings RunSettings::from_yaml(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    ATH_FAIL("doctor", "cannot parse ", source, ": ", e.what(), Hint{"fix or remove the file; the doctor can work without it"});
  }
  std::map<std::string, std::string> flat;
  std::function<void(const YAML::Node&, const std::string&)> walk = [&](const YAML::Node& n, const std::string& prefix) {
    if (n.IsMap()) {
      for (const auto& kv : n) walk(kv.second, prefix.empty() ? kv.first.as<std::string>() : prefix + "." + kv.first.as<std::string>());
    } else if (n.IsScalar()) {
      flat[prefix] = n.as<std::string>();
    } else if (n.IsSequence()) {
      std::string v = "[";
      for (size_t i = 0; i < n.size(); ++i) v += (i ? ", " : "") + (n[i].IsScalar() ? n[i].as<std::string>() : std::string("?"));
      flat[prefix] = v + "]";
    }
  };
  walk(root, "");
  return RunSettings(std::move(flat));
}

std::string RunSettings::text(const std::string& key, const std::string& fallback) const {
  auto it = values_.find(key);
  return it == values_.end() ? fallback : it->second;
}

double RunSettings::number(const std::string& key, double fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  try {
    size_t used = 0;
    const double v = std::stod(it->second, &used);
    return used == it->second.size() ? v : fallback;
  } catch (...) {
    return fallback;
  }
}

bool RunSettings::flag(const std::string& key, bool fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  if (it->second == "true") return true;
  if (it->second == "false") return false;
  return fallback;
}

std::string config_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}

double round_down_125(double v) {
  if (!(v > 0) || !std::isfinite(v)) return v;
  const double p = std::pow(10.0, std::floor(std::log10(v)));
  const double m = v / p;
  // 1e-12 of slack: 0.3 / 0.1 is 2.9999999999999996 in binary.
  return (m >= 5 - 1e-9 ? 5 : m >= 2 - 1e-9 ? 2 : 1) * p;
}

double round_125(double v) {
  if (!(v > 0) || !std::isfinite(v)) return v;
  const double p = std::pow(10.0, std::floor(std::log10(v)));
  double best = p;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (std::fabs(std::log(m * p / v)) < std::fabs(std::log(best / v))) best = m * p;
  return best;
}

std::optional<Remedy> remedy_set_lr(const RunSettings& s, double lr, const std::string& why) {
  const double now = s.number("optimizer.lr", -1);
  const std::string value = config_number(lr);
  if (now > 0 && config_number(now) == value) return std::nullopt;
  Remedy r;
  r.text = (now > 0 ? std::string(lr < now ? "lower" : "raise") + " optimizer.lr from " + config_number(now) + " to " + value
                    : "set optimizer.lr: " + value) +
           (why.empty() ? "" : " (" + why + ")");
  r.fix["optimizer.lr"] = value;
  return r;
}

std::optional<Remedy> remedy_warmup(const RunSettings& s, int64_t at_least_steps) {
  const double now = s.number("schedule.warmup_steps", 0);
  const double max_steps = s.number("trainer.max_steps", 0);
  // A few percent of the run (GPT-2/3 recipes warm up over ~0.5-5% of training), at least
  // what the caller saw was needed, and a round number.
  int64_t want = std::max<int64_t>(at_least_steps, max_steps > 0 ? static_cast<int64_t>(0.05 * max_steps) : 100);
  want = std::max<int64_t>(want, 20);
  want = (want + 9) / 10 * 10;
  Remedy r;
  if (now <= 0) {
    r.text = "add a linear learning-rate warm-up: schedule.warmup_steps: " + std::to_string(want);
  } else {
    if (static_cast<double>(want) <= now) want = static_cast<int64_t>(2 * now);
    r.text = "lengthen the warm-up: schedule.warmup_steps from " + config_number(now) + " to " + std::to_string(want);
  }
  r.fix["schedule.warmup_steps"] = std::to_string(want);
  return r;
}

std::optional<Remedy> remedy_clip(const RunSettings& s) {
  const double now = s.number("optimizer.grad_clip", 0);
  Remedy r;
  if (now <= 0) {
    r.text = "enable gradient clipping: optimizer.grad_clip: 1.0";
    r.fix["optimizer.grad_clip"] = "1.0";
  } else if (now > 0.25) {
    const std::string v = config_number(now / 4);
    r.text = "clip harder: optimizer.grad_clip from " + config_number(now) + " to " + v;
    r.fix["optimizer.grad_clip"] = v;
  } else {
    return std::nullopt;  // already tight: clipping is not what is missing
  }
  return r;
}

std::optional<Remedy> remedy_bf16(const RunSettings& s) {
  if (s.text("trainer.precision", "f32") != "f16") return std::nullopt;
  Remedy r;
  r.text = "use trainer.precision: bf16 (the range of f32, no loss scaling needed)";
  r.fix["trainer.precision"] = "bf16";
  return r;
}

}  // namespace athanor::observe
