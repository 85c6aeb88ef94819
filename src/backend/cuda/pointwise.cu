// The f32 kernels of pointwise.h: the generic one and the vectorized candidate, both over
// the one apply() below; the f64 kernel is in pointwise_f64.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstring>

#include "athanor/core/error.h"
#include "backend/cuda/candidates.h"
#include "backend/cuda/float_access.cuh"
#include "backend/cuda/pointwise.h"
#include "backend/cuda/pointwise_kernels.cuh"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {
constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// The op's formula in f32: the one source of both f32 kernels' results. `alpha` is a.alpha
// rounded to f32 (once per thread).
__device__ __forceinline__ float apply(const PointwiseArgs& a, float alpha, const float* v, int64_t i) {
  switch (a.op) {
    case PointwiseOp::copy: return v[0];
    case PointwiseOp::add: return __fadd_rn(v[0], v[1]);
    case PointwiseOp::sub: return __fsub_rn(v[0], v[1]);
    case PointwiseOp::mul: return __fmul_rn(v[0], v[1]);
    case PointwiseOp::div: return __fdiv_rn(v[0], v[1]);
    case PointwiseOp::scale: return __fmul_rn(alpha, v[0]);
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
    case PointwiseOp::dropout: return dropout_keeps(a, i) ? __fmul_rn(v[0], alpha) : 0.0f;
    case PointwiseOp::rsqrt_add: return static_cast<float>(1.0 / sqrt(static_cast<double>(v[0]) + static_cast<double>(alpha)));
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
  const float alpha = static_cast<float>(a.alpha);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += step) {
    float v[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      if (k >= a.n_in) break;
      const PointwiseOperand& o = a.in[k];
      v[k] = load_as_f32(o.data, o.dtype, o.contiguous ? i : strided_offset(i, a.sizes, o.strides, a.ndim));
    }
    store_from_f32(a.out, a.out_dtype, i, apply(a, alpha, v, i));
  }
}

// ---- The vectorized candidate: the dtypes are template parameters, so a step is plain
// 16-byte loads and stores with the conversions inlined.
constexpr int kVec = kPointwiseVector;

template <class T> __device__ __forceinline__ float widen(T v);
template <> __device__ __forceinline__ float widen<float>(float v) { return v; }
template <> __device__ __forceinline__ float widen<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float widen<__half>(__half v) { return __half2float(v); }
// The same roundings as store_from_f32.
template <class T> __device__ __forceinline__ T narrow(float v);
template <> __device__ __forceinline__ float narrow<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half narrow<__half>(float v) { return __float2half_rn(v); }

// kVec elements of T: one 16-byte word for 16-bit types, two for f32.
template <class T> constexpr int kWords = static_cast<int>(sizeof(T)) * kVec / 16;

// Elements [i0, i0 + kVec) of `base` (16-byte aligned at i0), widened to f32.
template <class T> __device__ __forceinline__ void load_vector(const void* base, int64_t i0, float (&x)[kVec]) {
  const int4* src = reinterpret_cast<const int4*>(static_cast<const T*>(base) + i0);
  int4 w[kWords<T>];
#pragma unroll
  for (int k = 0; k < kWords<T>; ++k) w[k] = src[k];
  T e[kVec];
  static_assert(sizeof(e) == sizeof(w), "a vector is whole 16-byte words");
  memcpy(e, w, sizeof(e));  // registers to registers
#pragma unroll
  for (int j = 0; j < kVec; ++j) x[j] = widen<T>(e[j]);
}

template <class T> __device__ __forceinline__ void store_vector(void* base, int64_t i0, const float (&y)[kVec]) {
  T e[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) e[j] = narrow<T>(y[j]);
  int4 w[kWords<T>];
  memcpy(w, e, sizeof(w));
  int4* dst = reinterpret_cast<int4*>(static_cast<T*>(base) + i0);
#pragma unroll
  for (int k = 0; k < kWords<T>; ++k) dst[k] = w[k];
}

