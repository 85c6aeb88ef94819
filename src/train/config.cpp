#include "athanor/train/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>

#include "athanor/core/error.h"

namespace athanor::train {

namespace {
const ConfigKey* find_key(const std::string& path) {
  for (const auto& k : config_schema())
    if (k.path == path) return &k;
  return nullptr;
}

std::string nearest_key(const std::string& path) {
  // Candidates: the keys of the section the user wrote (they know the section,
  // they mistyped the key), or every key when the section itself is unknown.
  const auto dot = path.rfind('.');
  const std::string section = dot == std::string::npos ? "" : path.substr(0, dot + 1);
  bool section_known = false;
  for (const auto& k : config_schema()) section_known = section_known || (!section.empty() && k.path.rfind(section, 0) == 0);
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& k : config_schema()) {
    if (section_known && k.path.rfind(section, 0) != 0) continue;
    const size_t d = edit_distance(path, k.path);
    if (d < best_d) best_d = d, best = k.path;
  }
  return best;
}

const char* type_name(const ConfigValue& v) {
  switch (v.index()) {
    case 0: return "an integer";
    case 1: return "a number";
    case 2: return "a boolean (true/false)";
    case 3: return "a string";
    case 4: return "a list of integers";
    case 5: return "a list of numbers";
  }
  return "?";
}

bool parse_int(const std::string& s, int64_t& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}
bool parse_float(const std::string& s, double& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

[[noreturn]] void type_error(const std::string& source, const ConfigKey& k, const std::string& given) {
  ATH_FAIL("config", source, ": key '", k.path, "' must be ", type_name(k.default_value), ", got '", given, "'",
           Hint{k.path + ": " + k.doc});
}

// Converts a YAML node to the key's type.
ConfigValue convert(const YAML::Node& n, const ConfigKey& k, const std::string& source) {
  auto scalar_text = [&]() -> std::string {
    if (!n.IsScalar()) {
      std::ostringstream o;
      o << n;
      type_error(source, k, o.str());
    }
    return n.Scalar();
  };
  switch (k.default_value.index()) {
    case 0: {
      int64_t v;
      const std::string s = scalar_text();
      if (!parse_int(s, v)) type_error(source, k, s);
      return v;
    }
    case 1: {
      double v;
      const std::string s = scalar_text();
      if (!parse_float(s, v)) type_error(source, k, s);
      return v;
    }
    case 2: {
      const std::string s = scalar_text();
      if (s == "true" || s == "yes" || s == "on") return true;
      if (s == "false" || s == "no" || s == "off") return false;
      type_error(source, k, s);
    }
    case 3: {
      const std::string s = scalar_text();
      if (!k.choices.empty() && std::find(k.choices.begin(), k.choices.end(), s) == k.choices.end()) {
        std::string all;
        for (auto& c : k.choices) all += (all.empty() ? "" : ", ") + c;
        std::string near = k.choices.front();
        for (auto& c : k.choices)
          if (edit_distance(c, s) < edit_distance(near, s)) near = c;
        ATH_FAIL("config", source, ": key '", k.path, "' is '", s, "', which is not one of: ", all,
                 Hint{"did you mean '" + near + "'?"});
      }
      return s;
    }
    case 4:
    case 5: {
      if (!n.IsSequence()) {
        std::ostringstream o;
        o << n;
        type_error(source, k, o.str());
      }
      std::vector<int64_t> ints;
      std::vector<double> floats;
      for (const auto& e : n) {
        const std::string s = e.IsScalar() ? e.Scalar() : "?";
        int64_t iv;
        double fv;
        if (k.default_value.index() == 4) {
          if (!parse_int(s, iv)) type_error(source, k, s);
          ints.push_back(iv);
        } else {
          if (!parse_float(s, fv)) type_error(source, k, s);
          floats.push_back(fv);
        }
      }
      if (k.default_value.index() == 4) return ints;
      return floats;
    }
  }
  return k.default_value;
}

void flatten(const YAML::Node& node, const std::string& prefix, std::vector<std::pair<std::string, YAML::Node>>& out,
             const std::string& source) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      if (kv.second.IsMap() && !find_key(path)) flatten(kv.second, path, out, source);
      else out.emplace_back(path, kv.second);
    }
  } else if (!node.IsNull()) {
    ATH_FAIL("config", source, ": the top level must be a mapping of sections (model:, data:, …)",
             Hint{"see examples/*.yaml"});
  }
}

void apply(std::map<std::string, ConfigValue>& values, std::map<std::string, bool>& user_set, const std::string& path,
           const YAML::Node& node, const std::string& source) {
  const ConfigKey* k = find_key(path);
  if (!k) {
    // A section name given a scalar, or an unknown key.
    ATH_FAIL("config", source, ": unknown key '", path, "'", Hint{"did you mean '" + nearest_key(path) + "'?"});
  }
  values[path] = convert(node, *k, source);
  user_set[path] = true;
}

