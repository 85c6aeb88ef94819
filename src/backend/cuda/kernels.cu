// The fused CUDA kernels of kernels.h (the norms' are in norm_kernels.cu). Few translation
// units on purpose: every .cu is compiled three times (sm_80, sm_90a, sm_90 PTX), and CI's
// budget is counted in them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "athanor/core/error.h"
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/float_access.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/philox.cuh"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {

// The math of the row kernels in their accumulation type: f32 (the f32, bf16 and f16 data) or
// f64 (f64 data, math and accumulation in double); block_sum, block_max, max_of: block_reduce.cuh.
__device__ __forceinline__ float exp_of(float v) { return expf(v); }
__device__ __forceinline__ double exp_of(double v) { return exp(v); }
__device__ __forceinline__ float log_of(float v) { return logf(v); }
__device__ __forceinline__ double log_of(double v) { return log(v); }

unsigned grid_rows(int64_t rows) { return static_cast<unsigned>(rows); }

// ---- softmax and cross-entropy ----------------------------------------------------------
// T: the data; the math in T as well (f32 for f32, f64 for f64).

template <class T>
__global__ void softmax_kernel(const T* x, T* y, int64_t cols) {
  __shared__ T sh[32];
  const T* xr = x + blockIdx.x * cols;
  T m = T(-INFINITY);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = max_of(m, xr[c]);
  m = block_max(m, sh);
  T s = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += exp_of(xr[c] - m);
  const T inv = T(1) / block_sum(s, sh);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y[blockIdx.x * cols + c] = exp_of(xr[c] - m) * inv;
}

template <class T>
__global__ void softmax_bwd_kernel(const T* dy, const T* y, T* dx, int64_t cols) {
  __shared__ T sh[32];
  const int64_t off = blockIdx.x * cols;
  T s = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += dy[off + c] * y[off + c];
  s = block_sum(s, sh);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dx[off + c] = y[off + c] * (dy[off + c] - s);
}

// Logits of any of f32, bf16, f16 are read as f32 (float_access.cuh's widen), f64 ones as they
// are; narrow writes a result back in the logits' dtype.
template <class T> __device__ __forceinline__ T narrow(float v);
template <> __device__ __forceinline__ float narrow<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half narrow<__half>(float v) { return __float2half_rn(v); }
template <class T> __device__ __forceinline__ T narrow(double v);
template <> __device__ __forceinline__ double narrow<double>(double v) { return v; }

// loss = logsum - (1 - eps)(x[t] - max) - eps mean_c(x[c] - max); A: the math's type (f32 for
// f32/bf16/f16 logits, f64 for f64 ones), also the type of stats and loss.
template <class T, class A>
__global__ void ce_fwd_kernel(const T* logits, const int64_t* target, A* stats, A* loss, int64_t C, int64_t ignore_index,
                              A smoothing) {
  __shared__ A sh[32];
  const int64_t n = blockIdx.x;
  const int64_t t = target[n];
  if (t == ignore_index) {
    if (threadIdx.x == 0) stats[2 * n] = stats[2 * n + 1] = loss[n] = 0;
    return;
  }
  const T* xr = logits + n * C;
  // One read of the row (an online softmax; the fused classifier, issue 22): each thread keeps
  // its running max mt, the sum st of exp(v - mt) (rescaled when mt grows) and the plain sum of
  // v (label smoothing's mean); the block then rescales every st to the row's max. A NaN
  // compares false and reaches st through exp, so the loss is NaN, as before.
  A mt = A(-INFINITY), st = 0, sv = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const A v = widen(xr[c]);
    if (v > mt) {
      st = st * exp_of(mt - v) + A(1);  // exp(-inf) = 0 on a thread's first element
      mt = v;
    } else if (v != A(-INFINITY)) {  // a masked logit adds nothing (and -inf - -inf would be NaN)
      st += exp_of(v - mt);
    }
    sv += v;
  }
  const A m = block_max(mt, sh);
  // A thread whose max is still -inf saw no finite logit: its st is 0 (no element, as when
  // C < blockDim, or only -inf) or NaN (a NaN logit, which must reach the loss): it adds st.
  const A logsum = log_of(block_sum(mt == A(-INFINITY) ? st : st * exp_of(mt - m), sh));
  const A mean_shifted = block_sum(sv, sh) / C - m;
  if (threadIdx.x == 0) {
    stats[2 * n] = m;
    stats[2 * n + 1] = logsum;
    // Without smoothing the mean is not used at all: a masked (-inf) logit makes it -inf, and
    // 0 * -inf would be NaN.
    loss[n] = logsum - (A(1) - smoothing) * (widen(xr[t]) - m) - (smoothing != A(0) ? smoothing * mean_shifted : A(0));
  }
}

