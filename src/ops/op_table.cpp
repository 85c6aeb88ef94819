// The op table: every differentiable op with its reference kernel, fast kernel,
// backward, and autocast category. Kept in one place like PyTorch's
// derivatives.yaml; tests check that every op listed here is exercised.
#include "athanor/ops/op_table.h"

namespace athanor {

const char* autocast_category_name(AutocastCategory c) {
  switch (c) {
    case AutocastCategory::lower_precision: return "lower_precision";
    case AutocastCategory::f32: return "f32";
    case AutocastCategory::promote: return "promote";
    case AutocastCategory::passthrough: return "passthrough";
  }
  return "?";
}

const std::vector<OpInfo>& op_table() {
  using C = AutocastCategory;
  static const std::vector<OpInfo> table = {
      // elementwise arithmetic (src/ops/binary.cpp, kernels src/backend/cpu/binary.cpp)
      {"add", "cpu::ref::binary", "cpu::binary_same/scalar/row", "binary.cpp: ga = sum_to(g), gb = sum_to(g)", C::promote},
      {"sub", "cpu::ref::binary", "cpu::binary_same/scalar/row", "binary.cpp: ga = sum_to(g), gb = -sum_to(g)", C::promote},
      {"mul", "cpu::ref::binary", "cpu::binary_same/scalar/row", "binary.cpp: ga = sum_to(g*b), gb = sum_to(g*a)", C::promote},
      {"div", "cpu::ref::binary", "cpu::binary_same/scalar/row", "binary.cpp: ga = g/b, gb = -g*(a/b)/b", C::promote},
      {"neg", "composite: mul(x, -1)", "cpu::binary_scalar", "binary.cpp (via mul)", C::passthrough},
      // reductions (src/ops/sum.cpp, kernels src/backend/cpu/reduce.cpp)
      {"sum", "cpu::ref::sum_3d", "cpu::sum_3d", "sum.cpp: g broadcast back over the reduced dims", C::f32},
      {"mean", "cpu::ref::sum_3d", "cpu::sum_3d (scaled)", "sum.cpp: g/N broadcast back", C::f32},
      // views and copies (src/ops/shape_views.cpp; no kernels but copy_into)
      {"view", "-", "view (no copy)", "shape_views.cpp: reshape(g, input shape)", C::passthrough},
      {"permute", "-", "view (no copy)", "shape_views.cpp: permute(g, inverse)", C::passthrough},
      {"expand", "-", "view (stride 0)", "shape_views.cpp: sum_to(g, input shape)", C::passthrough},
      {"unsqueeze", "-", "view (no copy)", "shape_views.cpp: reshape(g, input shape)", C::passthrough},
      {"clone", "copy_into", "copy_into", "shape_views.cpp: identity", C::passthrough},
      {"cast", "copy_into", "copy_into", "shape_views.cpp: cast(g, input dtype)", C::passthrough},
      // linear algebra (src/ops/linalg.cpp, kernels src/backend/cpu/gemm.cpp)
      {"matmul", "cpu::ref::gemm", "cpu::gemm (oneDNN sgemm / OpenBLAS dgemm)", "linalg.cpp: dA = dC B^T, dB = A^T dC", C::lower_precision},
      {"linear", "cpu::ref::gemm", "cpu::gemm, bias fused as beta=1 init", "linalg.cpp: dx = dy W, dW = dy^T x, db = rowsum(dy)", C::lower_precision},
  };
  return table;
}

const OpInfo* find_op(const std::string& name) {
  for (const OpInfo& op : op_table())
    if (op.name == name) return &op;
  return nullptr;
}

}  // namespace athanor
