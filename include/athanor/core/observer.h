#pragma once
// Observer hooks: how a lower layer tells an observer above it that an op or a backward
// node runs, without including it (the layer order in DESIGN.md). The profiler
// (observe) registers itself here; the op dispatch (ops) and the backward engine
// (autograd) notify through ObservedOp / ObservedNode, dist's pipeline through ObservedSpan.
//
// Cost: with no observer registered, one relaxed atomic load and a predictable branch
// per op or node. One observer at a time (the last registration wins).
#include <atomic>
#include <cstdint>
#include <string>

namespace athanor {

class OpObserver {
 public:
  virtual ~OpObserver() = default;
  // A forward op begins / ends on this thread. op_begin's result is handed back to op_end.
  virtual int64_t op_begin(const char* op) = 0;
  virtual void op_end(const char* op, int64_t token) = 0;
  // A backward node's apply() begins / ends on this thread.
  virtual int64_t node_begin(const std::string& node) = 0;
  virtual void node_end(const std::string& node, int64_t token) = 0;
  // A named phase (a pipeline action, a training-step part) begins / ends on this thread.
  virtual int64_t span_begin(const char* name) = 0;
  virtual void span_end(const char* name, const char* category, int64_t token) = 0;
};

namespace detail {
extern std::atomic<OpObserver*> g_op_observer;
}

// Registers `o` (null removes the current one). `o` must outlive its registration.
void set_op_observer(OpObserver* o);
inline OpObserver* op_observer() { return detail::g_op_observer.load(std::memory_order_acquire); }

// RAII: one forward op, notified to the observer registered when it began.
class ObservedOp {
 public:
  explicit ObservedOp(const char* op) : op_(op) {
    if (OpObserver* o = op_observer()) [[unlikely]] {
      observer_ = o;
      token_ = o->op_begin(op);
    }
  }
  ~ObservedOp() {
    if (observer_) observer_->op_end(op_, token_);
  }
  ObservedOp(const ObservedOp&) = delete;
  ObservedOp& operator=(const ObservedOp&) = delete;

 private:
  const char* op_;
  OpObserver* observer_ = nullptr;
  int64_t token_ = 0;
};

// RAII: one backward node's apply().
class ObservedNode {
 public:
  explicit ObservedNode(const std::string& node) : node_(node) {
    if (OpObserver* o = op_observer()) [[unlikely]] {
      observer_ = o;
      token_ = o->node_begin(node);
    }
  }
  ~ObservedNode() {
    if (observer_) observer_->node_end(node_, token_);
  }
  ObservedNode(const ObservedNode&) = delete;
  ObservedNode& operator=(const ObservedNode&) = delete;

 private:
  const std::string& node_;
  OpObserver* observer_ = nullptr;
  int64_t token_ = 0;
};

// RAII: one named phase of layers below observe (dist's pipeline actions). `name` and
// `category` must outlive the span (string literals).
class ObservedSpan {
 public:
  explicit ObservedSpan(const char* name, const char* category = "phase") : name_(name), category_(category) {
    if (OpObserver* o = op_observer()) [[unlikely]] {
      observer_ = o;
      token_ = o->span_begin(name);
    }
  }
  ~ObservedSpan() {
    if (observer_) observer_->span_end(name_, category_, token_);
  }
  ObservedSpan(const ObservedSpan&) = delete;
  ObservedSpan& operator=(const ObservedSpan&) = delete;

 private:
  const char* name_;
  const char* category_;
  OpObserver* observer_ = nullptr;
  int64_t token_ = 0;
};

}  // namespace athanor
