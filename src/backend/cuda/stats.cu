// The kernels of stats.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "athanor/core/error.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda/stats.h"

namespace athanor::cuda {

namespace {

__device__ __forceinline__ double load(const StatsInput& x, int64_t i) {
  const int64_t off = x.contiguous ? i : strided_offset(i, x.sizes, x.strides, x.ndim);
  switch (x.dtype) {
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(x.data)[off]);
    case DType::f16: return __half2float(static_cast<const __half*>(x.data)[off]);
    default: return static_cast<const float*>(x.data)[off];
  }
}

// How field f of two partials combine: a max, a min, or a sum.
__device__ __forceinline__ double combine(int f, double a, double b) {
  if (f == kAbsMax || f == kMax) return a > b ? a : b;
  if (f == kMin) return a < b ? a : b;
  return a + b;
}
__device__ __forceinline__ double identity(int f) {
  if (f == kMin) return __longlong_as_double(0x7ff0000000000000LL);   // +inf
  if (f == kMax) return __longlong_as_double(0xfff0000000000000LL);   // -inf
  return 0.0;  // sums, counts and |v| max
}

// The block's threads' acc[F] combined into out[0..F) by thread 0 (a fixed tree: the same
// order every run). blockDim.x == kStatsThreads.
template <int F> __device__ void block_combine(double (&acc)[F], double* out) {
  __shared__ double s[F][kStatsThreads];
  const int t = threadIdx.x;
  for (int f = 0; f < F; ++f) s[f][t] = acc[f];
  __syncthreads();
  for (int half = kStatsThreads / 2; half > 0; half /= 2) {
    if (t < half)
      for (int f = 0; f < F; ++f) s[f][t] = combine(F == 1 ? kSum : f, s[f][t], s[f][t + half]);
    __syncthreads();
  }
  if (t == 0)
    for (int f = 0; f < F; ++f) out[f] = s[f][0];
}

__global__ void stats_partial_kernel(const StatsInput x, SaturationMode mode, double* partial) {
  double acc[kStatsFields];
  for (int f = 0; f < kStatsFields; ++f) acc[f] = identity(f);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < x.numel; i += stride) {
    const double v = load(x, i);
    if (isnan(v)) {
      acc[kNaN] += 1;
      continue;
    }
    if (isinf(v)) {
      acc[kInf] += 1;
      continue;
    }
    acc[kFinite] += 1;
    acc[kSum] += v;
    acc[kSumSquares] += v * v;
    const double a = fabs(v);
    if (a > acc[kAbsMax]) acc[kAbsMax] = a;
    if (v < acc[kMin]) acc[kMin] = v;
    if (v > acc[kMax]) acc[kMax] = v;
    if (v == 0) acc[kZeros] += 1;
    if (mode == SaturationMode::sigmoid && (v < 0.01 || v > 0.99)) acc[kSaturated] += 1;
    if (mode == SaturationMode::tanh && a > 0.99) acc[kSaturated] += 1;
  }
  block_combine<kStatsFields>(acc, partial + static_cast<int64_t>(blockIdx.x) * kStatsFields);
}

// One block over the kStatsBlocks partials of F fields each.
template <int F> __global__ void stats_finish_kernel(const double* partial, double* out) {
  double acc[F];
  for (int f = 0; f < F; ++f) acc[f] = F == 1 ? 0.0 : identity(f);
  for (int b = threadIdx.x; b < kStatsBlocks; b += blockDim.x)
    for (int f = 0; f < F; ++f) acc[f] = combine(F == 1 ? kSum : f, acc[f], partial[static_cast<int64_t>(b) * F + f]);
  block_combine<F>(acc, out);
}

__global__ void distance_partial_kernel(const StatsInput a, const StatsInput b, double* partial) {
  double acc[1] = {0.0};
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.numel; i += stride) {
    const double d = load(b, i) - load(a, i);
    acc[0] += d * d;
  }
  block_combine<1>(acc, partial + blockIdx.x);
}

__global__ void fired_kernel(const StatsInput x, int64_t units, int64_t inner, unsigned char* fired) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < x.numel; i += stride)
    if (load(x, i) > 0) fired[(i / inner) % units] = 1;  // every writer writes 1: no race on the result
}

