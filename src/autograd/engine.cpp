#include "athanor/autograd/engine.h"

#include <atomic>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "athanor/autograd/backward_pass.h"
#include "athanor/autograd/function.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/autograd/node.h"
#include "athanor/autograd/retain_graph.h"
#include "athanor/core/error.h"
#include "athanor/core/observer.h"
#include "grad_buffer.h"

namespace athanor {
namespace {

std::atomic<uint64_t> g_pending_taken{0};

struct LaterFirst {
  bool operator()(const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) const {
    return a->sequence_nr() < b->sequence_nr();
  }
};

// The gradients waiting at one node, per output slot: a dense sum, and row-sparse parts
// that found no dense buffer they could be added into yet.
struct InputBuffer {
  std::vector<Tensor> dense;
  std::vector<std::vector<RowSparseGrad>> rows;
};
using Buffers = std::unordered_map<Node*, InputBuffer>;

InputBuffer& buffer_of(Buffers& buffers, Node* node, uint32_t slot) {
  auto& buf = buffers[node];
  if (buf.dense.size() < node->output_meta.size()) buf.dense.resize(node->output_meta.size());
  ATH_ASSERT(slot < buf.dense.size());
  return buf;
}

// Gradient arriving at output `slot` of `node`: checked against what the node
// produced, converted to its dtype, and summed with earlier arrivals, in place
// when the engine holds the only reference to one of the two summands.
// `from` is the node whose backward produced g (null: the root gradient); named only in errors.
std::string source_name(const Node* from) { return from ? "the backward of " + from->name() : "the root"; }

void deposit(Buffers& buffers, Node* node, uint32_t slot, Tensor g, const Node* from) {
  auto& buf = buffer_of(buffers, node, slot);
  const TensorMeta& meta = node->output_meta[slot];
  ATH_CHECK(g.sizes() == meta.sizes, "backward",
            "gradient from ", from, " has shape ", g.describe(), " but ", node->name(), " output ", slot, " is ",
            meta.str(), Hint{"if you passed an explicit gradient to backward(), give it the output's shape"});
  if (g.dtype() != meta.dtype) {
    Tensor c = empty(g.sizes(), TensorOptions(meta.dtype).with_device(g.device()));  // converted where it is
    copy_into(c, g);
    g = std::move(c);
  }
  Tensor& acc = buf.dense[slot];
  if (!acc.defined()) acc = std::move(g);
  else if (exclusively_owned(acc)) add_into(acc, g);
  else if (exclusively_owned(g)) {  // same shape and dtype (checked above): a + b = b + a
    add_into(g, acc);
    acc = std::move(g);
  } else acc = add_new(acc, g);
}

// A row-sparse gradient arriving at output `slot` of `node`: added straight into the dense
// sum when the engine owns it, else kept until the node runs.
void deposit_rows(Buffers& buffers, Node* node, uint32_t slot, RowSparseGrad g, const Node* from) {
  auto& buf = buffer_of(buffers, node, slot);
  const TensorMeta& meta = node->output_meta[slot];
  const bool fits = !meta.sizes.empty() && g.indices.dim() == 1 && g.rows.dim() == static_cast<int64_t>(meta.sizes.size()) &&
                    g.rows.size(0) == g.indices.size(0) &&
                    Shape(g.rows.sizes().begin() + 1, g.rows.sizes().end()) == Shape(meta.sizes.begin() + 1, meta.sizes.end());
  ATH_CHECK(fits, "backward", "row-sparse gradient from ", source_name(from), " (indices ", g.indices.describe(), ", rows ",
            g.rows.describe(), ") does not fit ", node->name(), " output ", slot, " ", meta.str(),
            Hint{"this is a bug in the op's backward; please report it"});
  Tensor& acc = buf.dense[slot];
  if (acc.defined() && exclusively_owned(acc) && rows_addable(acc, g)) {
    add_rows_into(acc, g);
    return;
  }
  if (buf.rows.size() < buf.dense.size()) buf.rows.resize(buf.dense.size());
  buf.rows[slot].push_back(std::move(g));
}

bool has_pre_hook(const Node& node, size_t slot) {
  for (const auto& [s, hook] : node.pre_hooks)
    if (s == slot) return true;
  return false;
}

// Row-sparse parts waiting at an AccumulateGrad: added straight into the leaf's .grad when
// possible (returns true: nothing left to run), else materialised into grads[slot].
bool settle_rows(Node& node, InputBuffer& buf, std::vector<Tensor>& grads) {
  bool accumulated = false;
  for (size_t slot = 0; slot < buf.rows.size(); ++slot) {
    if (buf.rows[slot].empty()) continue;
    auto* acc_node = dynamic_cast<AccumulateGrad*>(&node);
    if (acc_node && !grads[slot].defined() && !has_pre_hook(node, slot)) {
      ObservedNode timer(node.name());
      if (acc_node->accumulate_rows(buf.rows[slot])) {
        accumulated = true;
        continue;
      }
    }
    const TensorMeta& meta = node.output_meta[slot];
    grads[slot] = materialize_rows(std::move(grads[slot]), buf.rows[slot], meta.sizes, meta.dtype);
  }
  return accumulated;
}

void run_pre_hooks(Node& node, std::vector<Tensor>& grads) {
  for (auto& [slot, hook] : node.pre_hooks) {
    if (slot < grads.size() && grads[slot].defined()) {
      Tensor r = hook.second(grads[slot]);
      if (r.defined()) grads[slot] = r;
    }
  }
}

}  // namespace

// ---- the split backward (engine.h): what the input pass leaves for the weight pass
struct DeferredWeightGrads::State {
  std::unordered_set<const Node*> weights;            // the weights' AccumulateGrad nodes
  std::vector<std::shared_ptr<Node>> accumulators;    // kept alive: the set compares addresses
  struct Item {
    std::shared_ptr<Node> node;
    std::vector<Tensor> grads;      // what the node received (after its pre-hooks)
  };
  std::vector<Item> items;          // in the order the input pass met them
  bool retain_graph = false;
  bool is_weight(const Edge& e) const { return e.valid() && weights.count(e.node.get()) != 0; }
};

namespace {
// Set while an input pass runs, so that a backward nested in it (checkpoint's) defers too.
thread_local DeferredWeightGrads::State* t_defer = nullptr;
// backward_retains_graph(): the retain_graph of the backward running on this thread.
thread_local bool t_retain_graph = false;
struct RetainScope {
  bool prev;
  explicit RetainScope(bool r) : prev(t_retain_graph) { t_retain_graph = r; }
  ~RetainScope() { t_retain_graph = prev; }
};

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots, bool retain_graph,
                  DeferredWeightGrads::State* defer) {
  ATH_CHECK(grad_roots.empty() || grad_roots.size() == roots.size(), "backward", "got ", roots.size(),
            " tensors but ", grad_roots.size(), " gradients");
  NoGradGuard no_grad;  // backward closures record nothing (no higher-order gradients)
  struct DeferScope {
    DeferredWeightGrads::State* prev;
    explicit DeferScope(DeferredWeightGrads::State* d) : prev(t_defer) { t_defer = d; }
    ~DeferScope() { t_defer = prev; }
  } defer_scope(defer);
  RetainScope retain_scope(retain_graph);

  Buffers buffers;
  std::vector<std::shared_ptr<Node>> root_nodes;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    ATH_CHECK(r.defined(), "backward", "root ", i, " is an undefined tensor");
    ATH_CHECK(r.requires_grad(), "backward", "tensor ", i, " (", r.describe(), ") does not require grad and has no grad_fn",
              Hint{"make sure some input has requires_grad_(true) and that the forward ran with grad mode on (not under NoGradGuard)"});
    Tensor g = i < grad_roots.size() ? grad_roots[i] : Tensor();
    if (!g.defined()) {
      ATH_CHECK(r.numel() == 1, "backward", "grad can be implicitly created only for scalar outputs, but the output is ",
                r.describe(), Hint{"reduce the output to a scalar (e.g. loss = sum(y)) or pass a gradient of its shape: y.backward(grad)"});
      g = ones(r.sizes(), TensorOptions(r.dtype()).with_device(r.device()));  // the seed on the root's device
    }
    Edge e = gradient_edge(r);
    deposit(buffers, e.node.get(), e.input_nr, g, nullptr);
    root_nodes.push_back(e.node);
  }