// In0: input 0's type; In1: inputs 1 and 2's (unused by unary ops); Out: the output's.
// kCast: the op is copy (the plan's vectorized_cast), so y = x (apply's copy) without the
// switch over every op, which would make each cast instantiation as large as the others.
// Steps v = 0 .. vectors-1 cover [head, head + kVec vectors); the head [0, head) and the
// tail (fewer than kVec elements each) run one element per thread of the first block.
template <class In0, class In1, class Out, bool kCast>
__global__ void __launch_bounds__(kThreads) pointwise_vector_kernel(const PointwiseArgs a, int64_t n, int64_t head,
                                                                    int64_t vectors) {
  const float alpha = static_cast<float>(a.alpha);
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t s = first; s < vectors; s += step) {
    const int64_t i0 = head + s * kVec;
    float x[3][kVec] = {};
    load_vector<In0>(a.in[0].data, i0, x[0]);
    if (a.n_in > 1) load_vector<In1>(a.in[1].data, i0, x[1]);
    if (a.n_in > 2) load_vector<In1>(a.in[2].data, i0, x[2]);
    float y[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float v[3] = {x[0][j], x[1][j], x[2][j]};
      y[j] = kCast ? v[0] : apply(a, alpha, v, i0 + j);  // the true index: dropout's keep bit depends on it
    }
    store_vector<Out>(a.out, i0, y);
  }
  if (const int64_t i = pointwise_scalar_element(first, n, head, vectors); i >= 0) {
    float v[3] = {0.0f, 0.0f, 0.0f};
    v[0] = widen<In0>(static_cast<const In0*>(a.in[0].data)[i]);
    if (a.n_in > 1) v[1] = widen<In1>(static_cast<const In1*>(a.in[1].data)[i]);
    if (a.n_in > 2) v[2] = widen<In1>(static_cast<const In1*>(a.in[2].data)[i]);
    static_cast<Out*>(a.out)[i] = narrow<Out>(kCast ? v[0] : apply(a, alpha, v, i));
  }
}

// f(T{}) with T the C++ type of d (f32, bf16 or f16; the plan has excluded the rest).
template <class F> void with_type(DType d, F&& f) {
  switch (d) {
    case DType::bf16: f(__nv_bfloat16{}); break;
    case DType::f16: f(__half{}); break;
    default: f(float{}); break;
  }
}

int sm_count_of_current_device() {
  constexpr int kCached = 64;
  static std::atomic<int> cache[kCached] = {};
  int dev = 0;
  ATH_CUDA(cudaGetDevice(&dev));
  if (dev >= 0 && dev < kCached) {
    if (const int c = cache[dev].load(std::memory_order_relaxed)) return c;
  }
  int c = 0;
  ATH_CUDA(cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev));
  if (dev >= 0 && dev < kCached) cache[dev].store(c, std::memory_order_relaxed);
  return c;
}

template <class In0, class In1, class Out, bool kCast>
void launch_vector_kernel(const PointwiseArgs& a, const PointwisePlan& p, unsigned grid, cudaStream_t stream) {
  pointwise_vector_kernel<In0, In1, Out, kCast><<<grid, kThreads, 0, stream>>>(a, p.n, p.head, p.vectors);
}

// The instantiations of pointwise.h's three forms: 3 + 9 (cast) + 4 (mixed; f32-f32 is the first form's).
void launch_vectorized(const PointwiseArgs& a, const PointwisePlan& p, cudaStream_t stream) {
  const unsigned grid = pointwise_vector_blocks(p.vectors, sm_count_of_current_device());
  const DType t0 = a.in[0].dtype, t1 = a.n_in > 1 ? a.in[1].dtype : t0;
  switch (p.kernel) {
    case PointwiseKernel::vectorized:
      with_type(t0, [&](auto t) {
        using T = decltype(t);
        launch_vector_kernel<T, T, T, false>(a, p, grid, stream);
      });
      break;
    case PointwiseKernel::vectorized_cast:
      with_type(t0, [&](auto s) {
        with_type(a.out_dtype, [&](auto d) {
          using S = decltype(s);
          launch_vector_kernel<S, S, decltype(d), true>(a, p, grid, stream);
        });
      });
      break;
    case PointwiseKernel::vectorized_mixed:  // one of t0, t1 is f32, the other 16-bit; out f32
      with_type(t0 == DType::f32 ? t1 : t0, [&](auto h) {
        using H = decltype(h);
        if (t0 == DType::f32) launch_vector_kernel<float, H, float, false>(a, p, grid, stream);
        else launch_vector_kernel<H, float, float, false>(a, p, grid, stream);
      });
      break;
    default: ATH_ASSERT(false);
  }
  ATH_CUDA_LAUNCHED("pointwise_vector_kernel");
}
}  // namespace

void pointwise(const PointwiseArgs& a, cudaStream_t stream) {
  const PointwisePlan p = plan_pointwise(a, candidate_enabled(Candidate::pointwise_vectorized));  // checks a
  if (p.n == 0) return;
  switch (p.kernel) {
    case PointwiseKernel::generic_f64: launch_pointwise_f64(a, p.n, stream); return;
    case PointwiseKernel::vectorized:
    case PointwiseKernel::vectorized_cast:
    case PointwiseKernel::vectorized_mixed: launch_vectorized(a, p, stream); return;
    case PointwiseKernel::generic: break;
  }
  const int64_t blocks = (p.n + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65536 * 8 ? blocks : 65536 * 8);  // grid-stride beyond
  pointwise_kernel<<<grid, kThreads, 0, stream>>>(a, p.n);
  ATH_CUDA_LAUNCHED("pointwise_kernel");
}

}  // namespace athanor::cuda
