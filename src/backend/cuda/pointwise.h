#pragma once
// One pointwise kernel for every elementwise op on CUDA tensors: up to three inputs of any
// of f32, f64, bf16, f16, each at its own strides over the output's shape (a 0 stride
// broadcasts, so broadcasting, transposed and sliced inputs are read in place), math in
// f32 (in f64 when an input or the output is f64), the output written contiguously in its
// own dtype. The op is a runtime value, not a template: one kernel serves add and relu
// alike (its switch is uniform across a warp), so the CUDA compile stays small.
//
// The kernels (plan_pointwise picks one on the host):
//  - generic: one element per thread, any strides, each load switching on its dtype;
//  - generic_f64: the same with the math in double, the CPU's f64 formulas
//    (pointwise_f64.cu);
//  - vectorized (candidate pointwise_vectorized, candidates.h): every input contiguous,
//    the dtypes template parameters, 8 elements per 16-byte-aligned step (two 16-byte
//    words for f32), a scalar head and tail. It calls the generic kernel's formulas with
//    the element's true index, so its results are the generic kernel's bits. Instantiated
//    for the dtypes a training step meets, to keep the object small: every op with one dtype
//    throughout; a cast (op copy) between any two of f32, bf16, f16; every op on f32 and a
//    16-bit dtype into f32 (the residual add under autocast). Other calls take generic.
//
// Invariants:
//  - f32 arithmetic rounds once per operation (__fadd_rn, __fmul_rn, __fdiv_rn: no fused
//    multiply-add), as the CPU's binary kernels; 16-bit inputs widen exactly, the output
//    rounds to nearest even once (core/half.h);
//  - f64 arithmetic likewise rounds once per operation (__dadd_rn, __dmul_rn, ...), with
//    the CPU's f64 formulas: the ops of one operation give the CPU's f64 bits, the others
//    agree to a few ulp (pointwise_f64.cu); an f64 value written to bf16/f16 rounds to f32
//    first, then to 16 bits, as the CPU's cast does (core/convert.h);
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
  double alpha = 1.0;             // scale, dropout, rsqrt_add; rounded to f32 once when the math is f32
  uint64_t seed = 0, offset = 0;  // dropout's Philox stream
  uint32_t threshold = 0;         // dropout: keep iff (word >> 8) >= threshold
};

// The number of inputs `op` reads.
int pointwise_arity(PointwiseOp op);
// Runs args over the n = Π sizes elements on `stream`; dtypes must be f32, f64, bf16 or f16.
void pointwise(const PointwiseArgs& args, cudaStream_t stream);

// ---- The host side of the choice of kernel (pointwise_plan.cpp: plain C++, tested without a GPU)

// The Error pointwise() gives before any work: dims, arity, dtypes.
void check_pointwise(const PointwiseArgs& args);

enum class PointwiseKernel : uint8_t {
  generic,
  generic_f64,
  vectorized,       // inputs, output: one dtype
  vectorized_cast,  // op copy: one input's dtype to another
  vectorized_mixed  // input 0 and inputs 1, 2: f32 and a 16-bit dtype, either way round; output f32
};
inline constexpr int kPointwiseVector = 8;  // elements per step of the vectorized kernel

struct PointwisePlan {
  PointwiseKernel kernel = PointwiseKernel::generic;
  int64_t n = 0;        // elements
  int64_t head = 0;     // vectorized: elements [0, head) run one per thread, before the first aligned step
  int64_t vectors = 0;  // vectorized: steps of kPointwiseVector elements from `head`; the rest is the tail
};

// The kernel for `args` (checked). `vectorize`: whether the candidate is on. A vectorized
// kernel takes a call when its dtypes are one of the three forms above, every input is
// contiguous, every pointer is aligned to its element, and one head length below
// kPointwiseVector brings every pointer to a 16-byte boundary (a view at an odd offset read
// into a fresh output has none: generic).
PointwisePlan plan_pointwise(const PointwiseArgs& args, bool vectorize);
// The vectorized kernel's scalar element for its thread t (blockIdx.x blockDim.x + threadIdx.x):
// the head [0, head) and the tail [head + kPointwiseVector vectors, n) (fewer than 16 elements
// in all) go to threads 0, 1, ...; -1 for a thread with none. Host and device: the CPU tests
// emulate the kernel's coverage of [0, n) with it.
ATH_HOST_DEVICE inline int64_t pointwise_scalar_element(int64_t t, int64_t n, int64_t head, int64_t vectors) {
  const int64_t tail = head + vectors * kPointwiseVector;
  if (t >= head + (n - tail)) return -1;
  return t < head ? t : tail + (t - head);
}
// The vectorized kernel's grid: a block of 256 threads per 256 steps, at least one (the head
// and the tail), at most 8 per multiprocessor (the kernel strides over the rest).
unsigned pointwise_vector_blocks(int64_t vectors, int sm_count);
// Whether `strides` are the row-major strides of `sizes` (size-1 dims' strides are free).
bool row_major_strides(int ndim, const int64_t* sizes, const int64_t* strides);

}  // namespace athanor::cuda
