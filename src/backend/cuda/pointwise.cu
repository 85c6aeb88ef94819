// The kernel of pointwise.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "athanor/core/error.h"
#include "backend/cuda/philox.cuh"
#include "backend/cuda/pointwise.h"
#include "backend/cuda/float_access.cuh"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {
constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

__device__ float apply(const PointwiseArgs& a, const float* v, int64_t i) {
  switch (a.op) {
    case PointwiseOp::copy: return v[0];
    case PointwiseOp::add: return __fadd_rn(v[0], v[1]);
    case PointwiseOp::sub: return __fsub_rn(v[0], v[1]);
    case PointwiseOp::mul: return __fmul_rn(v[0], v[1]);
    case PointwiseOp::div: return __fdiv_rn(v[0], v[1]);
    case PointwiseOp::scale: return __fmul_rn(a.alpha, v[0]);
    case PointwiseOp::relu: return v[0] > 0.0f ? v[0] : 0.0f;
    case PointwiseOp::relu_backward: return v[1] > 0.0f ? v[0] : 0.0f;
    case PointwiseOp::gelu_tanh: {
      const float x = v[0];
      return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
    }
    case PointwiseOp::gelu_tanh_backward: {
      // d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),  t = tanh(u)
      const float x = v[1], t = tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x));
      return v[0] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x));
    }
    case PointwiseOp::gelu_erf: return 0.5f * v[0] * (1.0f + erff(v[0] * kInvSqrt2));
    case PointwiseOp::gelu_erf_backward: {
      // d/dx = Φ(x) + x φ(x)
      const float x = v[1];
      return v[0] * (0.5f * (1.0f + erff(x * kInvSqrt2)) + x * kInvSqrt2Pi * expf(-0.5f * x * x));
    }
    case PointwiseOp::silu_mul: return v[0] * sigmoid(v[0]) * v[1];
    case PointwiseOp::silu_mul_grad_gate: {
      // d silu(g)/dg = s (1 + g (1 - s)),  s = sigmoid(g)
      const float s = sigmoid(v[0]);
      return v[2] * v[1] * (s * (1.0f + v[0] * (1.0f - s)));
    }
    case PointwiseOp::silu_mul_grad_up: return v[2] * (v[0] * sigmoid(v[0]));
    case PointwiseOp::dropout: {
      const uint4 r = philox4x32_device(a.seed, a.offset + static_cast<uint64_t>(i / 4));
      const int k = static_cast<int>(i % 4);
      const uint32_t w = k == 0 ? r.x : k == 1 ? r.y : k == 2 ? r.z : r.w;
      return (w >> 8) >= a.threshold ? __fmul_rn(v[0], a.alpha) : 0.0f;
    }
    case PointwiseOp::rsqrt_add: return static_cast<float>(1.0 / sqrt(static_cast<double>(v[0]) + static_cast<double>(a.alpha)));
    case PointwiseOp::tanh: return tanhf(v[0]);
    case PointwiseOp::tanh_backward: return v[0] * (1.0f - v[1] * v[1]);
    case PointwiseOp::sigmoid: return sigmoid(v[0]);
    case PointwiseOp::sigmoid_backward: return v[0] * v[1] * (1.0f - v[1]);
    case PointwiseOp::silu: return v[0] * sigmoid(v[0]);
    case PointwiseOp::silu_backward: {
      const float s = sigmoid(v[1]);
      return v[0] * (s * (1.0f + v[1] * (1.0f - s)));
    }
  }
  return 0.0f;
}

__global__ void pointwise_kernel(const PointwiseArgs a, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += step) {
    float v[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      if (k >= a.n_in) break;
      const PointwiseOperand& o = a.in[k];
      v[k] = load_as_f32(o.data, o.dtype, o.contiguous ? i : strided_offset(i, a.sizes, o.strides, a.ndim));
    }
    store_from_f32(a.out, a.out_dtype, i, apply(a, v, i));
  }
}

bool supported(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }
}  // namespace

int pointwise_arity(PointwiseOp op) {
  switch (op) {
    case PointwiseOp::copy:
    case PointwiseOp::scale:
    case PointwiseOp::relu:
    case PointwiseOp::gelu_tanh:
    case PointwiseOp::gelu_erf:
    case PointwiseOp::dropout:
    case PointwiseOp::rsqrt_add:
    case PointwiseOp::tanh:
    case PointwiseOp::sigmoid:
    case PointwiseOp::silu: return 1;
    case PointwiseOp::silu_mul_grad_gate:
    case PointwiseOp::silu_mul_grad_up: return 3;
    default: return 2;
  }
}

void pointwise(const PointwiseArgs& a, cudaStream_t stream) {
  ATH_CHECK(a.ndim >= 0 && a.ndim <= kMaxIndexDims, "cuda pointwise", a.ndim, " dims (at most ", kMaxIndexDims, ")",
            Hint{"reshape to fewer dims first"});
  ATH_CHECK(a.n_in == pointwise_arity(a.op), "cuda pointwise", "op ", static_cast<int>(a.op), " reads ",
            pointwise_arity(a.op), " inputs, given ", a.n_in);
  for (int k = 0; k < a.n_in; ++k)
    ATH_CHECK(supported(a.in[k].dtype), "cuda pointwise", "input ", k, " is ", dtype_name(a.in[k].dtype),
              Hint{"the CUDA pointwise kernel takes f32, bf16 and f16"});
  ATH_CHECK(supported(a.out_dtype), "cuda pointwise", "output dtype ", dtype_name(a.out_dtype),
            Hint{"the CUDA pointwise kernel writes f32, bf16 and f16"});
  int64_t n = 1;
  for (int d = 0; d < a.ndim; ++d) n *= a.sizes[d];
  if (n == 0) return;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65536 * 8 ? blocks : 65536 * 8);  // grid-stride beyond
  pointwise_kernel<<<grid, kThreads, 0, stream>>>(a, n);
  ATH_CUDA_LAUNCHED("pointwise_kernel");
}

}  // namespace athanor::cuda
