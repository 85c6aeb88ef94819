// The kernels of elementwise.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "athanor/core/error.h"
#include "backend/cuda/device_error.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/float_access.cuh"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {
constexpr int kThreads = 256;
unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

template <class T> __device__ float to_f32(T v);
template <> __device__ float to_f32<float>(float v) { return v; }
template <> __device__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ float to_f32<__half>(__half v) { return __half2float(v); }
template <class T> __device__ T from_f32(float v);
template <> __device__ float from_f32<float>(float v) { return v; }
template <> __device__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

template <class From, class To>
__global__ void cast_kernel(const From* x, To* y, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = from_f32<To>(to_f32<From>(x[i]));
}

template <class From>
void cast_from(const From* x, void* y, DType to, int64_t n, cudaStream_t stream) {
  switch (to) {
    case DType::f32: cast_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, static_cast<float*>(y), n); break;
    case DType::bf16: cast_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, static_cast<__nv_bfloat16*>(y), n); break;
    case DType::f16: cast_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, static_cast<__half*>(y), n); break;
    default: break;
  }
  ATH_CUDA_LAUNCHED("cast_kernel");
}

enum class Binary { add, mul };
template <Binary op>
__global__ void binary_kernel(const float* a, const float* b, float* y, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = op == Binary::add ? __fadd_rn(a[i], b[i]) : __fmul_rn(a[i], b[i]);
}
__global__ void scale_kernel(const float* x, float alpha, float* y, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = __fmul_rn(alpha, x[i]);
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
__global__ void gelu_fwd_kernel(const float* x, float* y, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  y[i] = 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
}
// d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),  t = tanh(u)
__global__ void gelu_bwd_kernel(const float* dy, const float* x, float* dx, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  const float t = tanhf(kSqrt2OverPi * (v + 0.044715f * v * v * v));
  const float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * v * v);
  dx[i] = dy[i] * d;
}

// An id outside [0, num) is recorded (device_error.h: the first one wins) and its row left
// zero, never read out of bounds. W: an unsigned integer of the element's width (the rows
// are copied bit for bit, whatever the float dtype).
template <class W>
__global__ void embedding_fwd_kernel(const W* w, const int64_t* idx, W* out, int64_t num, int64_t dim,
                                     DeviceErrorRecord* err) {
  const int64_t n = blockIdx.x;
  const int64_t row = idx[n];
  if (row < 0 || row >= num) {
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) out[n * dim + c] = 0;
    if (threadIdx.x == 0 &&
        atomicCAS(reinterpret_cast<int*>(&err->code), 0, static_cast<int>(DeviceErrorCode::embedding_id_out_of_range)) == 0) {
      err->a = n, err->b = row, err->c = num;
      __threadfence();
    }
    return;
  }
  const W* src = w + row * dim;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) out[n * dim + c] = src[c];
}
// Rows are split among kEmbRowGroups groups (row & (groups - 1)); block (g, column tile) owns
// the dW rows of group g and one column per thread, and walks every token in order, adding the
// ones whose row is its own. So each dW element is still a sum in token order, in f32 whatever
// dy's dtype (f32, bf16, f16: read through f32, as the CPU converts it first): the same bits as
// one thread per column walking all tokens, with groups x tiles blocks instead of dim / 256
// threads. The ids pass through shared memory a chunk at a time (one read per block, then
// broadcasts); the branch on a token is uniform across the block. Out-of-range ids (recorded
// by the forward) and padding_idx add nothing.
constexpr int kEmbRowGroups = 128;  // a power of two
constexpr int kEmbChunk = 1024;
// Acc: float (dy f32, bf16, f16 into an f32 dW) or double (f64 dy into an f64 dW, summed in f64).
template <class Acc> __device__ __forceinline__ Acc load_acc(const void* dy, DType dt, int64_t i);
template <> __device__ __forceinline__ float load_acc<float>(const void* dy, DType dt, int64_t i) { return load_as_f32(dy, dt, i); }
template <> __device__ __forceinline__ double load_acc<double>(const void* dy, DType, int64_t i) {
  return static_cast<const double*>(dy)[i];
}
template <class Acc>
__global__ void embedding_bwd_kernel(const void* dy, DType dy_dtype, const int64_t* idx, Acc* dw, int64_t N, int64_t num,
                                     int64_t dim, int64_t padding_idx) {
  __shared__ int64_t rows[kEmbChunk];
  const int64_t group = blockIdx.x;
  const int64_t c = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t n0 = 0; n0 < N; n0 += kEmbChunk) {
    const int64_t len = N - n0 < kEmbChunk ? N - n0 : kEmbChunk;
    __syncthreads();  // the previous chunk's reads are done
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
      const int64_t row = idx[n0 + j];
      const bool mine = row != padding_idx && row >= 0 && row < num && (row & (kEmbRowGroups - 1)) == group;
      rows[j] = mine ? row : -1;
    }
    __syncthreads();
    if (c >= dim) continue;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t row = rows[j];
      if (row < 0) continue;
      dw[row * dim + c] += load_acc<Acc>(dy, dy_dtype, (n0 + j) * dim + c);
    }
  }
}
}  // namespace