__global__ void histogram_kernel(const StatsInput x, const HistogramSpec h, unsigned long long* counts) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int nb = h.buckets;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < x.numel; i += stride) {
    const double v = load(x, i);
    if (isnan(v) || isinf(v)) continue;
    // The CPU's rule (step_observer.cpp histogram()): bucket i holds (limit[i-1], limit[i]].
    int64_t k = static_cast<int64_t>(ceil((v - h.min) / h.width)) - 1;
    k = k < 0 ? 0 : k > nb - 1 ? nb - 1 : k;
    while (k > 0 && v <= h.limits[k - 1]) --k;
    while (k + 1 < nb && v > h.limits[k]) ++k;
    atomicAdd(counts + k, 1ULL);
  }
}

void check_input(const StatsInput& x, const char* what) {
  ATH_CHECK(x.ndim >= 0 && x.ndim <= kMaxIndexDims, what, "a ", x.ndim, "-D tensor (at most ", kMaxIndexDims, " dims)",
            Hint{"reshape to fewer dims first"});
  ATH_CHECK(x.dtype == DType::f32 || x.dtype == DType::bf16 || x.dtype == DType::f16, what, "dtype ",
            dtype_name(x.dtype), Hint{"the CUDA statistics read f32, bf16 and f16"});
}

unsigned grid_for(int64_t n) {
  const int64_t want = (n + kStatsThreads - 1) / kStatsThreads;
  return static_cast<unsigned>(want < 1 ? 1 : want > kStatsBlocks ? kStatsBlocks : want);
}

}  // namespace

void value_stats(const StatsInput& x, SaturationMode mode, double* scratch, double* out, cudaStream_t stream) {
  check_input(x, "cuda value_stats");
  // Always kStatsBlocks blocks: the finish kernel reads every block's partial.
  stats_partial_kernel<<<kStatsBlocks, kStatsThreads, 0, stream>>>(x, mode, scratch);
  ATH_CUDA_LAUNCHED("stats_partial_kernel");
  stats_finish_kernel<kStatsFields><<<1, kStatsThreads, 0, stream>>>(scratch, out);
  ATH_CUDA_LAUNCHED("stats_finish_kernel");
}

void squared_distance(const StatsInput& a, const StatsInput& b, double* scratch, double* out, cudaStream_t stream) {
  check_input(a, "cuda squared_distance");
  check_input(b, "cuda squared_distance");
  ATH_CHECK(a.numel == b.numel, "cuda squared_distance", "element counts differ (", a.numel, " and ", b.numel, ")");
  distance_partial_kernel<<<kStatsBlocks, kStatsThreads, 0, stream>>>(a, b, scratch);
  ATH_CUDA_LAUNCHED("distance_partial_kernel");
  stats_finish_kernel<1><<<1, kStatsThreads, 0, stream>>>(scratch, out);
  ATH_CUDA_LAUNCHED("distance_finish_kernel");
}

void units_fired(const StatsInput& x, int64_t units, int64_t inner, unsigned char* fired, cudaStream_t stream) {
  check_input(x, "cuda units_fired");
  ATH_CHECK(units > 0 && inner > 0, "cuda units_fired", "units ", units, ", inner ", inner, " (both must be > 0)");
  if (x.numel == 0) return;
  fired_kernel<<<grid_for(x.numel), kStatsThreads, 0, stream>>>(x, units, inner, fired);
  ATH_CUDA_LAUNCHED("fired_kernel");
}

void histogram_counts(const StatsInput& x, const HistogramSpec& h, unsigned long long* counts, cudaStream_t stream) {
  check_input(x, "cuda histogram_counts");
  ATH_CHECK(h.buckets >= 1 && h.buckets <= kMaxHistogramBuckets && h.width > 0, "cuda histogram_counts", h.buckets,
            " buckets of width ", h.width, " (1 to ", kMaxHistogramBuckets, " buckets of positive width)");
  if (x.numel == 0) return;
  histogram_kernel<<<grid_for(x.numel), kStatsThreads, 0, stream>>>(x, h, counts);
  ATH_CUDA_LAUNCHED("histogram_kernel");
}

}  // namespace athanor::cuda
