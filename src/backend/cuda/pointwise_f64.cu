// The f64 kernel of pointwise.h: the generic kernel's loop with the math in double, for calls
// where an input or the output is f64 (gradchecks on the GPU, a step replayed in f64).
//
// The formulas are the CPU's f64 kernels', operation for operation (backend/cpu/activation.cpp's
// scalar forms, swiglu.cpp, dropout.cpp), each operation rounded once (__dadd_rn, __dmul_rn,
// ...), so a result does not depend on which multiply-adds a compiler fuses. The ops of one
// operation (copy, add, sub, mul, div, scale, relu, dropout, rsqrt_add) give the CPU's bits;
// the others agree to a few ulp: the CPU's per-ISA builds fuse some multiply-adds (GCC's
// default for C++), and CUDA's double exp, tanh and erfc are within 1-5 ulp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/cuda/float_access.cuh"
#include "backend/cuda/pointwise.h"
#include "backend/cuda/pointwise_kernels.cuh"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {
constexpr int kThreads = 256;
// The CPU's constants (backend/cpu/activation.cpp).
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // √(2/π)
constexpr double kGeluC = 0.044715;
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1/√(2π)

__device__ __forceinline__ double add(double x, double y) { return __dadd_rn(x, y); }
__device__ __forceinline__ double sub(double x, double y) { return __dsub_rn(x, y); }
__device__ __forceinline__ double mul(double x, double y) { return __dmul_rn(x, y); }
__device__ __forceinline__ double div(double x, double y) { return __ddiv_rn(x, y); }

// e^x / (1 + e^x) for x < 0 (no overflow, denormal tails kept), else 1 / (1 + e^-x): the CPU's sigmoid_s.
__device__ __forceinline__ double sigmoid(double x) {
  if (x < 0.0) {
    const double e = exp(x);
    return div(e, add(1.0, e));
  }
  return div(1.0, add(1.0, exp(-x)));
}
// √(2/π) (x + 0.044715 x³)
__device__ __forceinline__ double gelu_u(double x) { return mul(kSqrt2OverPi, add(x, mul(mul(mul(kGeluC, x), x), x))); }

__device__ double apply_f64(const PointwiseArgs& a, const double* v, int64_t i) {
  switch (a.op) {
    case PointwiseOp::copy: return v[0];
    case PointwiseOp::add: return add(v[0], v[1]);
    case PointwiseOp::sub: return sub(v[0], v[1]);
    case PointwiseOp::mul: return mul(v[0], v[1]);
    case PointwiseOp::div: return div(v[0], v[1]);
    case PointwiseOp::scale: return mul(a.alpha, v[0]);
    case PointwiseOp::relu: return v[0] > 0.0 ? v[0] : (v[0] != v[0] ? v[0] : 0.0);  // NaN stays NaN, as the CPU's f64 relu
    case PointwiseOp::relu_backward: return v[1] > 0.0 ? v[0] : 0.0;
    case PointwiseOp::gelu_tanh: {  // x/2 (1 + tanh u) = x / (1 + e^{-2u})
      const double x = v[0];
      return div(x, add(1.0, exp(mul(-2.0, gelu_u(x)))));
    }
    case PointwiseOp::gelu_tanh_backward: {
      // g (0.5 (1 + t) + 0.5 x (1 - t²) u'),  t = tanh u,  u' = √(2/π) (1 + 3·0.044715 x²)
      const double g = v[0], x = v[1];
      const double du = mul(kSqrt2OverPi, add(1.0, mul(mul(3 * kGeluC, x), x)));
      const double t = tanh(gelu_u(x));
      return mul(g, add(mul(0.5, add(1.0, t)), mul(mul(mul(0.5, x), sub(1.0, mul(t, t))), du)));
    }
    case PointwiseOp::gelu_erf: return mul(mul(0.5, v[0]), erfc(mul(-v[0], kInvSqrt2)));  // x/2 erfc(-x/√2)
    case PointwiseOp::gelu_erf_backward: {  // g (Φ(x) + x φ(x))
      const double g = v[0], x = v[1];
      const double cdf = mul(0.5, erfc(mul(-x, kInvSqrt2)));
      const double pdf = mul(kInvSqrt2Pi, exp(mul(mul(-0.5, x), x)));
      return mul(g, add(cdf, mul(x, pdf)));
    }
    // SwiGLU (the CPU's swiglu.cpp): a = gate, b = up, c = dh; s = 1 / (1 + e^-a) there.
    case PointwiseOp::silu_mul: return mul(div(v[0], add(1.0, exp(-v[0]))), v[1]);
    case PointwiseOp::silu_mul_grad_gate: {  // c b s (1 + a (1 - s))
      const double s = div(1.0, add(1.0, exp(-v[0])));
      return mul(mul(mul(v[2], v[1]), s), add(1.0, mul(v[0], sub(1.0, s))));
    }
    case PointwiseOp::silu_mul_grad_up: {  // c a s
      const double s = div(1.0, add(1.0, exp(-v[0])));
      return mul(mul(v[2], v[0]), s);
    }
    case PointwiseOp::dropout: return dropout_keeps(a, i) ? mul(v[0], a.alpha) : 0.0;
    case PointwiseOp::rsqrt_add: return div(1.0, sqrt(add(v[0], a.alpha)));  // sqrt: correctly rounded
    case PointwiseOp::tanh: return tanh(v[0]);
    case PointwiseOp::tanh_backward: return mul(v[0], sub(1.0, mul(v[1], v[1])));  // g (1 - y²)
    case PointwiseOp::sigmoid: return sigmoid(v[0]);
    case PointwiseOp::sigmoid_backward: return mul(mul(v[0], v[1]), sub(1.0, v[1]));  // g y (1 - y)
    case PointwiseOp::silu: return mul(v[0], sigmoid(v[0]));
    case PointwiseOp::silu_backward: {  // g s (1 + x (1 - s)),  s = sigmoid(x)
      const double g = v[0], x = v[1], s = sigmoid(x);
      return mul(mul(g, s), add(1.0, mul(x, sub(1.0, s))));
    }
  }
  return 0.0;
}

__global__ void pointwise_f64_kernel(const PointwiseArgs a, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += step) {
    double v[3] = {0.0, 0.0, 0.0};
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      if (k >= a.n_in) break;
      const PointwiseOperand& o = a.in[k];
      v[k] = load_as_f64(o.data, o.dtype, o.contiguous ? i : strided_offset(i, a.sizes, o.strides, a.ndim));
    }
    store_from_f64(a.out, a.out_dtype, i, apply_f64(a, v, i));
  }
}
}  // namespace

void launch_pointwise_f64(const PointwiseArgs& a, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65536 * 8 ? blocks : 65536 * 8);  // grid-stride beyond
  pointwise_f64_kernel<<<grid, kThreads, 0, stream>>>(a, n);
  ATH_CUDA_LAUNCHED("pointwise_f64_kernel");
}

}  // namespace athanor::cuda
