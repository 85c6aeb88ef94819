// The kernels of amp.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "athanor/core/error.h"
#include "backend/cuda/amp.h"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {
constexpr int kTensors = 32;  // per launch: the table travels in the kernel's parameters
constexpr int kThreads = 256;

struct UnscaleTable {
  void* g[kTensors];
  int64_t n[kTensors];
  DType dtype[kTensors];
  int flag_index[kTensors];
  int count;
};

// blockIdx.y: the tensor; a grid-stride loop over its elements.
__global__ void unscale_kernel(UnscaleTable t, const float* scale, float* found_inf, int32_t* flags) {
  const int k = blockIdx.y;
  if (k >= t.count) return;
  const float inv = scale ? static_cast<float>(1.0 / static_cast<double>(*scale)) : 1.0f;
  const int64_t n = t.n[k];
  bool bad = false;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v;
    switch (t.dtype[k]) {
      case DType::bf16: {
        auto* p = static_cast<__nv_bfloat16*>(t.g[k]);
        v = __fmul_rn(__bfloat162float(p[i]), inv);
        p[i] = __float2bfloat16_rn(v);
        break;
      }
      case DType::f16: {
        auto* p = static_cast<__half*>(t.g[k]);
        v = __fmul_rn(__half2float(p[i]), inv);
        p[i] = __float2half_rn(v);
        break;
      }
      default: {
        auto* p = static_cast<float*>(t.g[k]);
        v = __fmul_rn(p[i], inv);
        p[i] = v;
        break;
      }
    }
    bad = bad || !isfinite(v);
  }
  if (bad) {
    *found_inf = 1.0f;
    flags[t.flag_index[k]] = 1;
  }
}

__global__ void update_kernel(float* scale, double* counters, const float* found_inf, ScaleUpdate u) {
  double s = *scale;
  if (*found_inf != 0.0f) {
    s = fmax(s * u.backoff_factor, u.min_scale);
    counters[0] = 0;
    counters[1] += 1;
  } else {
    const double next = counters[0] + 1;
    if (next >= static_cast<double>(u.growth_interval)) {
      s = fmin(s * u.growth_factor, u.max_scale);
      counters[0] = 0;
    } else {
      counters[0] = next;
    }
  }
  *scale = static_cast<float>(s);
}
__global__ void step_guard_kernel(const double* sumsq, const float* found_inf, const float* loss, double max_norm,
                                  float* skip, double* out) {
  const double norm = sqrt(*sumsq);
  const bool bad = !isfinite(norm) || (found_inf && *found_inf != 0.0f) || (loss && !isfinite(*loss));
  *skip = bad ? 1.0f : 0.0f;
  out[0] = max_norm > 0 && isfinite(norm) ? fmin(1.0, max_norm / (norm + 1e-6)) : 1.0;
  out[1] = norm;
  out[2] += bad ? 1.0 : 0.0;
}
}  // namespace

void step_guard(const double* sumsq, const float* found_inf, const float* loss, double max_norm, float* skip,
                double* out, cudaStream_t stream) {
  step_guard_kernel<<<1, 1, 0, stream>>>(sumsq, found_inf, loss, max_norm, skip, out);
  ATH_CUDA_LAUNCHED("step_guard_kernel");
}

void unscale_multi_tensor(void* const* g, const DType* dtypes, const int64_t* n, int n_tensors, const float* scale,
                          float* found_inf, int32_t* flags, cudaStream_t stream) {
  for (int start = 0; start < n_tensors; start += kTensors) {
    UnscaleTable t{};
    t.count = std::min(kTensors, n_tensors - start);
    int64_t most = 0;
    for (int j = 0; j < t.count; ++j) {
      const DType d = dtypes[start + j];
      ATH_CHECK(d == DType::f32 || d == DType::bf16 || d == DType::f16, "GradScaler.unscale", "a ", dtype_name(d),
                " gradient on cuda", Hint{"the CUDA unscale takes f32, bf16 and f16 gradients"});
      t.g[j] = g[start + j], t.n[j] = n[start + j], t.dtype[j] = d, t.flag_index[j] = start + j;
      most = std::max(most, t.n[j]);
    }
    if (most == 0) continue;
    const int64_t want = (most + kThreads - 1) / kThreads;
    const unsigned gx = static_cast<unsigned>(std::min<int64_t>(want, 1024));
    unscale_kernel<<<dim3(gx, static_cast<unsigned>(t.count)), kThreads, 0, stream>>>(t, scale, found_inf, flags);
    ATH_CUDA_LAUNCHED("unscale_kernel");
  }
}

void update_scale(float* scale, double* counters, const float* found_inf, const ScaleUpdate& u, cudaStream_t stream) {
  update_kernel<<<1, 1, 0, stream>>>(scale, counters, found_inf, u);
  ATH_CUDA_LAUNCHED("update_kernel");
}

}  // namespace athanor::cuda
