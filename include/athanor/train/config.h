#pragma once
// The run configuration: a YAML file plus `key.path=value` overrides, checked
// against one schema. Every key has a type, a default and a description; an
// unknown key is an error that suggests the nearest valid key, a wrong type
// names the key path, the expected type and the value given, and keys that do
// not apply to the chosen model/data type are rejected rather than ignored.
// resolved_yaml() writes every key (defaults included) as the run used it.
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace athanor::train {

using ConfigValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>, std::vector<double>>;

struct ConfigKey {
  std::string path;         // "trainer.max_steps"
  ConfigValue default_value;
  std::string doc;
  // "= {}": schema entries may leave these out without -Wmissing-field-initializers.
  std::string applies_to = {};   // "" = always; "model.type=gpt" = only when model.type is gpt (| separates choices)
  std::vector<std::string> choices = {};  // allowed strings, if any
};

const std::vector<ConfigKey>& config_schema();

class Config {
 public:
  // Parses YAML text (source names the file in errors), applies overrides, validates.
  static Config parse(const std::string& yaml_text, const std::string& source,
                      const std::vector<std::string>& overrides = {});
  static Config load(const std::string& path, const std::vector<std::string>& overrides = {});

  int64_t get_int(const std::string& path) const;
  double get_float(const std::string& path) const;  // ints are accepted where floats are expected
  bool get_bool(const std::string& path) const;
  const std::string& get_string(const std::string& path) const;
  std::vector<int64_t> get_int_list(const std::string& path) const;
  std::vector<double> get_float_list(const std::string& path) const;
  bool is_set(const std::string& path) const;  // given by the user (file or override), not a default
  void set(const std::string& path, ConfigValue v);  // for derived values (e.g. vocab_size from the tokenizer)

  std::string resolved_yaml() const;  // every applicable key, nested, with values as used
  const std::string& source() const { return source_; }

 private:
  const ConfigValue& value(const std::string& path) const;
  std::map<std::string, ConfigValue> values_;
  std::map<std::string, bool> user_set_;
  std::string source_;
};

}  // namespace athanor::train
