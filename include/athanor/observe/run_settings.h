#pragma once
// The run's resolved config as flat dotted keys ("optimizer.lr" -> "0.002"), read by
// the health monitor and the doctor so that their advice fits the run: a remedy is
// phrased against the value the run has, and nothing already set is suggested.
//
//   RunSettings s = RunSettings::from_yaml(config_yaml_text);
//   Remedy r = remedy_warmup(s);   // "add a linear warm-up: schedule.warmup_steps: 100"
//                                  // (or, when one is set, lengthen it); r.fix = {key, value}
//
// The observe layer does not see train::Config; the trainer passes its resolved YAML.
#include <map>
#include <optional>
#include <string>

namespace athanor::observe {

class RunSettings {
 public:
  RunSettings() = default;
  explicit RunSettings(std::map<std::string, std::string> flat) : values_(std::move(flat)) {}
  // The text of a config.yaml (nested maps; scalars become dotted keys; lists "[a, b]").
  // Raises athanor::Error naming `source` when the text is not YAML.
  static RunSettings from_yaml(const std::string& text, const std::string& source = "config.yaml");
  bool empty() const { return values_.empty(); }
  bool has(const std::string& key) const { return values_.count(key) > 0; }
  std::string text(const std::string& key, const std::string& fallback = "") const;
  double number(const std::string& key, double fallback) const;  // fallback when absent or not a number
  bool flag(const std::string& key, bool fallback) const;
  const std::map<std::string, std::string>& values() const { return values_; }

 private:
  std::map<std::string, std::string> values_;
};

// One piece of advice: what to do, and the config change that does it (if any).
struct Remedy {
  std::string text;                          // "enable gradient clipping (optimizer.grad_clip: 1.0)"
  std::map<std::string, std::string> fix;    // {"optimizer.grad_clip": "1.0"}; empty = no config change
};

// A number as a config value: 3 significant digits, no trailing zeros ("0.002", "6e-05").
std::string config_number(double v);
// v rounded down to 1, 2 or 5 times a power of ten (a learning rate a person would write).
double round_down_125(double v);
// v rounded to the nearest (in ratio) of 1, 2 or 5 times a power of ten.
double round_125(double v);

// The remedies below read the settings and return std::nullopt when the change they
// would make is already in place (the fix would be what the run has).
std::optional<Remedy> remedy_set_lr(const RunSettings& s, double lr, const std::string& why);
std::optional<Remedy> remedy_warmup(const RunSettings& s, int64_t at_least_steps = 0);
std::optional<Remedy> remedy_clip(const RunSettings& s);
std::optional<Remedy> remedy_bf16(const RunSettings& s);

}  // namespace athanor::observe
