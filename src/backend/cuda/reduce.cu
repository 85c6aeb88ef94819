// The kernels of reduce.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "athanor/core/error.h"
#include "backend/cuda/reduce.h"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {
constexpr int kThreads = 256;

// F64: the f64 instantiation (f64 in, f64 out); the other one reads and writes f32, bf16, f16.
template <bool F64>
__device__ __forceinline__ double load(const void* p, DType dt, int64_t i) {
  if constexpr (F64) return static_cast<const double*>(p)[i];
  switch (dt) {
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::f16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Thread t: output o = t % outputs (adjacent threads, adjacent outputs: coalesced when the
// kept dims are the inner ones), chunk t / outputs.
template <bool F64>
__global__ void partial_kernel(const ReduceSumArgs a, int64_t outputs, int64_t reduced, ReduceChunks ch, double* partial) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= outputs * ch.chunks) return;
  const int64_t o = t % outputs, c = t / outputs;
  const int64_t base = strided_offset(o, a.kept_sizes, a.kept_strides, a.kept_ndim);
  double acc = 0.0;  // chunk c: elements c, c + chunks, ... (strided_index.h)
  for (int64_t r = c; r < reduced; r += ch.chunks)
    acc += load<F64>(a.x, a.x_dtype, base + strided_offset(r, a.red_sizes, a.red_strides, a.red_ndim));
  partial[c * outputs + o] = acc;
}

template <bool F64>
__global__ void finish_kernel(const double* partial, int64_t outputs, int64_t chunks, double scale, void* out, DType dt) {
  const int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (o >= outputs) return;
  double acc = 0.0;
  for (int64_t c = 0; c < chunks; ++c) acc += partial[c * outputs + o];
  const double v = acc * scale;
  if constexpr (F64) {
    static_cast<double*>(out)[o] = v;
    return;
  }
  switch (dt) {
    case DType::bf16: static_cast<__nv_bfloat16*>(out)[o] = __float2bfloat16_rn(static_cast<float>(v)); break;
    case DType::f16: static_cast<__half*>(out)[o] = __float2half_rn(static_cast<float>(v)); break;
    default: static_cast<float*>(out)[o] = static_cast<float>(v); break;
  }
}

int64_t product(const int64_t* s, int n) {
  int64_t p = 1;
  for (int i = 0; i < n; ++i) p *= s[i];
  return p;
}
// f64 data sums to f64 only (an f64 sum rounded to 16 or 32 bits is a cast: the caller's).
bool supported(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16 || d == DType::f64; }
bool supported(DType x, DType out) { return supported(x) && supported(out) && ((x == DType::f64) == (out == DType::f64)); }

__global__ void broadcast_scale_kernel(const double* g, BroadcastArgs b, double scale, double* out, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = scale * g[strided_offset(i, b.sizes, b.g_strides, b.ndim)];
}
unsigned blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }
}  // namespace

int64_t reduce_sum_scratch(int64_t outputs, int64_t reduced) {
  return outputs * reduce_chunks(outputs, reduced).chunks;
}

void reduce_sum(const ReduceSumArgs& a, double* scratch, cudaStream_t stream) {
  ATH_CHECK(a.kept_ndim >= 0 && a.kept_ndim <= kMaxIndexDims && a.red_ndim >= 0 && a.red_ndim <= kMaxIndexDims,
            "cuda sum", "too many dims (", a.kept_ndim, " kept, ", a.red_ndim, " reduced; at most ", kMaxIndexDims, ")");
  ATH_CHECK(supported(a.x_dtype, a.out_dtype), "cuda sum", "dtypes ", dtype_name(a.x_dtype), " -> ",
            dtype_name(a.out_dtype), Hint{"the CUDA sum reads and writes f32, bf16 and f16, and f64 to f64"});
  const int64_t outputs = product(a.kept_sizes, a.kept_ndim), reduced = product(a.red_sizes, a.red_ndim);
  if (outputs == 0) return;
  const ReduceChunks ch = reduce_chunks(outputs, reduced);
  const bool f64 = a.x_dtype == DType::f64;
  if (reduced > 0) {
    if (f64) partial_kernel<true><<<blocks(outputs * ch.chunks), kThreads, 0, stream>>>(a, outputs, reduced, ch, scratch);
    else partial_kernel<false><<<blocks(outputs * ch.chunks), kThreads, 0, stream>>>(a, outputs, reduced, ch, scratch);
    ATH_CUDA_LAUNCHED("reduce partial_kernel");
  }
  const int64_t chunks = reduced > 0 ? ch.chunks : 0;
  if (f64) finish_kernel<true><<<blocks(outputs), kThreads, 0, stream>>>(scratch, outputs, chunks, a.scale, a.out, a.out_dtype);
  else finish_kernel<false><<<blocks(outputs), kThreads, 0, stream>>>(scratch, outputs, chunks, a.scale, a.out, a.out_dtype);
  ATH_CUDA_LAUNCHED("reduce finish_kernel");
}

void broadcast_scale(const double* g, const BroadcastArgs& b, double scale, double* out, cudaStream_t stream) {
  ATH_CHECK(b.ndim >= 0 && b.ndim <= kMaxIndexDims, "cuda broadcast", b.ndim, " dims (at most ", kMaxIndexDims, ")");
  const int64_t n = product(b.sizes, b.ndim);
  if (n == 0) return;
  broadcast_scale_kernel<<<blocks(n), kThreads, 0, stream>>>(g, b, scale, out, n);
  ATH_CUDA_LAUNCHED("broadcast_scale_kernel");
}

}  // namespace athanor::cuda
