#pragma once
// One pointwise kernel for every elementwise op on CUDA tensors: up to three inputs of any
// of f32, bf16, f16, each at its own strides over the output's shape (a 0 stride
// broadcasts, so broadcasting, transposed and sliced inputs are read in place), math in
// f32, the output written contiguously in its own dtype. The op is a runtime value, not a
// template: one kernel serves add and relu alike (its switch is uniform across a warp), so
// the CUDA compile stays small.
//
// Invariants:
//  - f32 arithmetic rounds once per operation (__fadd_rn, __fmul_rn, __fdiv_rn: no fused
//    multiply-add), as the CPU's binary kernels; 16-bit inputs widen exactly, the output
//    rounds to nearest even once (core/half.h);
//  - dropout draws element i's keep bit from philox4x32(seed, offset + i / 4)[i % 4] >> 8
//    >= threshold, the CPU's stream (cpu/dropout.h), for every dtype;
//  - element offsets are int64 (strided_index.h); nothing here synchronises.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "athanor/core/dtype.h"
#include "backend/cuda/strided_index.h"

namespace athanor::cuda {

enum class PointwiseOp : uint8_t {
  copy,                // y = a (a cast when the dtypes differ)
  add, sub, mul, div,  // y = a op b
  scale,               // y = alpha a
  relu,                // y = max(a, 0)
  relu_backward,       // y = a [b > 0]               (a = dy, b = the forward's output)
  gelu_tanh,           // y = 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3)))
  gelu_tanh_backward,  // y = a gelu_tanh'(b)         (a = dy, b = x)
  gelu_erf,            // y = 0.5 a (1 + erf(a / sqrt 2))
  gelu_erf_backward,   // y = a gelu_erf'(b)
  silu_mul,            // y = silu(a) b               (SwiGLU: a = gate, b = up)
  silu_mul_grad_gate,  // y = c b silu'(a)            (c = dh)
  silu_mul_grad_up,    // y = c silu(a)
  dropout,             // y = keep(i) ? a alpha : 0  (alpha = 1 / (1 - p))
  rsqrt_add,           // y = 1 / sqrt(a + alpha), in double, rounded once (batch_norm's rstd)
  tanh,                // y = tanh(a)
  tanh_backward,       // y = a (1 - b^2)             (b = the forward's output)
  sigmoid,             // y = 1 / (1 + exp(-a))
  sigmoid_backward,    // y = a b (1 - b)             (b = the forward's output)
  silu,                // y = a sigmoid(a)
  silu_backward,       // y = a s (1 + b (1 - s)), s = sigmoid(b)   (b = x)
};

struct PointwiseOperand {
  const void* data = nullptr;
  DType dtype = DType::f32;
  int64_t strides[kMaxIndexDims] = {};
  bool contiguous = false;  // strides are the row-major ones of the shape: offset = i
};

struct PointwiseArgs {
  PointwiseOp op = PointwiseOp::copy;
  int ndim = 0;
  int64_t sizes[kMaxIndexDims] = {};
  int n_in = 1;
  PointwiseOperand in[3];
  void* out = nullptr;  // contiguous over `sizes`
  DType out_dtype = DType::f32;
  float alpha = 1.0f;
  uint64_t seed = 0, offset = 0;  // dropout's Philox stream
  uint32_t threshold = 0;         // dropout: keep iff (word >> 8) >= threshold
};

// The number of inputs `op` reads.
int pointwise_arity(PointwiseOp op);
// Runs args over the n = Π sizes elements on `stream`; dtypes must be f32, bf16 or f16.
void pointwise(const PointwiseArgs& args, cudaStream_t stream);

}  // namespace athanor::cuda