template <class T, class A>
__global__ void ce_bwd_kernel(const T* logits, const int64_t* target, const A* stats, const A* factor, int64_t factor_stride,
                              T* dlogits, int64_t C, int64_t ignore_index, A smoothing) {
  const int64_t n = blockIdx.x;
  const int64_t t = target[n];
  const A m = stats[2 * n], logsum = stats[2 * n + 1];
  const A scale = factor[n * factor_stride];
  const T* xr = logits + n * C;
  T* dr = dlogits + n * C;
  const A uniform = smoothing / C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    if (t == ignore_index) {
      dr[c] = narrow<T>(A(0));
      continue;
    }
    const A p = exp_of((widen(xr[c]) - m) - logsum);  // read before the in-place write below
    dr[c] = narrow<T>(scale * (p - (c == t ? A(1) - smoothing : A(0)) - uniform));
  }
}

// ---- dropout ----------------------------------------------------------------------------

__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// T: float or double (the scale in T: f32 rounded for f32 data, as the CPU's).
template <class T>
__global__ void dropout_kernel(const T* x, T* y, int64_t n, uint64_t seed, uint64_t offset, uint32_t threshold, T scale) {
  const int64_t blk = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // one Philox block: 4 elements
  if (blk * 4 >= n) return;
  const uint4 r = philox4x32_device(seed, offset + static_cast<uint64_t>(blk));
  const uint32_t words[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t i = blk * 4 + k;
    if (i < n) y[i] = (words[k] >> 8) >= threshold ? mul_rn(x[i], scale) : T(0);
  }
}

// ---- multi-tensor optimizers and the squared norm --------------------------------------

constexpr int kMaxTensors = 24;  // per launch: the pointer table travels in the kernel's parameters
constexpr int kChunk = 4096;     // elements per block
struct TensorTable {
  float* a[kMaxTensors];
  const float* g[kMaxTensors];
  float* s1[kMaxTensors];
  float* s2[kMaxTensors];
  double* step[kMaxTensors];  // the step guard's per-tensor step counts (null without a guard)
  int64_t n[kMaxTensors];
  int64_t first_block[kMaxTensors + 1];
  int count;
  void* c[kMaxTensors];  // the updated weights' bf16/f16 copies (kernels.h: WeightCopies; null: none)
};

__device__ int find_tensor(const TensorTable& t, int64_t block) {
  int i = 0;
  while (i + 1 < t.count && t.first_block[i + 1] <= block) ++i;
  return i;
}

// f32(f64(g) * grad_scale), as the CPU's scalar_grad.
__device__ float scaled_grad(float g, double grad_scale, bool scale) {
  return scale ? static_cast<float>(static_cast<double>(g) * grad_scale) : g;
}

