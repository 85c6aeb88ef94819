#pragma once
// GEMM on cuBLASLt, row-major like cpu/gemm.h:
//   C[b] = alpha op(A[b]) op(B[b]) + beta C[b] (+ bias[n] broadcast over rows) (then GELU)
// with op(A) [m, k], op(B) [k, n], C [m, n], for b < batch at the given element strides.
//
// Invariants:
//  - f32 data computes in f32, with TF32 tensor cores only when `allow_tf32` (the
//    config's switch); bf16 and f16 data accumulate in f32; C has A's dtype, or f32 with
//    `c_f32` (16-bit A and B, the f32 accumulators written as they are: the gradient of an
//    f32 master weight from bf16 operands); the bias has C's dtype;
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

enum class GemmEpilogue : uint8_t { none, bias, gelu, bias_gelu, relu, bias_relu };

struct GemmArgs {
  DType dtype = DType::f32;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  const void* bias = nullptr;  // [n], for the bias epilogues
  GemmEpilogue epilogue = GemmEpilogue::none;
  float alpha = 1.0f, beta = 0.0f;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batches
  bool allow_tf32 = false;
  bool c_f32 = false;  // C (and the bias) in f32 while A and B are bf16/f16
};

void gemm(const GemmArgs& args, int device, cudaStream_t stream);
// How many distinct shapes the heuristic cache holds on `device` (tests, profiling).
std::size_t gemm_cached_plans(int device);

}  // namespace athanor::cuda
