#include "athanor/core/error.h"

#include <algorithm>
#include <cstring>

namespace athanor {
namespace {
thread_local std::vector<std::string> module_stack;
thread_local std::string module_path_cache;

std::string format(const std::string& op, const std::string& what, const std::string& hint,
                   const std::string& module_path, const std::string& where) {
  std::string s = "athanor::Error in " + op;
  if (!module_path.empty()) s += " (module " + module_path + ")";
  s += ": " + what;
  if (!hint.empty()) s += "\n  hint: " + hint;
  if (!where.empty()) s += "\n  at " + where;
  return s;
}

void rebuild_path() {
  module_path_cache.clear();
  for (const auto& m : module_stack) {
    if (m.empty()) continue;
    if (!module_path_cache.empty()) module_path_cache += '.';
    module_path_cache += m;
  }
}
}  // namespace

Error::Error(std::string op, std::string what, std::string hint, std::string module_path, std::string where)
    : std::runtime_error(format(op, what, hint, module_path, where)),
      op_(std::move(op)), what_(std::move(what)), hint_(std::move(hint)), module_path_(std::move(module_path)) {}

ModuleScope::ModuleScope(const std::string& name) { module_stack.push_back(name); rebuild_path(); }
ModuleScope::~ModuleScope() { module_stack.pop_back(); rebuild_path(); }
const std::string& current_module_path() { return module_path_cache; }

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace detail {
void throw_error(const std::string& op, const char* file, int line, std::pair<std::string, std::string> msg) {
  const char* rel = std::strstr(file, "/src/");
  if (!rel) rel = std::strstr(file, "/include/");
  std::string where = std::string(rel ? rel + 1 : file) + ":" + std::to_string(line);
  throw Error(op, std::move(msg.first), std::move(msg.second), current_module_path(), where);
}
}  // namespace detail
}  // namespace athanor