// cpu/optimizer_update.cpp's scalar loop; products and sums rounded one by one (__f*_rn),
// fmaf where the CPU fuses, so the bits are the CPU's.
// With a step guard (kernels.h: StepGuard) the skip, the gradient scale and the bias
// corrections come from the device, computed as the CPU's Adam::step computes them.
// kCopy: the launch has weight copies (WeightCopies; a tensor's entry may still be null). Without
// them the kernel is the one before the copies existed.
template <bool kCopy>
__global__ void adam_kernel(TensorTable t, AdamArgs k, bool scale, StepGuard guard, bool copy_bf16) {
  const int ti = find_tensor(t, blockIdx.x);
  if (guard.skip) {
    if (*guard.skip != 0.0f) return;
    const double st = *t.step[ti] + 1.0;
    const double bc1 = 1.0 - pow(guard.beta1, st), bc2 = 1.0 - pow(guard.beta2, st);
    k.step_size = static_cast<float>(guard.lr / bc1);
    k.inv_sqrt_bc2 = static_cast<float>(1.0 / sqrt(bc2));
    k.grad_scale = *guard.grad_scale;
    scale = k.grad_scale != 1.0;
  }
  const int64_t base = (blockIdx.x - t.first_block[ti]) * static_cast<int64_t>(kChunk);
  const int64_t end = min(base + kChunk, t.n[ti]);
  float *w = t.a[ti], *m = t.s1[ti], *v = t.s2[ti];
  const float* g = t.g[ti];
  void* const copy = t.c[ti];
  const float omb1 = __fsub_rn(1.0f, k.beta1), omb2 = __fsub_rn(1.0f, k.beta2);
  for (int64_t i = base + threadIdx.x; i < end; i += blockDim.x) {
    const float gi = scaled_grad(g[i], k.grad_scale, scale);
    const float d = k.l2 ? fmaf(w[i], k.wd, gi) : gi;
    const float mi = fmaf(m[i], k.beta1, __fmul_rn(omb1, d));
    const float d2 = __fmul_rn(__fmul_rn(omb2, d), d);
    const float vi = fmaf(v[i], k.beta2, d2);
    const float den = fmaf(__fsqrt_rn(vi), k.inv_sqrt_bc2, k.eps);
    const float decayed = __fmul_rn(w[i], k.decay), delta = __fdiv_rn(__fmul_rn(k.step_size, mi), den);
    m[i] = mi;
    v[i] = vi;
    const float wi = __fsub_rn(decayed, delta);
    w[i] = wi;
    if constexpr (kCopy)
      if (copy) store_lowp(copy, copy_bf16, i, wi);  // the weight's copy (WeightCopies)
  }
}

// d = g + wd w; b = first ? d : momentum b + (1 - dampening) d; d = nesterov ? d + momentum b : b; w -= lr d
template <bool kCopy>  // as adam_kernel's
__global__ void sgd_kernel(TensorTable t, SgdArgs k, bool scale, StepGuard guard, bool copy_bf16) {
  const int ti = find_tensor(t, blockIdx.x);
  if (guard.skip) {
    if (*guard.skip != 0.0f) return;
    k.first = *t.step[ti] == 0.0;
    k.grad_scale = *guard.grad_scale;
    scale = k.grad_scale != 1.0;
  }
  const int64_t base = (blockIdx.x - t.first_block[ti]) * static_cast<int64_t>(kChunk);
  const int64_t end = min(base + kChunk, t.n[ti]);
  float *w = t.a[ti], *b = t.s1[ti];
  const float* g = t.g[ti];
  void* const copy = t.c[ti];
  for (int64_t i = base + threadIdx.x; i < end; i += blockDim.x) {
    float d = fmaf(w[i], k.wd, scaled_grad(g[i], k.grad_scale, scale));
    if (b) {
      const float bi = k.first ? d : fmaf(b[i], k.momentum, __fmul_rn(k.one_minus_dampening, d));
      b[i] = bi;
      d = k.nesterov ? fmaf(bi, k.momentum, d) : bi;
    }
    const float wi = fmaf(-d, k.lr, w[i]);
    w[i] = wi;
    if constexpr (kCopy)
      if (copy) store_lowp(copy, copy_bf16, i, wi);  // the weight's copy (WeightCopies)
  }
}

struct StepTable {
  double* step[kMaxTensors];
  int count;
};
__global__ void advance_steps_kernel(StepTable t, const float* skip) {
  if (*skip != 0.0f) return;
  const int i = threadIdx.x;
  if (i < t.count) *t.step[i] += 1.0;
}

__global__ void sum_squares_kernel(TensorTable t, double* partial, bool square) {
  __shared__ double sh[32];
  const int ti = find_tensor(t, blockIdx.x);
  const int64_t base = (blockIdx.x - t.first_block[ti]) * static_cast<int64_t>(kChunk);
  const int64_t end = min(base + kChunk, t.n[ti]);
  double s = 0;
  for (int64_t i = base + threadIdx.x; i < end; i += blockDim.x) {
    const double x = t.g[ti][i];
    s = square ? fma(x, x, s) : s + x;
  }
  s = block_sum(s, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block adds the partials: each thread a strided slice in order, then the fixed tree.
__global__ void sum_partials_kernel(const double* partial, int64_t n, double* out, bool accumulate) {
  __shared__ double sh[32];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) *out = accumulate ? *out + s : s;
}

template <class Fill, class Launch>
void for_tensor_groups(int n_tensors, const int64_t* n, Fill fill, Launch launch) {
  for (int start = 0; start < n_tensors; start += kMaxTensors) {
    TensorTable t{};
    t.count = std::min(kMaxTensors, n_tensors - start);
    int64_t blocks = 0;
    for (int j = 0; j < t.count; ++j) {
      fill(t, j, start + j);
      t.n[j] = n[start + j];
      t.first_block[j] = blocks;
      blocks += (t.n[j] + kChunk - 1) / kChunk;
    }
    t.first_block[t.count] = blocks;
    if (blocks > 0) launch(t, blocks, start);
  }
}

}  // namespace