  // Count, for every node reachable from the roots, how many edges lead into it.
  std::unordered_map<Node*, int> deps;
  {
    std::vector<Node*> stack;
    std::unordered_set<Node*> seen;
    for (auto& n : root_nodes)
      if (seen.insert(n.get()).second) stack.push_back(n.get());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next_edges) {
        if (!e.valid() || (defer && defer->is_weight(e))) continue;
        ++deps[e.node.get()];
        if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
      }
    }
  }

  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, LaterFirst> ready;
  {
    std::unordered_set<Node*> queued;
    for (auto& n : root_nodes)
      if (deps[n.get()] == 0 && queued.insert(n.get()).second) ready.push(n);
  }

  // take_pending_grad: the dense sum waiting at the node an input comes from, when the
  // engine alone holds it (then nothing else can see it change) and it has the input's
  // shape and dtype. Row-sparse parts waiting there are added to what the backward returns.
  struct Pending final : Node::PendingGrads {
    Buffers* buffers;
    explicit Pending(Buffers* b) : buffers(b) {}
    Tensor take(const Node& node, size_t input) override {
      if (input >= node.next_edges.size() || input >= node.input_meta.size()) return Tensor();
      const Edge& e = node.next_edges[input];
      if (!e.valid()) return Tensor();
      auto it = buffers->find(e.node.get());
      if (it == buffers->end() || e.input_nr >= it->second.dense.size()) return Tensor();
      Tensor& acc = it->second.dense[e.input_nr];
      const TensorMeta& meta = node.input_meta[input];
      if (!exclusively_owned(acc) || acc.sizes() != meta.sizes || acc.dtype() != meta.dtype) return Tensor();
      g_pending_taken.fetch_add(1, std::memory_order_relaxed);
      return std::move(acc);
    }
  } pending(&buffers);

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    InputBuffer buf = std::move(buffers[node.get()]);
    buffers.erase(node.get());
    std::vector<Tensor> grads = std::move(buf.dense);
    grads.resize(node->output_meta.size());
    if (settle_rows(*node, buf, grads)) continue;  // AccumulateGrad has one slot and no inputs: nothing left to run
    run_pre_hooks(*node, grads);
    // The split backward: weight inputs are masked now and computed by the weight pass.
    std::vector<bool> weight_inputs;
    bool any_weight = false, only_weights = true;
    if (defer) {
      weight_inputs.resize(node->next_edges.size());
      for (size_t i = 0; i < node->next_edges.size(); ++i) {
        weight_inputs[i] = defer->is_weight(node->next_edges[i]);
        any_weight = any_weight || weight_inputs[i];
        if (node->next_edges[i].valid() && !weight_inputs[i]) only_weights = false;
      }
    }
    if (any_weight && only_weights) {  // nothing for the input pass to do here
      defer->items.push_back({node, std::move(grads)});
      continue;
    }
    if (any_weight) {
      defer->items.push_back({node, grads});  // handles: the weight pass gets the same gradients
      node->set_masked_inputs(weight_inputs);
    }
    const bool anomaly = anomaly_mode_enabled();
    std::vector<Tensor> incoming;  // anomaly mode reports the gradients that flowed into the failing node
    if (anomaly) incoming = grads;
    std::vector<Tensor> in_grads;
    {
      ObservedNode timer(node->name());  // the profiler's hook (core/observer.h); free when none is registered
      node->set_pending_grads(&pending);
      struct Unset {
        Node* n;
        ~Unset() { n->set_pending_grads(nullptr); }
      } unset{node.get()};
      BackwardApplyScope applying;
      in_grads = node->apply(std::move(grads));
    }
    if (any_weight) node->set_masked_inputs({});
    if (anomaly)
      for (size_t i = 0; i < in_grads.size(); ++i)
        if (in_grads[i].defined()) check_finite("backward", node->name(), incoming, in_grads[i], i, node->module_path);
    if (!retain_graph && !any_weight) node->release();  // a deferred node is released by the weight pass
    ATH_CHECK(in_grads.size() == node->next_edges.size() || in_grads.empty(), node->name(), "backward returned ",
              in_grads.size(), " gradients for ", node->next_edges.size(), " inputs",
              Hint{"this is a bug in the op's backward; please report it"});
    auto row_sparse = node->take_row_sparse();
    if (anomaly)
      for (auto& [i, g] : row_sparse) check_finite("backward", node->name(), incoming, g.rows, i, node->module_path);
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.valid() || (any_weight && weight_inputs[i])) continue;
      if (i < in_grads.size() && in_grads[i].defined())
        deposit(buffers, e.node.get(), e.input_nr, std::move(in_grads[i]), node.get());
      for (auto& [slot, g] : row_sparse)
        if (slot == i) deposit_rows(buffers, e.node.get(), e.input_nr, std::move(g), node.get());
      if (--deps[e.node.get()] == 0) ready.push(e.node);
    }
  }
}
}  // namespace