void cast(const void* x, DType from, void* y, DType to, int64_t n, cudaStream_t stream) {
  auto ok = [](DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; };
  ATH_CHECK(ok(from) && ok(to), "cuda cast", "cast from ", dtype_name(from), " to ", dtype_name(to),
            " has no CUDA kernel", Hint{"the CUDA casts cover f32, bf16 and f16"});
  if (n == 0) return;
  switch (from) {
    case DType::f32: cast_from(static_cast<const float*>(x), y, to, n, stream); break;
    case DType::bf16: cast_from(static_cast<const __nv_bfloat16*>(x), y, to, n, stream); break;
    case DType::f16: cast_from(static_cast<const __half*>(x), y, to, n, stream); break;
    default: break;
  }
}

void add(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  binary_kernel<Binary::add><<<blocks_for(n), kThreads, 0, stream>>>(a, b, y, n);
  ATH_CUDA_LAUNCHED("add");
}
void mul(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  binary_kernel<Binary::mul><<<blocks_for(n), kThreads, 0, stream>>>(a, b, y, n);
  ATH_CUDA_LAUNCHED("mul");
}
void scale(const float* x, float alpha, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, alpha, y, n);
  ATH_CUDA_LAUNCHED("scale");
}
void gelu_tanh_forward(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_fwd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  ATH_CUDA_LAUNCHED("gelu_fwd_kernel");
}
void gelu_tanh_backward(const float* dy, const float* x, float* dx, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_bwd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dy, x, dx, n);
  ATH_CUDA_LAUNCHED("gelu_bwd_kernel");
}
void embedding_forward(const void* weight, DType dtype, const int64_t* idx, void* out, int64_t N, int64_t num,
                       int64_t dim, DeviceErrorRecord* err, cudaStream_t stream) {
  if (N == 0) return;
  ATH_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::f64, "embedding", "a ",
            dtype_name(dtype), " table on cuda", Hint{"use an f32, bf16, f16 or f64 table"});
  if (dtype == DType::f64)
    embedding_fwd_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(static_cast<const uint64_t*>(weight), idx,
                                                                             static_cast<uint64_t*>(out), num, dim, err);
  else if (dtype == DType::f32)
    embedding_fwd_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(static_cast<const uint32_t*>(weight), idx,
                                                                             static_cast<uint32_t*>(out), num, dim, err);
  else
    embedding_fwd_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(static_cast<const uint16_t*>(weight), idx,
                                                                             static_cast<uint16_t*>(out), num, dim, err);
  ATH_CUDA_LAUNCHED("embedding_fwd_kernel");
}
void embedding_backward(const void* dy, DType dy_dtype, const int64_t* idx, float* dweight, int64_t N, int64_t num,
                        int64_t dim, int64_t padding_idx, cudaStream_t stream) {
  if (N == 0) return;
  const dim3 grid(kEmbRowGroups, static_cast<unsigned>((dim + kThreads - 1) / kThreads));
  embedding_bwd_kernel<<<grid, kThreads, 0, stream>>>(dy, dy_dtype, idx, dweight, N, num, dim, padding_idx);
  ATH_CUDA_LAUNCHED("embedding_bwd_kernel");
}
void embedding_backward(const double* dy, const int64_t* idx, double* dweight, int64_t N, int64_t num, int64_t dim,
                        int64_t padding_idx, cudaStream_t stream) {
  if (N == 0) return;
  const dim3 grid(kEmbRowGroups, static_cast<unsigned>((dim + kThreads - 1) / kThreads));
  embedding_bwd_kernel<<<grid, kThreads, 0, stream>>>(dy, DType::f64, idx, dweight, N, num, dim, padding_idx);
  ATH_CUDA_LAUNCHED("embedding_bwd_kernel f64");
}

}  // namespace athanor::cuda