void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return;
  softmax_kernel<<<grid_rows(rows), kRowThreads, 0, stream>>>(x, y, cols);
  ATH_CUDA_LAUNCHED("softmax_kernel");
}

void softmax_backward(const float* dy, const float* y, float* dx, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return;
  softmax_bwd_kernel<<<grid_rows(rows), kRowThreads, 0, stream>>>(dy, y, dx, cols);
  ATH_CUDA_LAUNCHED("softmax_bwd_kernel");
}

void softmax_forward(const double* x, double* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return;
  softmax_kernel<<<grid_rows(rows), kRowThreads, 0, stream>>>(x, y, cols);
  ATH_CUDA_LAUNCHED("softmax_kernel f64");
}

void softmax_backward(const double* dy, const double* y, double* dx, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return;
  softmax_bwd_kernel<<<grid_rows(rows), kRowThreads, 0, stream>>>(dy, y, dx, cols);
  ATH_CUDA_LAUNCHED("softmax_bwd_kernel f64");
}

void cross_entropy_forward(const void* logits, DType dtype, const int64_t* target, float* stats, float* loss, int64_t N,
                           int64_t C, int64_t ignore_index, double label_smoothing, cudaStream_t stream) {
  if (N == 0) return;
  const float eps = static_cast<float>(label_smoothing);
  switch (dtype) {
    case DType::f32:
      ce_fwd_kernel<<<grid_rows(N), kRowThreads, 0, stream>>>(static_cast<const float*>(logits), target, stats, loss, C,
                                                                ignore_index, eps);
      break;
    case DType::bf16:
      ce_fwd_kernel<<<grid_rows(N), kRowThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(logits), target, stats, loss,
                                                                C, ignore_index, eps);
      break;
    case DType::f16:
      ce_fwd_kernel<<<grid_rows(N), kRowThreads, 0, stream>>>(static_cast<const __half*>(logits), target, stats, loss, C,
                                                                ignore_index, eps);
      break;
    default: ATH_FAIL("cross_entropy", "logits of dtype ", dtype_name(dtype), " on cuda", Hint{"use f32, bf16 or f16 logits"});
  }
  ATH_CUDA_LAUNCHED("ce_fwd_kernel");
}

void cross_entropy_backward(const void* logits, DType dtype, const int64_t* target, const float* stats, const float* factor,
                            int64_t factor_stride, void* dlogits, int64_t N, int64_t C, int64_t ignore_index,
                            double label_smoothing, cudaStream_t stream) {
  if (N == 0) return;
  const float eps = static_cast<float>(label_smoothing);
  switch (dtype) {
    case DType::f32:
      ce_bwd_kernel<<<grid_rows(N), kRowThreads, 0, stream>>>(static_cast<const float*>(logits), target, stats, factor,
                                                                factor_stride, static_cast<float*>(dlogits), C, ignore_index, eps);
      break;
    case DType::bf16:
      ce_bwd_kernel<<<grid_rows(N), kRowThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(logits), target, stats, factor,
                                                                factor_stride, static_cast<__nv_bfloat16*>(dlogits), C,
                                                                ignore_index, eps);
      break;
    case DType::f16:
      ce_bwd_kernel<<<grid_rows(N), kRowThreads, 0, stream>>>(static_cast<const __half*>(logits), target, stats, factor,
                                                                factor_stride, static_cast<__half*>(dlogits), C, ignore_index,
                                                                eps);
      break;
    default: ATH_FAIL("cross_entropy", "logits of dtype ", dtype_name(dtype), " on cuda", Hint{"use f32, bf16 or f16 logits"});
  }
  ATH_CUDA_LAUNCHED("ce_bwd_kernel");
}