bool backward_retains_graph() { return t_retain_graph; }

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots, bool retain_graph) {
  run_backward(roots, grad_roots, retain_graph, t_defer);  // nested in an input pass: defer with it
}

DeferredWeightGrads::DeferredWeightGrads() = default;
DeferredWeightGrads::DeferredWeightGrads(std::unique_ptr<State> state) : state_(std::move(state)) {}
DeferredWeightGrads::~DeferredWeightGrads() = default;
DeferredWeightGrads::DeferredWeightGrads(DeferredWeightGrads&&) noexcept = default;
DeferredWeightGrads& DeferredWeightGrads::operator=(DeferredWeightGrads&&) noexcept = default;
bool DeferredWeightGrads::empty() const { return !state_ || state_->items.empty(); }
std::size_t DeferredWeightGrads::size() const { return state_ ? state_->items.size() : 0; }

DeferredWeightGrads backward_input(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
                                   const std::vector<Tensor>& weights, bool retain_graph) {
  ATH_CHECK(t_defer == nullptr, "backward_input", "called inside another split backward",
            Hint{"run the weight pass of the outer backward_input first"});
  auto state = std::make_unique<DeferredWeightGrads::State>();
  state->retain_graph = retain_graph;
  for (const Tensor& w : weights) {
    ATH_CHECK(w.defined(), "backward_input", "a weight is an undefined tensor");
    if (!w.requires_grad() || w.grad_fn()) continue;  // only leaves accumulate a .grad
    auto acc = grad_accumulator(w);
    if (state->weights.insert(acc.get()).second) state->accumulators.push_back(std::move(acc));
  }
  run_backward(roots, grad_roots, retain_graph, state.get());
  return DeferredWeightGrads(std::move(state));
}