bool applies(const ConfigKey& k, const std::map<std::string, ConfigValue>& values) {
  if (k.applies_to.empty()) return true;
  const auto eq = k.applies_to.find('=');
  const std::string key = k.applies_to.substr(0, eq);
  const ConfigValue& cv = values.at(key);  // a string choice or a bool ("profile.enabled=true")
  const std::string v = std::holds_alternative<bool>(cv) ? (std::get<bool>(cv) ? "true" : "false") : std::get<std::string>(cv);
  // The allowed values are separated by '|'.
  std::string_view rest = std::string_view(k.applies_to).substr(eq + 1);
  while (true) {
    const auto bar = rest.find('|');
    if (rest.substr(0, bar) == v) return true;
    if (bar == std::string_view::npos) return false;
    rest.remove_prefix(bar + 1);
  }
}
}  // namespace

Config Config::parse(const std::string& text, const std::string& source, const std::vector<std::string>& overrides) {
  Config c;
  c.source_ = source;
  for (const auto& k : config_schema()) c.values_[k.path] = k.default_value;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    ATH_FAIL("config", source, ": invalid YAML at line ", e.mark.line + 1, ", column ", e.mark.column + 1, ": ", e.msg,
             Hint{"check the indentation and the ':' after each key"});
  }
  std::vector<std::pair<std::string, YAML::Node>> leaves;
  flatten(root, "", leaves, source);
  for (auto& [path, node] : leaves) apply(c.values_, c.user_set_, path, node, source);
  for (const std::string& o : overrides) {
    const auto eq = o.find('=');
    ATH_CHECK(eq != std::string::npos && eq > 0, "config", "override '", o, "' is not key.path=value",
              Hint{"e.g. trainer.max_steps=100"});
    YAML::Node v;
    try {
      v = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      ATH_FAIL("config", "override '", o, "': invalid value: ", e.msg);
    }
    apply(c.values_, c.user_set_, o.substr(0, eq), v, "override '" + o + "'");
  }
  for (const auto& k : config_schema())
    if (c.user_set_.count(k.path) && !applies(k, c.values_)) {
      const std::string key = k.applies_to.substr(0, k.applies_to.find('='));
      ATH_FAIL("config", source, ": key '", k.path, "' does not apply when ", key, " is '",
               (std::holds_alternative<bool>(c.values_.at(key)) ? (std::get<bool>(c.values_.at(key)) ? "true" : "false")
                                                                          : std::get<std::string>(c.values_.at(key))),
               "' (it applies to ", k.applies_to, ")",
               Hint{"remove it, or change " + key});
    }
  return c;
}

Config Config::load(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream f(path);
  ATH_CHECK(f.good(), "config", "cannot open config file '", path, "'", Hint{"check the path; examples are in examples/*.yaml"});
  std::stringstream ss;
  ss << f.rdbuf();
  return parse(ss.str(), path, overrides);
}

const ConfigValue& Config::value(const std::string& path) const {
  auto it = values_.find(path);
  ATH_CHECK(it != values_.end(), "config", "no key '", path, "' in the schema", Hint{"this is a bug in athanor"});
  return it->second;
}

int64_t Config::get_int(const std::string& p) const { return std::get<int64_t>(value(p)); }
double Config::get_float(const std::string& p) const {
  const auto& v = value(p);
  return v.index() == 0 ? static_cast<double>(std::get<int64_t>(v)) : std::get<double>(v);
}
bool Config::get_bool(const std::string& p) const { return std::get<bool>(value(p)); }
const std::string& Config::get_string(const std::string& p) const { return std::get<std::string>(value(p)); }
std::vector<int64_t> Config::get_int_list(const std::string& p) const { return std::get<std::vector<int64_t>>(value(p)); }
std::vector<double> Config::get_float_list(const std::string& p) const { return std::get<std::vector<double>>(value(p)); }
bool Config::is_set(const std::string& p) const { return user_set_.count(p) != 0; }
void Config::set(const std::string& p, ConfigValue v) {
  ATH_CHECK(value(p).index() == v.index(), "config", "internal: wrong type for ", p);
  values_[p] = std::move(v);
}

std::string Config::resolved_yaml() const {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string section;
  bool open = false;
  for (const auto& k : config_schema()) {
    if (!applies(k, values_)) continue;
    const auto dot = k.path.find('.');
    const std::string sec = dot == std::string::npos ? "" : k.path.substr(0, dot);
    const std::string leaf = dot == std::string::npos ? k.path : k.path.substr(dot + 1);
    if (sec != section) {
      if (open) out << YAML::EndMap;
      open = false;
      section = sec;
      if (!sec.empty()) {
        out << YAML::Key << sec << YAML::Value << YAML::BeginMap;
        open = true;
      }
    }
    out << YAML::Key << leaf << YAML::Value;
    std::visit([&](const auto& v) {
      using T = std::decay_t<decltype(v)>;
      if constexpr (std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<double>>) {
        out << YAML::Flow << YAML::BeginSeq;
        for (auto x : v) out << x;
        out << YAML::EndSeq;
      } else {
        out << v;
      }
    }, values_.at(k.path));
  }
  if (open) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace athanor::train
