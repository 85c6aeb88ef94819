#pragma once
// Helpers shared by op implementations (not public API).
#include <vector>

#include "athanor/autograd/function.h"
#include "athanor/core/convert.h"
#include "athanor/core/error.h"
#include "athanor/core/tensor.h"
#include "ops/packed_weights.h"
#include "backend/cpu/gemm.h"

namespace athanor::detail {

// Wraps a possibly negative dim for a tensor of rank ndim, with an error naming op.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// Sorted, unique, wrapped dims; empty input = all dims.
std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op);
// The shape left after reducing `dims` (sorted) of `in`: removed, or kept as 1.
Shape reduced_shape(const Shape& in, const std::vector<int64_t>& dims, bool keepdim);
// x seen as [outer, r, inner] with the reduced dims (sorted, unique) in the
// middle: a view when they form one block of adjacent dims of a contiguous x,
// else a copy permuted to [kept..., reduced...] (inner = 1). Used by the
// reduction kernels (sum/mean, var), which all take this form.
struct ReduceLayout {
  Tensor src;
  int64_t outer = 1, r = 1, inner = 1;
};
ReduceLayout reduce_layout(const Tensor& x, const std::vector<int64_t>& dims);
// normalized_shape must equal the trailing dims of x (layer_norm, rms_norm).
void check_normalized_shape(const Tensor& x, const Shape& normalized_shape, const char* op);
// Input 0's gradient buffer for a norm's backward (layer_norm on the CPU, layer_norm / rms_norm on
// CUDA): when `take` and x already has a gradient from its other uses (a transformer's residual
// stream, waiting in the engine: Node::take_pending_grad), that buffer, which the kernel adds its
// dx into (accumulate); else a fresh one of x's `sizes` and `opts`; undefined when input 0 needs no
// gradient. Saves the engine's pass summing the two, per norm.
struct InputGrad {
  Tensor t;
  bool accumulate = false;
};
InputGrad norm_input_grad(const Node& n, const Shape& sizes, TensorOptions opts, bool take);
void check_defined(const Tensor& t, const char* op, const char* arg);
void check_floating(const Tensor& t, const char* op, const char* arg);
void check_same_dtype(const Tensor& a, const Tensor& b, const char* op);
// Attention operands [B, H, T, D]: whether t's elements fill one dense block in some order of
// dims 0-2 with the last dim contiguous (a transposed view of a contiguous tensor, such as the
// [B, T, H, D] projection's .transpose(1, 2) that a model passes). The kernels, CPU and CUDA,
// read such operands in place and give the gradients the same strides: no copy either way.
bool dense_rows_layout(const Tensor& t);
// cross_entropy's logits [N, C] or [C] and integer targets [N] or []: {N, C}.
// mse_loss's input and target: floating, one shape (no broadcasting), one dtype.
void check_mse_args(const Tensor& input, const Tensor& target, const char* op);
std::pair<int64_t, int64_t> check_cross_entropy_args(const Tensor& logits, const Tensor& target, double label_smoothing,
                                                     const char* op);
// linear-shaped arguments (linear, gelu_linear): floating x and weight [out, in] of one
// dtype, x's last dim = in, bias (optional) 1-D [out]. `hint` explains the op's x.
void check_linear_args(const Tensor& x, const Tensor& weight, const Tensor& bias, const char* op, const char* hint);
// C = A·B (+ beta·C) with transposes, at T's precision: cpu::gemm for f32/f64, the
// low-precision GEMM (f32 accumulation) for bf16/f16.
template <class T>
void gemm_t(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
            float beta, T* C, int64_t ldc) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) cpu::gemm(ta, tb, M, N, K, T(1), A, lda, B, ldb, T(beta), C, ldc);
  else cpu::gemm_lowp<T>(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}
// y[M, out] = x[M, in] W[out, in]^T + bias (bias may be null): the forward GEMM of linear
// and gelu_linear, with the bias added in the GEMM's epilogue (cpu::gemm_bias).
template <class T>
void linear_gemm_t(int64_t M, int64_t out, int64_t in, const T* x, const T* weight, const T* bias, T* y) {
  cpu::gemm_bias<T>(false, true, M, out, in, x, in, weight, in, bias, y, out);
}
// The same on the weight tensor itself: through its packed copy (ops/packed_weights.h)
// when one is current and the GEMM runs on oneDNN's blocked kernels, else as above.
template <class T>
void linear_gemm_w(int64_t M, int64_t out, int64_t in, const T* x, const Tensor& weight, const T* bias, T* y);
// dx[M, in] = dy[M, out] W[out, in] (linear's input gradient), through W's packed copy
// when one is current; else gemm_t.
template <class T> void input_grad_gemm(int64_t M, int64_t in, int64_t out, const T* dy, const Tensor& weight, T* dx);
// W's current packed copy for its input-gradient GEMM dx[M, in] = dy[M, out] W, when that
// GEMM would run on oneDNN's blocked kernels (else empty): for callers that split the
// GEMM themselves (cpu::gemm_row_blocks).
PackedWeight input_grad_packed(const Tensor& weight, int64_t M, int64_t in, int64_t out);
// The backward GEMMs of a linear-shaped op under the f32-master rule (OpDef::f32_master: bf16
// autocast, f32 W and b) for an upstream gradient g [M, out] (bf16), when node n
// asks for them: dx = g W in bf16 (input 0), dW = gᵀ x in f32 from the f32 accumulators
// (input 1). x and W are the saved contiguous bf16 tensors.
void lowp_linear_backward_gemms(const Node& n, const bfloat16* g, const SavedTensor& x, const SavedTensor& w, int64_t M,
                                int64_t in, int64_t out_f, Tensor& dx, Tensor& dw);
// dst[c, r] = src[r, c] for a row-major [rows, cols] src (dst is [cols, rows]), in 32 x 32
// tiles over both threads. For weight gradients computed as dW^T (detail::weight_grad_t).
template <class T> void transpose_2d(const T* src, int64_t rows, int64_t cols, T* dst);
// A contiguous tensor with x's values (x itself when already contiguous). Not recorded.
Tensor contiguous_raw(const Tensor& x);
// x converted to dtype, contiguous. Not recorded.
Tensor to_raw(const Tensor& x, DType dtype);

}  // namespace athanor::detail