void DeferredWeightGrads::run() {
  if (!state_) return;
  std::unique_ptr<State> st = std::move(state_);
  NoGradGuard no_grad;
  RetainScope retain_scope(st->retain_graph);
  Buffers buffers;  // at the weights' accumulators: each runs once, with the sum
  std::vector<std::shared_ptr<Node>> order;
  const bool anomaly = anomaly_mode_enabled();
  for (auto& item : st->items) {
    Node& node = *item.node;
    std::vector<bool> others(node.next_edges.size());
    for (size_t i = 0; i < others.size(); ++i) others[i] = node.next_edges[i].valid() && !st->is_weight(node.next_edges[i]);
    std::vector<Tensor> incoming;
    if (anomaly) incoming = item.grads;
    std::vector<Tensor> in_grads;
    {
      ObservedNode timer(node.name());
      node.set_masked_inputs(std::move(others));
      struct Unmask {
        Node& n;
        ~Unmask() { n.set_masked_inputs({}); }
      } unmask{node};
      BackwardApplyScope applying;
      in_grads = node.apply(std::move(item.grads));
    }
    auto row_sparse = node.take_row_sparse();
    if (!st->retain_graph) node.release();
    for (size_t i = 0; i < node.next_edges.size(); ++i) {
      const Edge& e = node.next_edges[i];
      if (!st->is_weight(e)) continue;
      const bool fresh = !buffers.count(e.node.get());
      if (i < in_grads.size() && in_grads[i].defined()) {
        if (anomaly) check_finite("backward", node.name(), incoming, in_grads[i], i, node.module_path);
        deposit(buffers, e.node.get(), e.input_nr, std::move(in_grads[i]), &node);
      }
      for (auto& [slot, g] : row_sparse)
        if (slot == i) deposit_rows(buffers, e.node.get(), e.input_nr, std::move(g), &node);
      if (fresh && buffers.count(e.node.get())) order.push_back(e.node);
    }
    item.node.reset();
  }
  for (auto& acc : order) {
    InputBuffer buf = std::move(buffers[acc.get()]);
    std::vector<Tensor> grads = std::move(buf.dense);
    grads.resize(acc->output_meta.size());
    if (settle_rows(*acc, buf, grads)) continue;
    run_pre_hooks(*acc, grads);
    ObservedNode timer(acc->name());
    acc->apply(std::move(grads));
  }
}

uint64_t pending_grads_taken() { return g_pending_taken.load(std::memory_order_relaxed); }

}  // namespace athanor
