#pragma once
// The tape. A Node is the backward of one op call (its grad_fn): it maps the
// gradients of the op's outputs to the gradients of its inputs, and points
// (next_edges) to the nodes that produced those inputs. Leaves that require
// grad end in an AccumulateGrad node that adds into `.grad`.
//
// Invariants:
//  - next_edges[i] belongs to input i; an invalid edge means "no gradient needed";
//  - sequence_nr grows with creation, so the engine runs later nodes first;
//  - saved tensors are detached aliases plus the version they had when saved;
//    unpacking one whose storage was modified in place since raises an Error;
//  - after backward without retain_graph a node is released: its saved tensors
//    are freed and running it again raises an Error.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor {

struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;  // which output of `node` (= which input slot of its gradient buffer)
  bool valid() const { return node != nullptr; }
};

// A gradient that is zero except in some rows of dim 0:
//   dense[indices[p], ...] += rows[p, ...]   for every p with indices[p] != skip.
// An op whose gradient touches a few rows of a large table (embedding) hands it to the
// engine with Node::emit_row_sparse instead of returning a zero-filled dense tensor; the
// engine adds the rows straight into the gradient they meet (a tied lm_head's dense
// gradient, or the leaf's existing .grad) and materializes a dense tensor only when
// something needs one (hooks, a node other than AccumulateGrad, no buffer to add into).
struct RowSparseGrad {
  Tensor indices;     // i64 or i32, [n], every value in [0, dense rows)
  Tensor rows;        // contiguous f32 or f64 [n, ...]: a dense row's shape
  int64_t skip = -1;  // rows whose index equals skip add nothing (embedding's padding_idx)
};

struct TensorMeta {  // what a node remembers of its inputs and outputs, for checks and messages
  Shape sizes;
  DType dtype = DType::f32;
  std::string str() const { return shape_str(sizes) + " " + dtype_name(dtype); }
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  explicit Node(std::string name);
  virtual ~Node() = default;
  // grads[i] is the gradient w.r.t. output i (undefined if that output got none).
  // Returns one gradient per next_edge (undefined where none is needed).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  virtual void release() { released_ = true; }
  bool released() const { return released_; }

  const std::string& name() const { return name_; }
  uint64_t sequence_nr() const { return sequence_nr_; }

  std::vector<Edge> next_edges;
  std::vector<TensorMeta> input_meta, output_meta;
  std::string module_path;  // the module whose forward created this node
  // Hooks on the gradient of output `first`, run before apply (tensor hooks on non-leaves).
  std::vector<std::pair<uint32_t, std::pair<int, GradHook>>> pre_hooks;

  // Inside apply: the gradient of input `input` given as rows (apply returns an undefined
  // tensor in that slot). The engine collects these right after apply returns.
  void emit_row_sparse(size_t input, RowSparseGrad g) const { row_sparse_out_.emplace_back(input, std::move(g)); }
  std::vector<std::pair<size_t, RowSparseGrad>> take_row_sparse() { return std::exchange(row_sparse_out_, {}); }

  // Inside apply: the gradient input `input` has already received from its other uses (the
  // residual stream's sum, say), moved out of the engine's buffer, so that a backward can
  // add it in the pass that writes its own gradient instead of the engine adding the two
  // in a pass of their own (layer_norm does). Undefined unless the engine holds the only
  // reference to it and it is a contiguous tensor of the input's shape and dtype. A
  // backward that takes it must return the sum of it and its own gradient for that input.
  Tensor take_pending_grad(size_t input) const { return pending_ ? pending_->take(*this, input) : Tensor(); }
  struct PendingGrads {  // the engine's side of take_pending_grad, set while apply runs
    virtual Tensor take(const Node& node, size_t input) = 0;
   protected:
    ~PendingGrads() = default;
  };
  void set_pending_grads(PendingGrads* p) { pending_ = p; }

  // The engine's split backward (engine.h, backward_input / DeferredWeightGrads): while set,
  // input i is treated as needing no gradient (needs_grad is false for it), so one apply
  // computes only the input gradients and a later one only the weight gradients.
  bool input_masked(size_t i) const { return i < masked_.size() && masked_[i]; }
  void set_masked_inputs(std::vector<bool> masked) { masked_ = std::move(masked); }

 protected:
  bool released_ = false;

 private:
  std::string name_;
  uint64_t sequence_nr_;
  mutable std::vector<std::pair<size_t, RowSparseGrad>> row_sparse_out_;  // filled during apply only
  PendingGrads* pending_ = nullptr;                                         // set during apply only
  std::vector<bool> masked_;                                                // set during a split apply only
};

// What a saved-tensor hook keeps in place of a saved tensor (autograd/saved_tensor_hooks.h).
struct SavedTensorPack {
  virtual ~SavedTensorPack() = default;
  virtual Tensor unpack(const Node& owner) = 0;  // the tensor as it was saved
};

// A tensor saved for backward, with the version check. Under a SavedTensorHooks scope the
// scope's pack may keep something else in its place (saved_tensor_hooks.h).
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, const char* what);  // what: "self", "other", "result", …
  Tensor unpack(const Node& owner) const;  // raises if modified in place since saved
  bool defined() const { return data_.defined() || packed_ != nullptr; }
  void reset() {
    data_ = Tensor();
    packed_.reset();
  }

 private:
  Tensor data_;
  std::shared_ptr<SavedTensorPack> packed_;
  uint64_t version_ = 0;
  const char* what_ = "";
  std::string name_;
};

// The closure form used by every op: the backward is written right where the
// forward is computed (see autograd/function.h). It gets its own node (for
// needs_grad and SavedTensor::unpack) and the gradients of the outputs.
using OpBackward = std::function<std::vector<Tensor>(const Node& node, const std::vector<Tensor>& grad_outputs)>;

class FunctionNode : public Node {
 public:
  FunctionNode(std::string name, OpBackward fn) : Node(std::move(name)), fn_(std::move(fn)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  void release() override;

 private:
  OpBackward fn_;
};

class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf);
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  void release() override {}  // holds nothing to free; may run again
  std::shared_ptr<TensorImpl> leaf() const { return leaf_.lock(); }
  // Adds row-sparse gradients straight into an existing .grad (then runs the post-accumulate
  // hooks, as apply does). Returns false, touching nothing, when that is not possible: no
  // .grad yet, tensor hooks that want the dense gradient, or a .grad of another layout/dtype.
  bool accumulate_rows(const std::vector<RowSparseGrad>& parts);

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

// The node that accumulates into leaf `t` (created once and shared by all uses).
std::shared_ptr<Node> grad_accumulator(const Tensor& t);
// The edge along which a gradient for `t` flows (invalid if t needs no grad).
Edge gradient_edge(const Tensor& t);

}  // namespace athanor
