#pragma once
// The CUDA kernels of the backend: plain functions on device pointers, sizes and a stream,
// the twins of src/backend/cpu's kernels (same arguments, same formulas), launched
// asynchronously on `stream`. Nothing here synchronises.
//
// Invariants:
//  - statistics and accumulations are in f32 (f64 for the squared norm; in f64 throughout for
//    the f64 overloads of softmax and cross-entropy), as on the CPU; the norms: norm_kernels.h;
//  - every reduction has a fixed order (one block per row, a tree in shared memory of a
//    fixed shape; column sums over rows in a fixed two-pass order), so results are
//    bit-identical run to run, and no float atomics are used;
//  - dropout draws element i's keep bit from philox4x32(seed, offset + i / 4)[i % 4],
//    the CPU's stream (cpu/dropout.h), so CPU and GPU masks are identical.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "athanor/core/dtype.h"

namespace athanor::cuda {

// Softmax over the rows of [rows, cols] (f32), and its backward from the output:
// dx = y (dy - Σ_c dy y).
void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream);
void softmax_backward(const float* dy, const float* y, float* dx, int64_t rows, int64_t cols, cudaStream_t stream);
// The same in f64 (math and sums in double).
void softmax_forward(const double* x, double* y, int64_t rows, int64_t cols, cudaStream_t stream);
void softmax_backward(const double* dy, const double* y, double* dx, int64_t rows, int64_t cols, cudaStream_t stream);

// Cross-entropy fused with log-softmax (cpu/cross_entropy.h's formulas) over logits [N, C]
// in f32, bf16 or f16 (read in place, math in f32): stats[2n] = max, stats[2n+1] = log sum
// exp(x - max); loss[n] (f32) per row, 0 where target is ignore_index.
void cross_entropy_forward(const void* logits, DType dtype, const int64_t* target, float* stats, float* loss, int64_t N,
                           int64_t C, int64_t ignore_index, double label_smoothing, cudaStream_t stream);
// dlogits (the logits' dtype, rounded once) = factor[n * factor_stride] (softmax - (1 - eps)[c == t]
// - eps / C), the factor read on the device (the upstream gradient / count); dlogits may be
// logits (the gradient written in place over the logits, which are then gone).
void cross_entropy_backward(const void* logits, DType dtype, const int64_t* target, const float* stats, const float* factor,
                            int64_t factor_stride, void* dlogits, int64_t N, int64_t C, int64_t ignore_index,
                            double label_smoothing, cudaStream_t stream);
// f64 logits: the same formulas with the math, stats, loss and factor in double (named apart
// from the overloads above: callers take those by address).
void cross_entropy_forward_f64(const double* logits, const int64_t* target, double* stats, double* loss, int64_t N, int64_t C,
                           int64_t ignore_index, double label_smoothing, cudaStream_t stream);
void cross_entropy_backward_f64(const double* logits, const int64_t* target, const double* stats, const double* factor,
                                int64_t factor_stride, double* dlogits, int64_t N, int64_t C, int64_t ignore_index,
                                double label_smoothing, cudaStream_t stream);

// Inverted dropout on a contiguous buffer (x may be y).
void dropout_apply(const float* x, float* y, int64_t n, uint64_t seed, uint64_t offset, uint32_t threshold,
                   double scale, cudaStream_t stream);
// The same on f64 data, the scale in f64 (the CPU's f64 dropout).
void dropout_apply(const double* x, double* y, int64_t n, uint64_t seed, uint64_t offset, uint32_t threshold,
                   double scale, cudaStream_t stream);

// Adam/AdamW over several tensors in one launch (cpu/optimizer_update.h's arithmetic,
// rounding fixed with explicit fmaf / __fmul_rn so it is bit-identical to the CPU).
struct AdamArgs {
  float beta1, beta2, eps, wd, step_size, inv_sqrt_bc2, decay;
  bool l2;
  double grad_scale = 1.0;
};
// The step guard of a step with no host read (optim/device_update.h, the trainer on cuda):
// with `skip` set, the update kernels read on the device whether to skip (*skip != 0: they
// write nothing, the step counts stay: the CPU's skipped step), the gradient scale to fold
// (*grad_scale: the clip coefficient, 1 = none) and each tensor's step count (steps[i], f64:
// the updates applied so far), from which Adam's bias corrections (from lr, beta1, beta2 in
// f64, the CPU's formula) and SGD's first-step seeding are computed. Null skip: the
// constants as given (the host decided).
struct StepGuard {
  const float* skip = nullptr;
  const double* grad_scale = nullptr;
  double lr = 0, beta1 = 0, beta2 = 0;
};
// The updated weights' low-precision copies, written in the update pass (Candidate::lowp_copies;
// the optimizer's persistent casts for autocast): ptr[i] (may be null) receives tensor i's new
// weight rounded to `dtype` (bf16 or f16) by the cast kernel's rounding (to nearest even), so
// the copy == cast(weight) bit for bit. A skipped step (StepGuard) writes no copy either: the
// copy still equals the cast of the unchanged weight. Null ptr: no copies.
struct WeightCopies {
  void* const* ptr = nullptr;
  DType dtype = DType::bf16;
};
void adam_multi_tensor(float* const* w, const float* const* g, float* const* m, float* const* v, const int64_t* n,
                       int n_tensors, const AdamArgs& a, cudaStream_t stream, const StepGuard& guard = {},
                       double* const* steps = nullptr, const WeightCopies& copies = {});
struct SgdArgs {
  float lr, wd, momentum, one_minus_dampening;
  bool nesterov, first;
  double grad_scale = 1.0;
};
void sgd_multi_tensor(float* const* w, const float* const* g, float* const* b, const int64_t* n, int n_tensors,
                      const SgdArgs& a, cudaStream_t stream, const StepGuard& guard = {}, double* const* steps = nullptr,
                      const WeightCopies& copies = {});
// *steps[i] += 1 for each of the n counters unless *skip != 0 (queued after the update
// kernels that read them).
void advance_steps(double* const* steps, int n, const float* skip, cudaStream_t stream);

// Σ x² over several tensors in f64, in a fixed order (blocks of fixed size, then one block
// sums the partials in index order): `out` is one double on the device. `scratch` holds
// sum_squares_scratch(total) doubles.
int64_t sum_squares_scratch(int64_t total_elements);
void sum_squares_multi_tensor(const float* const* x, const int64_t* n, int n_tensors, double* scratch, double* out,
                              cudaStream_t stream);
// Σ x in f64 over one buffer, in the same fixed order (scratch: sum_squares_scratch(n) doubles).
void sum(const float* x, int64_t n, double* scratch, double* out, cudaStream_t stream);

// y[i] = f32(alpha x[i]) for n doubles (a device reduction's result as an f32 tensor, with the
// mean's 1/count applied in f64 first, as the CPU's sum/mean/cross_entropy do).
void f64_to_f32(const double* x, double alpha, float* y, int64_t n, cudaStream_t stream);
// Row broadcasts over [rows, cols] with a per-row factor g[r * g_stride] read on the device
// (g_stride 0: one scalar), so an upstream gradient never has to be read on the host:
//   fill_rows: y[r, c] = alpha g[r * g_stride];   mul_rows: x[r, c] *= g[r * g_stride].
void fill_rows(const float* g, int64_t g_stride, double alpha, float* y, int64_t rows, int64_t cols, cudaStream_t stream);
void mul_rows(float* x, const float* g, int64_t g_stride, int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace athanor::cuda
