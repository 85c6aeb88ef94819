#pragma once
// athanor::Error: every user mistake becomes one of these, never an abort.
// A message says what was wrong (op, shapes, dtypes), where (module path, file
// and key for configs), and what to do (a "hint:" line).
//
//   ATH_CHECK(a.dim() == 2, "matmul", "expected a 2-D tensor, got ", describe(a),
//             Hint{"reshape the input with reshape({-1, k})"});
//
// Text arguments are concatenated with operator<<; a Hint{...} argument becomes
// the hint line. ATH_CHECK is always on (it guards user input, not internal
// invariants); ATH_ASSERT is for internal invariants and reports a bug.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace athanor {

struct Hint {
  std::string text;
};

class Error : public std::runtime_error {
 public:
  Error(std::string op, std::string what, std::string hint, std::string module_path, std::string where);
  const std::string& op() const { return op_; }
  const std::string& message() const { return what_; }  // without op/hint decoration
  const std::string& hint() const { return hint_; }
  const std::string& module_path() const { return module_path_; }

 private:
  std::string op_, what_, hint_, module_path_;
};

// The module currently running forward (set by nn::Module); errors and autograd
// nodes record it so a failure names `transformer.h.3.attn`, not just `matmul`.
class ModuleScope {
 public:
  explicit ModuleScope(const std::string& name);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;
};
const std::string& current_module_path();

// Levenshtein distance between two names, for the "did you mean" of an error's hint.
size_t edit_distance(const std::string& a, const std::string& b);

namespace detail {
struct MessageBuilder {
  std::ostringstream text;
  std::string hint;
  template <class T> MessageBuilder& add(const T& v) { text << v; return *this; }
  MessageBuilder& add(const Hint& h) { hint = h.text; return *this; }
};
template <class... Args> std::pair<std::string, std::string> build_message(const Args&... args) {
  MessageBuilder b;
  (b.add(args), ...);
  return {b.text.str(), b.hint};
}
[[noreturn]] void throw_error(const std::string& op, const char* file, int line, std::pair<std::string, std::string> msg);
}  // namespace detail

}  // namespace athanor

#define ATH_FAIL(op, ...) ::athanor::detail::throw_error((op), __FILE__, __LINE__, ::athanor::detail::build_message(__VA_ARGS__))
#define ATH_CHECK(cond, op, ...)        \
  do {                                  \
    if (!(cond)) [[unlikely]] ATH_FAIL((op), __VA_ARGS__); \
  } while (0)
#define ATH_ASSERT(cond) \
  ATH_CHECK(cond, "internal", "internal invariant violated: " #cond, ::athanor::Hint{"this is a bug in athanor; please report it with the stack above"})