void cross_entropy_forward_f64(const double* logits, const int64_t* target, double* stats, double* loss, int64_t N,
                               int64_t C, int64_t ignore_index, double label_smoothing, cudaStream_t stream) {
  if (N == 0) return;
  ce_fwd_kernel<<<grid_rows(N), kRowThreads, 0, stream>>>(logits, target, stats, loss, C, ignore_index, label_smoothing);
  ATH_CUDA_LAUNCHED("ce_fwd_kernel f64");
}

void cross_entropy_backward_f64(const double* logits, const int64_t* target, const double* stats, const double* factor,
                                int64_t factor_stride, double* dlogits, int64_t N, int64_t C, int64_t ignore_index,
                                double label_smoothing, cudaStream_t stream) {
  if (N == 0) return;
  ce_bwd_kernel<<<grid_rows(N), kRowThreads, 0, stream>>>(logits, target, stats, factor, factor_stride, dlogits, C,
                                                            ignore_index, label_smoothing);
  ATH_CUDA_LAUNCHED("ce_bwd_kernel f64");
}

void dropout_apply(const float* x, float* y, int64_t n, uint64_t seed, uint64_t offset, uint32_t threshold,
                   double scale, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = (n + 3) / 4;
  dropout_kernel<<<static_cast<unsigned>((blocks + 255) / 256), 256, 0, stream>>>(x, y, n, seed, offset, threshold,
                                                                                 static_cast<float>(scale));
  ATH_CUDA_LAUNCHED("dropout_kernel");
}

void dropout_apply(const double* x, double* y, int64_t n, uint64_t seed, uint64_t offset, uint32_t threshold,
                   double scale, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = (n + 3) / 4;
  dropout_kernel<<<static_cast<unsigned>((blocks + 255) / 256), 256, 0, stream>>>(x, y, n, seed, offset, threshold, scale);
  ATH_CUDA_LAUNCHED("dropout_kernel f64");
}
namespace {
void check_copies(const WeightCopies& c, const char* op) {
  ATH_CHECK(!c.ptr || c.dtype == DType::bf16 || c.dtype == DType::f16, op, "weight copies of dtype ", dtype_name(c.dtype),
            Hint{"this is a bug in athanor (the copies are bf16 or f16); please report it"});
}
}  // namespace

void adam_multi_tensor(float* const* w, const float* const* g, float* const* m, float* const* v, const int64_t* n,
                       int n_tensors, const AdamArgs& a, cudaStream_t stream, const StepGuard& guard,
                       double* const* steps, const WeightCopies& copies) {
  ATH_CHECK(!guard.skip || (guard.grad_scale && steps), "adam", "a step guard needs its gradient scale and step counts",
            Hint{"this is a bug in athanor; please report it"});
  check_copies(copies, "adam");
  for_tensor_groups(
      n_tensors, n,
      [&](TensorTable& t, int j, int i) {
        t.a[j] = w[i];
        t.g[j] = g[i];
        t.s1[j] = m[i];
        t.s2[j] = v[i];
        t.step[j] = steps ? steps[i] : nullptr;
        t.c[j] = copies.ptr ? copies.ptr[i] : nullptr;
      },
      [&](const TensorTable& t, int64_t blocks, int) {
        const bool bf16 = copies.dtype == DType::bf16;
        if (copies.ptr)
          adam_kernel<true><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(t, a, a.grad_scale != 1.0, guard, bf16);
        else
          adam_kernel<false><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(t, a, a.grad_scale != 1.0, guard, bf16);
        ATH_CUDA_LAUNCHED("adam_kernel");
      });
}

