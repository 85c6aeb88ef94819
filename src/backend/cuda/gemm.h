#pragma once
// GEMM on cuBLASLt, row-major like cpu/gemm.h:
//   C[b] = alpha op(A[b]) op(B[b]) + beta C[b] (+ bias[n] broadcast over rows) (then GELU)
// with op(A) [m, k], op(B) [k, n], C [m, n], for b < batch at the given element strides.
// The backward epilogues (issue 22; batch 1, beta 0):
//   dgelu      C = (op(A) op(B)) ⊙ gelu_tanh'(aux), aux [m, n] row-major with row stride aux_ld
//              (a multiple of 8, >= n) in C's dtype: gelu_linear's dx = (g W) ⊙ gelu'(x) in one GEMM;
//   bias_grad  C = op(A) op(B) and bias[i] = Σ_k op(A)[i, k] (i < m) written to `bias` in C's
//              dtype: a linear's dW = g^T x with db = Σ_rows g from the same read of g.
// cuBLASLt offers them for some shapes and dtypes only: try_gemm says false (nothing launched)
// where it has no algorithm, and the caller takes the unfused path.
//
// Invariants:
//  - f32 data computes in f32, with TF32 tensor cores only when `allow_tf32` (the
//    config's switch); bf16 and f16 data accumulate in f32; C has A's dtype, or f32 with
//    `c_f32` (16-bit A and B, the f32 accumulators written as they are: the gradient of an
//    f32 master weight from bf16 operands); the bias has C's dtype;
//  - f64 data computes in f64 (CUBLAS_COMPUTE_64F, alpha and beta as doubles), with no
//    epilogue (gemm() rejects one, try_gemm() declines): the exact path gradchecks run on;
//  - one cuBLASLt handle and one 32 MiB workspace per device (the workspace from the
//    caching allocator, tag workspace); the heuristic's algorithm is cached per
//    (shape, dtype, layout, epilogue), so a training step asks the heuristic once per shape;
//  - the workspace is shared by every GEMM on the device: they must be issued on one stream
//    (the compute stream), as the trainer does;
//  - bad shapes and dtypes are athanor::Errors before any launch.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "athanor/core/dtype.h"

namespace athanor::cuda {

enum class GemmEpilogue : uint8_t { none, bias, gelu, bias_gelu, relu, bias_relu, dgelu, bias_grad };

struct GemmArgs {
  DType dtype = DType::f32;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  const void* bias = nullptr;  // [n], for the bias epilogues; [m], written, for bias_grad
  const void* aux = nullptr;   // dgelu: the GELU's input [m, n], row stride aux_ld
  int64_t aux_ld = 0;
  GemmEpilogue epilogue = GemmEpilogue::none;
  float alpha = 1.0f, beta = 0.0f;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batches
  bool allow_tf32 = false;
  bool c_f32 = false;  // C (and the bias) in f32 while A and B are bf16/f16
};

void gemm(const GemmArgs& args, int device, cudaStream_t stream);
// gemm(), or false with nothing launched when cuBLASLt has no algorithm for the epilogue at
// this shape, dtype and alignment (remembered: the heuristic is asked once per shape).
bool try_gemm(const GemmArgs& args, int device, cudaStream_t stream);
// The backward epilogues (dgelu, bias_grad) in the linear ops (src/ops/cuda/linalg.cpp): on
// unless ATHANOR_CUDA_FUSED_EPILOGUES=0 (the A/B switch; tests set it directly).
bool fused_epilogues_enabled();
void set_fused_epilogues(bool on);
// How many distinct shapes the heuristic cache holds on `device` (tests, profiling).
std::size_t gemm_cached_plans(int device);

}  // namespace athanor::cuda
