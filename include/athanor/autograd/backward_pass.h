#pragma once
// Whether this thread is inside the backward engine's apply() of a node. The ops a backward
// closure calls are that node's arithmetic: anomaly mode checks the node's outputs ("backward
// of '<node>'"), not each op's forward, so that a non-finite gradient is reported against the
// node that made it (the op dispatch point reads this).
namespace athanor {

bool in_backward_apply();

// RAII, set by the engine around one node's apply(); nests.
class BackwardApplyScope {
 public:
  BackwardApplyScope();
  ~BackwardApplyScope();
  BackwardApplyScope(const BackwardApplyScope&) = delete;
  BackwardApplyScope& operator=(const BackwardApplyScope&) = delete;
};

}  // namespace athanor