void sgd_multi_tensor(float* const* w, const float* const* g, float* const* b, const int64_t* n, int n_tensors,
                      const SgdArgs& a, cudaStream_t stream, const StepGuard& guard, double* const* steps,
                      const WeightCopies& copies) {
  ATH_CHECK(!guard.skip || (guard.grad_scale && steps), "sgd", "a step guard needs its gradient scale and step counts",
            Hint{"this is a bug in athanor; please report it"});
  check_copies(copies, "sgd");
  for_tensor_groups(
      n_tensors, n,
      [&](TensorTable& t, int j, int i) {
        t.a[j] = w[i];
        t.g[j] = g[i];
        t.s1[j] = b ? b[i] : nullptr;
        t.step[j] = steps ? steps[i] : nullptr;
        t.c[j] = copies.ptr ? copies.ptr[i] : nullptr;
      },
      [&](const TensorTable& t, int64_t blocks, int) {
        const bool bf16 = copies.dtype == DType::bf16;
        if (copies.ptr)
          sgd_kernel<true><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(t, a, a.grad_scale != 1.0, guard, bf16);
        else
          sgd_kernel<false><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(t, a, a.grad_scale != 1.0, guard, bf16);
        ATH_CUDA_LAUNCHED("sgd_kernel");
      });
}

void advance_steps(double* const* steps, int n, const float* skip, cudaStream_t stream) {
  for (int start = 0; start < n; start += kMaxTensors) {
    StepTable t{};
    t.count = std::min(kMaxTensors, n - start);
    for (int j = 0; j < t.count; ++j) t.step[j] = steps[start + j];
    advance_steps_kernel<<<1, kMaxTensors, 0, stream>>>(t, skip);
    ATH_CUDA_LAUNCHED("advance_steps_kernel");
  }
}

int64_t sum_squares_scratch(int64_t total_elements) {
  // Blocks per tensor round up, so a bound: every tensor may add one partial block.
  return (total_elements + kChunk - 1) / kChunk + kMaxTensors;
}

void sum_squares_multi_tensor(const float* const* x, const int64_t* n, int n_tensors, double* scratch, double* out,
                              cudaStream_t stream) {
  ATH_CUDA(cudaMemsetAsync(out, 0, sizeof(double), stream));
  for_tensor_groups(
      n_tensors, n, [&](TensorTable& t, int j, int i) { t.g[j] = x[i]; },
      [&](const TensorTable& t, int64_t blocks, int) {
        sum_squares_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(t, scratch, true);
        ATH_CUDA_LAUNCHED("sum_squares_kernel");
        sum_partials_kernel<<<1, 1024, 0, stream>>>(scratch, blocks, out, true);
        ATH_CUDA_LAUNCHED("sum_partials_kernel");
      });
}

void sum(const float* x, int64_t n, double* scratch, double* out, cudaStream_t stream) {
  ATH_CUDA(cudaMemsetAsync(out, 0, sizeof(double), stream));
  for_tensor_groups(
      1, &n, [&](TensorTable& t, int j, int) { t.g[j] = x; },
      [&](const TensorTable& t, int64_t blocks, int) {
        sum_squares_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(t, scratch, false);
        ATH_CUDA_LAUNCHED("sum_kernel");
        sum_partials_kernel<<<1, 1024, 0, stream>>>(scratch, blocks, out, true);
        ATH_CUDA_LAUNCHED("sum_partials_kernel");
      });
}

namespace {
__global__ void f64_to_f32_kernel(const double* x, double alpha, float* y, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = static_cast<float>(alpha * x[i]);
}
__global__ void fill_rows_kernel(const float* g, int64_t g_stride, float alpha, float* y, int64_t cols, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = alpha * g[(i / cols) * g_stride];
}
__global__ void mul_rows_kernel(float* x, const float* g, int64_t g_stride, int64_t cols, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] *= g[(i / cols) * g_stride];
}
unsigned grid_elems(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }
}  // namespace

void f64_to_f32(const double* x, double alpha, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  f64_to_f32_kernel<<<grid_elems(n), 256, 0, stream>>>(x, alpha, y, n);
  ATH_CUDA_LAUNCHED("f64_to_f32_kernel");
}

void fill_rows(const float* g, int64_t g_stride, double alpha, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  fill_rows_kernel<<<grid_elems(n), 256, 0, stream>>>(g, g_stride, static_cast<float>(alpha), y, cols, n);
  ATH_CUDA_LAUNCHED("fill_rows_kernel");
}

void mul_rows(float* x, const float* g, int64_t g_stride, int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  mul_rows_kernel<<<grid_elems(n), 256, 0, stream>>>(x, g, g_stride, cols, n);
  ATH_CUDA_LAUNCHED("mul_rows_kernel");
}

}  // namespace athanor::cuda
