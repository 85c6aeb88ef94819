#pragma once
// The thread's compute precision: whether ops run under autocast, and at which
// low-precision dtype. The state lives here, in core, so that recompute (autograd's
// activation checkpointing) can save it with a forward and restore it for the replay
// without reaching up into the ops layer; ops' `autocast` guard (athanor/ops/autocast.h)
// is the user-facing way to set it, and the op dispatch reads it.
//
// Invariants: per thread; scopes nest and restore the outer state on exit; when the
// outermost scope on a thread exits, the registered region-exit hook runs on that thread
// (ops' autocast empties its per-region cast cache there).
#include "athanor/core/dtype.h"

namespace athanor {

struct Precision {
  bool autocast = false;
  DType dtype = DType::bf16;  // the low-precision dtype (bf16 or f16) when autocast is on
  bool operator==(const Precision&) const = default;
};

Precision current_precision();

// Sets the thread's precision for a scope. Checks nothing: callers validate the dtype.
class PrecisionScope {
 public:
  explicit PrecisionScope(Precision p);
  ~PrecisionScope();
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  Precision prev_;
};

// Runs on a thread when its outermost PrecisionScope exits. One hook (the last set wins).
void set_precision_region_exit_hook(void (*hook)());

}  // namespace athanor
