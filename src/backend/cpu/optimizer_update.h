#pragma once
// The f32 inner loops of the optimizers and of gradient clipping, over one
// contiguous range [0, n) of one tensor (the multi-tensor drivers cut every
// parameter into chunks and call these per chunk). Compiled once per ISA level
// (isa_kernel.h): AVX-512 with masked tails at the avx512 levels; at the avx2 level a
// scalar loop with the same operation order (std::fma where the vector code fuses), so
// the update gives the same bits at every level (the f64 sum of squares is summed in
// another order there, so a gradient norm may differ in its last bits).
//
// Invariants:
//  - one pass: each element of p, g and the state is read once and written once;
//  - the rounding of each formula is fixed here, not left to the compiler's
//    contraction choices: results are bit-identical to the scalar loops these
//    replaced (and to each other across chunkings and thread counts);
//  - `copy`, when not null, receives the updated weight rounded to `copy_dtype`
//    (bf16 or f16) exactly as cast() would round it (RNE, denormals kept).
#include <cstdint>

#include "athanor/core/dtype.h"

namespace athanor::cpu {

struct SgdConsts {
  float lr, wd, momentum, one_minus_dampening;
  bool nesterov;
  bool first;  // the first step seeds the momentum buffer with the gradient
  double grad_scale = 1.0;  // g is taken as f32(f64(g) * grad_scale), as scale_f32 scales it (gradient clipping)
};
// d = g + wd w; b = first ? d : momentum b + (1 - dampening) d; d = nesterov ? d + momentum b : b;
// w -= lr d. `b` null: plain SGD (w -= lr d).
void sgd_f32(float* w, const float* g, float* b, int64_t n, const SgdConsts& k, void* copy, DType copy_dtype);

struct AdamConsts {
  float beta1, beta2, eps, wd, step_size, inv_sqrt_bc2, decay;
  bool l2;  // Adam: wd enters the gradient; AdamW: the weight decays by `decay`
  double grad_scale = 1.0;  // as in SgdConsts
};
// m = b1 m + (1-b1) d; v = b2 v + (1-b2) d²; w = w decay - step_size m / (sqrt(v) inv_sqrt_bc2 + eps).
void adam_f32(float* w, const float* g, float* m, float* v, int64_t n, const AdamConsts& k, void* copy,
              DType copy_dtype);

// Σ x² in f64 (each x widened exactly; 8 + 8 f64 lanes, then summed in a fixed order).
double sum_squares_f32(const float* x, int64_t n);
// x = f32(f64(x) * coef), as the scalar clip loop did.
void scale_f32(float* x, int64_t n, double coef);
// dst = the weights in `copy_dtype` (bf16 or f16), rounded as cast() rounds.
void narrow_f32(const float* w, void* dst, int64_t n, DType copy_dtype);

}  // namespace athanor::cpu
