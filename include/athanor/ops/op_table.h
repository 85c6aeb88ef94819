#pragma once
// The op table: every differentiable op with its four facts, in one place
// (PyTorch's derivatives.yaml, in C++). Tests walk it to make sure every op has
// a gradcheck and a reference-vs-fast test; autocast (mixed precision) reads
// each op's category from it.
#include <string>
#include <vector>

namespace athanor {

enum class AutocastCategory {
  lower_precision,  // runs in bf16/f16 under autocast (GEMM-bound: matmul, linear, conv2d, attention)
  f32,              // always computed in f32 under autocast (softmax, norms, losses, reductions, exp/log)
  promote,          // runs in the widest dtype among its inputs (binary elementwise ops)
  passthrough       // keeps the input's dtype (views, indexing, activations, casts)
};
const char* autocast_category_name(AutocastCategory c);

struct OpInfo {
  std::string name;
  std::string reference;  // the naive reference kernel (or "composite: …" for ops built from other ops)
  std::string fast;       // the fast kernel
  std::string backward;   // where the backward is (file) and its formula in brief
  AutocastCategory autocast;
};

const std::vector<OpInfo>& op_table();
const OpInfo* find_op(const std::string& name);

}  // namespace athanor
