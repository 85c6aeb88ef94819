#pragma once
// What the backward running on this thread promised about its graph (src/autograd/engine.cpp).

namespace athanor {

// True while this thread runs a backward (or a split backward's weight pass) that keeps the
// graph (retain_graph): a node's backward may then not consume its saved tensors (cross_entropy
// on cuda writes the logits' gradient over its saved logits only when the graph is freed after).
bool backward_retains_graph();

}  // namespace athanor
