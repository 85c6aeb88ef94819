#pragma once
// Rotary position embedding kernels (ops/rope.cpp): the frequency table and the rotation pass.
//
// Invariants:
//  - the cos/sin table [T, D/2] is computed once per call (angles and cos/sin in double, stored
//    in the compute type), then read by every (batch, head) row of the same position;
//  - the rotation reads x through (b, t, h) strides with contiguous rows of D elements, writes a
//    contiguous [B, T, H, D] output, and computes in f32 for f32/bf16/f16 (rounded once to the
//    output type) and in f64 for f64;
//  - sign = -1 rotates by the opposite angle: the backward (the rotation's transpose is its
//    inverse), dx = rope(dy) with -sin.
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor::cpu {

struct RopeLlama3 {
  double factor, low_freq_factor, high_freq_factor;
  int64_t original_max_position;
};
// inv_freq[i], i < D/2: theta^(-2i/D), then Llama 3's scaling when llama3 is set (in double).
std::vector<double> rope_inv_freq(int64_t D, double theta, const std::optional<RopeLlama3>& llama3);

template <class T> using rope_acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// cos and sin [T, D/2] of the angles (offset + t) inv_freq[i], row-major.
template <class C>
void rope_table(const std::vector<double>& inv_freq, int64_t T, int64_t offset, C* cos_out, C* sin_out);

struct RopeStrides {  // element strides of x's dims 0..2 (dim 3 is contiguous)
  int64_t b, t, h;
};
// out [B, T, H, D] contiguous = rotation of x (strides xs) by the table (sign -1: backward).
template <class T>
void rope_apply(const T* x, const RopeStrides& xs, T* out, int64_t B, int64_t T_, int64_t H, int64_t D,
                const rope_acc_t<T>* cos_t, const rope_acc_t<T>* sin_t, int sign);

namespace ref {
// Naive: every element from its own angle, computed from theta and the scaling in double.
// x any floating dtype and layout, [B, T, H, D]; result f64 [B, T, H, D].
Tensor rope(const Tensor& x, double theta, const std::optional<RopeLlama3>& llama3, int64_t offset);
}  // namespace ref

}  // namespace athanor::cpu
