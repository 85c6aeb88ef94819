// The kernels of loss_targets.h.
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "athanor/core/error.h"
#include "backend/cuda/loss_targets.h"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {
template <class I>
__global__ void prepare_kernel(const I* t, int64_t N, int64_t C, int64_t ignore_index, int64_t* ids, float* weight,
                               DeviceErrorRecord* err) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  const int64_t v = static_cast<int64_t>(t[n]);
  if (v == ignore_index) {
    ids[n] = v, weight[n] = 0.0f;
    return;
  }
  if (v >= 0 && v < C) {
    ids[n] = v, weight[n] = 1.0f;
    return;
  }
  ids[n] = ignore_index, weight[n] = 0.0f;
  if (atomicCAS(reinterpret_cast<int*>(&err->code), 0, static_cast<int>(DeviceErrorCode::target_out_of_range)) == 0) {
    err->a = n, err->b = v, err->c = C;
    __threadfence();
  }
}
// O, G: f32 (f32, bf16, f16 logits) or f64 (f64 logits).
template <class O>
__global__ void reduce_kernel(const double* sum, const double* count, bool mean, O* out) {
  if (!mean) *out = static_cast<O>(*sum);
  else *out = *count > 0 ? static_cast<O>(*sum * (1.0 / *count)) : static_cast<O>(NAN);
}
template <class G>
__global__ void factor_kernel(const G* g, const double* count, bool mean, G* f) {
  *f = mean ? static_cast<G>(static_cast<double>(*g) * (1.0 / *count)) : *g;
}
}  // namespace

void prepare_targets(const void* target, DType dtype, int64_t N, int64_t C, int64_t ignore_index, int64_t* ids,
                     float* weight, DeviceErrorRecord* err, cudaStream_t stream) {
  ATH_CHECK(dtype == DType::i64 || dtype == DType::i32, "cross_entropy", "targets are ", dtype_name(dtype),
            " (the CUDA kernel takes i64 or i32 class ids)", Hint{"convert the targets with .to(DType::i64)"});
  if (N == 0) return;
  const unsigned blocks = static_cast<unsigned>((N + 255) / 256);
  if (dtype == DType::i64)
    prepare_kernel<<<blocks, 256, 0, stream>>>(static_cast<const int64_t*>(target), N, C, ignore_index, ids, weight, err);
  else
    prepare_kernel<<<blocks, 256, 0, stream>>>(static_cast<const int32_t*>(target), N, C, ignore_index, ids, weight, err);
  ATH_CUDA_LAUNCHED("prepare_kernel");
}
void loss_reduce(const double* sum, const double* count, bool mean, float* out, cudaStream_t stream) {
  reduce_kernel<<<1, 1, 0, stream>>>(sum, count, mean, out);
  ATH_CUDA_LAUNCHED("loss reduce_kernel");
}
void loss_grad_factor(const float* g, const double* count, bool mean, float* factor, cudaStream_t stream) {
  factor_kernel<<<1, 1, 0, stream>>>(g, count, mean, factor);
  ATH_CUDA_LAUNCHED("loss factor_kernel");
}
void loss_reduce(const double* sum, const double* count, bool mean, double* out, cudaStream_t stream) {
  reduce_kernel<<<1, 1, 0, stream>>>(sum, count, mean, out);
  ATH_CUDA_LAUNCHED("loss reduce_kernel f64");
}
void loss_grad_factor(const double* g, const double* count, bool mean, double* factor, cudaStream_t stream) {
  factor_kernel<<<1, 1, 0, stream>>>(g, count, mean, factor);
  ATH_CUDA_LAUNCHED("loss factor_kernel f64");
}

namespace {
std::atomic<bool>& fused_classifier_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("ATHANOR_CUDA_FUSED_CLASSIFIER");
    return !(v && std::strcmp(v, "0") == 0);
  }()};
  return on;
}
}  // namespace
bool fused_classifier_enabled() { return fused_classifier_flag().load(std::memory_order_relaxed); }
void set_fused_classifier(bool on) { fused_classifier_flag().store(on, std::memory_order_relaxed); }

}  // namespace athanor::cuda
