#include "athanor/core/precision.h"

#include <atomic>

namespace athanor {
namespace {
struct State {
  Precision p;
  int depth = 0;
};
thread_local State t_state;
std::atomic<void (*)()> g_exit_hook{nullptr};
}  // namespace

Precision current_precision() { return t_state.p; }

PrecisionScope::PrecisionScope(Precision p) : prev_(t_state.p) {
  t_state.p.autocast = p.autocast;
  if (p.autocast) t_state.p.dtype = p.dtype;  // a disabling scope keeps the outer dtype (autocast_dtype() reads it)
  ++t_state.depth;
}

PrecisionScope::~PrecisionScope() {
  t_state.p = prev_;
  if (--t_state.depth == 0)
    if (void (*hook)() = g_exit_hook.load(std::memory_order_acquire)) hook();
}

void set_precision_region_exit_hook(void (*hook)()) { g_exit_hook.store(hook, std::memory_order_release); }

}  // namespace athanor
