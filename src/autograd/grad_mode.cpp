#include "athanor/autograd/grad_mode.h"

#include "athanor/autograd/backward_pass.h"

#include <atomic>

namespace athanor {
namespace {
thread_local bool tls_grad_enabled = true;
thread_local int tls_backward_apply_depth = 0;
std::atomic<bool> g_anomaly{false};
}  // namespace

bool grad_enabled() { return tls_grad_enabled; }
void set_grad_enabled(bool on) { tls_grad_enabled = on; }
NoGradGuard::NoGradGuard() : prev_(tls_grad_enabled) { tls_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { tls_grad_enabled = prev_; }
EnableGradGuard::EnableGradGuard() : prev_(tls_grad_enabled) { tls_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { tls_grad_enabled = prev_; }

bool anomaly_mode_enabled() { return g_anomaly.load(std::memory_order_relaxed); }
AnomalyModeGuard::AnomalyModeGuard(bool on) : prev_(g_anomaly.load()) { g_anomaly.store(on); }
AnomalyModeGuard::~AnomalyModeGuard() { g_anomaly.store(prev_); }

bool in_backward_apply() { return tls_backward_apply_depth > 0; }
BackwardApplyScope::BackwardApplyScope() { ++tls_backward_apply_depth; }
BackwardApplyScope::~BackwardApplyScope() { --tls_backward_apply_depth; }

}  // namespace athanor
