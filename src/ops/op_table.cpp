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
      {"add", "cpu::ref::binary", "cpu::binary_same/scalar/row; f32 op bf16/f16 same shape: cpu::binary_same_mixed (16-bit operand widened in registers)", "binary.cpp: ga = sum_to(g), gb = sum_to(g)", C::promote},
      {"sub", "cpu::ref::binary", "cpu::binary_same/scalar/row", "binary.cpp: ga = sum_to(g), gb = -sum_to(g)", C::promote},
      {"mul", "cpu::ref::binary", "cpu::binary_same/scalar/row", "binary.cpp: ga = sum_to(g*b), gb = sum_to(g*a)", C::promote},
      {"div", "cpu::ref::binary", "cpu::binary_same/scalar/row", "binary.cpp: ga = g/b, gb = -g*(a/b)/b", C::promote},
      {"neg", "composite: mul(x, -1)", "cpu::binary_scalar", "binary.cpp (via mul)", C::passthrough},
      // unary math (src/ops/unary.cpp, kernels src/backend/cpu/unary.cpp, AVX-512 vec::exp/log)
      {"exp", "cpu::ref::unary", "cpu::unary (vec::exp)", "unary.cpp: g*y", C::f32},
      {"log", "cpu::ref::unary", "cpu::unary (vec::log)", "unary.cpp: g/x", C::f32},
      {"sqrt", "cpu::ref::unary", "cpu::unary", "unary.cpp: g/(2y)", C::passthrough},
      {"rsqrt", "cpu::ref::unary", "cpu::unary", "unary.cpp: -g*y^3/2", C::f32},
      {"abs", "cpu::ref::unary", "cpu::unary + cpu::abs_backward", "unary.cpp: g*sign(x), sign(0)=0", C::passthrough},
      {"square", "cpu::ref::unary", "cpu::unary", "unary.cpp: 2x*g", C::passthrough},
      {"pow", "cpu::ref::pow", "cpu::pow_scalar / cpu::pow_tensor", "unary.cpp: g*p*x^(p-1); d/dy = x^y*ln(x)", C::f32},
      {"clamp", "cpu::ref::clamp", "cpu::clamp + cpu::clamp_backward", "unary.cpp: g where lo <= x <= hi", C::passthrough},
      {"where", "cpu::ref::where", "cpu::where", "where.cpp: cond ? g : 0 / cond ? 0 : g, sum_to", C::promote},
      {"masked_fill", "cpu::ref::where", "cpu::where", "where.cpp: g where mask is false", C::passthrough},
      // activations (src/ops/activation.cpp, kernels src/backend/cpu/activation.cpp)
      {"tanh", "cpu::ref::activation_forward", "cpu::activation_forward/backward", "activation.cpp: g*(1-y^2)", C::passthrough},
      {"sigmoid", "cpu::ref::activation_forward", "cpu::activation_forward/backward", "activation.cpp: g*y*(1-y)", C::passthrough},
      {"relu", "cpu::ref::activation_forward", "cpu::activation_forward/backward", "activation.cpp: g*[y>0]", C::passthrough},
      {"gelu", "cpu::ref::activation_forward", "cpu::activation_forward/backward (erf and tanh forms)", "activation.cpp: Phi(x)+x*phi(x) / tanh form", C::passthrough},
      {"silu", "cpu::ref::activation_forward", "cpu::activation_forward/backward", "activation.cpp: s*(1+x*(1-s))", C::passthrough},
      // reductions (src/ops/sum.cpp, minmax.cpp, var.cpp; kernels reduce.cpp, minmax.cpp)
      {"sum", "cpu::ref::sum_3d", "cpu::sum_3d; bf16/f16 x read directly under autocast (cpu::sum_3d_lowp_input, f32 out)", "sum.cpp: g broadcast back over the reduced dims", C::f32},
      {"mean", "cpu::ref::sum_3d", "cpu::sum_3d (scaled); bf16/f16 x read directly under autocast (cpu::sum_3d_lowp_input, f32 out)", "sum.cpp: g/N broadcast back", C::f32},
      {"max", "cpu::ref::minmax_3d", "cpu::minmax_3d", "minmax.cpp: g to the first maximal element", C::passthrough},
      {"min", "cpu::ref::minmax_3d", "cpu::minmax_3d", "minmax.cpp: g to the first minimal element", C::passthrough},
      {"var", "cpu::ref::var_3d", "cpu::var_3d", "var.cpp: g*2(x-mean)/(N-correction)", C::f32},
      // views and copies (src/ops/shape_views.cpp, slicing.cpp, concat.cpp)
      {"view", "-", "view (no copy)", "shape_views.cpp: reshape(g, input shape)", C::passthrough},
      {"permute", "-", "view (no copy)", "shape_views.cpp: permute(g, inverse)", C::passthrough},
      {"expand", "-", "view (stride 0)", "shape_views.cpp: sum_to(g, input shape)", C::passthrough},
      {"unsqueeze", "-", "view (no copy)", "shape_views.cpp: reshape(g, input shape)", C::passthrough},
      {"clone", "copy_into", "copy_into", "shape_views.cpp: identity", C::passthrough},
      {"cast", "copy_into", "copy_into", "shape_views.cpp: cast(g, input dtype)", C::passthrough},
      {"slice", "-", "view (no copy)", "slicing.cpp: g into the sliced region of zeros", C::passthrough},
      {"split", "-", "views, one node for all pieces", "slicing.cpp: each piece's g to its range", C::passthrough},
      {"cat", "cpu::ref::copy_rows", "cpu::copy_rows", "concat.cpp: each input gets its block of g", C::passthrough},
      // indexing (src/ops/indexing.cpp, embedding.cpp; kernels src/backend/cpu/index.cpp)
      {"index_select", "cpu::ref::index_select_3d", "cpu::index_select_3d", "indexing.cpp: scatter-add (cpu::index_add_3d)", C::passthrough},
      {"gather", "cpu::ref::gather_3d", "cpu::gather_3d", "indexing.cpp: scatter-add (cpu::scatter_add_3d)", C::passthrough},
      {"embedding", "cpu::ref::index_select_3d", "cpu::index_select_3d", "embedding.cpp: f32/f64 tables: row-sparse gradient (engine RowSparseGrad + cpu::index_accumulate_rows, added straight into the gradient it meets); bf16/f16: scatter-add per id; padding row 0", C::passthrough},
      // linear algebra (src/ops/linalg.cpp, kernels src/backend/cpu/gemm.cpp)
      {"matmul", "cpu::ref::gemm", "cpu::gemm (cached oneDNN matmul primitives f32/bf16, oneDNN sgemm below 16^3, OpenBLAS dgemm f64)", "linalg.cpp: dA = dC B^T, dB = A^T dC", C::lower_precision},
      {"linear", "cpu::ref::gemm", "cpu::gemm_bias (cached oneDNN matmul primitive f32/bf16, bias added in the GEMM epilogue)", "linalg.cpp: dx = dy W, dW = dy^T x, db = rowsum(dy)", C::lower_precision},
      {"gelu_linear", "composite: cpu::ref::activation_forward (gelu_tanh) then cpu::ref::gemm", "gelu_linear.cpp: cpu::activation_forward into scratch + cpu::gemm_bias (bias in the GEMM epilogue); only x saved", "gelu_linear.cpp: gelu(x) recomputed, dW = dy^T gelu(x), db = rowsum(dy), dx = (dy W)*gelu'(x)", C::lower_precision},
      {"linear_relu", "composite: cpu::ref::gemm then cpu::ref::activation_forward (relu)", "linear_relu.cpp: cpu::gemm_bias (bias in the GEMM epilogue), relu in place on its output; only y (with x, W) saved", "linear_relu.cpp: g = dy*[y>0] and db = rowsum(g) in one pass (cpu::relu_backward_rowsum), dx = g W, dW = g^T x; bf16 autocast with f32 W, b: dW (cpu::gemm_bf16_f32out) and db in f32, no cast nodes", C::lower_precision},
      // normalization (src/ops/layer_norm.cpp, rms_norm.cpp, batch_norm.cpp; kernels src/backend/cpu/norm.cpp, batch_norm.cpp)
      {"layer_norm", "cpu::ref::layer_norm_forward", "cpu::layer_norm_forward/backward (fused, cached mean/rstd); under autocast a bf16/f16 x is read directly (cpu::layer_norm_*_lowp_input, f32 out); under bf16/f16 autocast an f32 x that requires grad keeps xhat in the autocast dtype for backward (cpu::layer_norm_forward_keep_xhat / layer_norm_backward_from_xhat)", "layer_norm.cpp: rstd*(dn - mean(dn) - xhat*mean(dn*xhat))", C::f32},
      {"rms_norm", "cpu::ref::rms_norm_forward", "cpu::rms_norm_forward/backward (fused, cached rstd); bf16/f16 x read directly under autocast (cpu::rms_norm_*_lowp_input, f32 out)", "rms_norm.cpp: rstd*(dn - xhat*mean(dn*xhat))", C::f32},
      {"batch_norm", "cpu::ref::batch_norm_forward", "cpu::batch_norm_stats/forward/backward", "batch_norm.cpp: w*rstd*(g - mean(g) - xhat*mean(g*xhat))", C::f32},
      // softmax and losses (src/ops/softmax.cpp, cross_entropy.cpp, mse_loss.cpp; kernels softmax.cpp, cross_entropy.cpp)
      {"softmax", "cpu::ref::softmax_forward", "cpu::softmax_forward/backward (AVX-512 exp, one pass per row); bf16/f16 x read directly under autocast (cpu::softmax_forward_lowp_input / softmax_backward_lowp_dx)", "softmax.cpp: y*(g - sum(g*y))", C::f32},
      {"log_softmax", "cpu::ref::softmax_forward (log)", "cpu::softmax_forward/backward (log); bf16/f16 x read directly under autocast (cpu::softmax_forward_lowp_input / softmax_backward_lowp_dx)", "softmax.cpp: g - exp(y)*sum(g)", C::f32},
      {"cross_entropy", "cpu::ref::cross_entropy_forward", "cpu::cross_entropy_forward/backward (fused log-softmax + NLL, per-row lse; bf16/f16 logits read directly under autocast)", "cross_entropy.cpp: (softmax - smoothed onehot)*g/count", C::f32},
      {"mse_loss", "cpu::ref::mse_forward", "cpu::mse_forward/mse_backward", "mse_loss.cpp: 2(a-b)*g (/n for mean)", C::f32},
      {"dropout", "philox4x32 per element (test)", "AVX-512 Philox, 16 blocks at a time", "dropout.cpp: g*mask/(1-p), mask rebuilt from (seed, offset)", C::passthrough},
      // attention, convolution, pooling (src/ops/attention.cpp, conv.cpp, pool.cpp)
      {"scaled_dot_product_attention", "cpu::ref::attention", "cpu::attention_forward/backward (flash: 64x64 tiles, online softmax; bf16: AVX512_BF16 tile products, vdpbf16ps with f32 accumulation)", "attention.cpp: FlashAttention-2 backward from saved O and lse", C::lower_precision},
      {"causal_self_attention", "cpu::ref::attention (per head of the split qkv)", "cpu::attention_forward/backward with AttentionLayout::packed_qkv (q, k, v read in place from [B, T, 3d], O written as [B, T, d])", "attention.cpp: the flash backward writing d(qkv) [B, T, 3d] in place", C::lower_precision},
      {"conv2d", "cpu::ref::conv2d", "cpu::conv2d_forward/backward (im2col + GEMM; direct 1x1)", "conv.cpp: dx = col2im(W^T dY), dW = dY col^T, db = sum(dY)", C::lower_precision},
      {"max_pool2d", "cpu::ref::max_pool2d", "cpu::max_pool2d_forward/backward (records argmax)", "pool.cpp: g to the first max of each window", C::passthrough},
      {"avg_pool2d", "cpu::ref::avg_pool2d", "cpu::avg_pool2d_forward/backward", "pool.cpp: g/(kH*kW) over each window", C::passthrough},
  };
  return table;
}

const OpInfo* find_op(const std::string& name) {
  for (const OpInfo& op : op_table())
    if (op.name == name) return &op;
  return nullptr;
}

}  // namespace athanor
