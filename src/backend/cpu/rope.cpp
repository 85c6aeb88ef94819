// Rotary position embedding kernels (see rope.h for the invariants) and the naive reference.
// The rotation pass is compiled once per ISA level (isa_kernel.h): at the avx512 levels 16 pairs
// per step (bf16/f16 widened on load, rounded once on store); the table, the frequencies and the
// reference are level-independent.
#include "backend/cpu/rope.h"

#include <omp.h>

#include <cmath>
#include <numbers>
#include <type_traits>

#include "athanor/core/convert.h"
#include "athanor/core/error.h"
#include "backend/cpu/vec_math.h"

ATHANOR_ISA_BEGIN
template <class T>
void rope_apply(const T* x, const RopeStrides& xs, T* out, int64_t B, int64_t T_, int64_t H, int64_t D,
                const rope_acc_t<T>* cos_t, const rope_acc_t<T>* sin_t, int sign) {
  using C = rope_acc_t<T>;
  const int64_t half = D / 2, rows = B * T_;
  const C sg = static_cast<C>(sign);
  // Memory-bound: one read and one write of x; threads over (b, t) rows of H heads each.
#pragma omp parallel for schedule(static) if (rows * H * D > (1 << 16))
  for (int64_t bt = 0; bt < rows; ++bt) {
    const int64_t b = bt / T_, t = bt % T_;
    const C *c = cos_t + t * half, *s = sin_t + t * half;
    for (int64_t h = 0; h < H; ++h) {
      const T* xr = x + b * xs.b + t * xs.t + h * xs.h;
      T* o = out + (bt * H + h) * D;
#if ATHANOR_CPU_AVX512
      if constexpr (!std::is_same_v<T, double>) {  // 16 pairs at a time, bf16/f16 widened on load
        const __m512 vsg = _mm512_set1_ps(sg);
        for (int64_t i = 0; i < half; i += 16) {
          const __mmask16 m = vec::tail_mask(half - i);
          const __m512 x0 = vec::load16(xr + i, m), x1 = vec::load16(xr + half + i, m);
          const __m512 cv = vec::load16(c + i, m), sv = _mm512_mul_ps(vsg, vec::load16(s + i, m));
          vec::store16(o + i, m, _mm512_fmsub_ps(x0, cv, _mm512_mul_ps(x1, sv)));
          vec::store16(o + half + i, m, _mm512_fmadd_ps(x1, cv, _mm512_mul_ps(x0, sv)));
        }
        continue;
      }
#endif
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const C x0 = cast_value<C>(xr[i]), x1 = cast_value<C>(xr[i + half]), si = sg * s[i];
        o[i] = cast_value<T>(x0 * c[i] - x1 * si);
        o[i + half] = cast_value<T>(x1 * c[i] + x0 * si);
      }
    }
  }
}

#define ATHANOR_INSTANTIATE_ROPE(T)                                                                          \
  template void rope_apply<T>(const T*, const RopeStrides&, T*, int64_t, int64_t, int64_t, int64_t,         \
                              const rope_acc_t<T>*, const rope_acc_t<T>*, int);
ATHANOR_INSTANTIATE_ROPE(float)
ATHANOR_INSTANTIATE_ROPE(double)
ATHANOR_INSTANTIATE_ROPE(bfloat16)
ATHANOR_INSTANTIATE_ROPE(float16)

ATHANOR_ISA_END

#if ATHANOR_ISA_PRIMARY
namespace athanor::cpu {

std::vector<double> rope_inv_freq(int64_t D, double theta, const std::optional<RopeLlama3>& llama3) {
  const int64_t half = D / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) f[i] = std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(D));
  if (!llama3) return f;
  // HF's _compute_llama3_parameters: long wavelengths (low frequencies) slowed down by factor,
  // short ones kept, the band between interpolated linearly in old_len / wavelen.
  const RopeLlama3& s = *llama3;
  const double old_len = static_cast<double>(s.original_max_position);
  const double low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
  for (double& v : f) {
    const double wavelen = 2 * std::numbers::pi / v;
    if (wavelen > low_wavelen) {
      v /= s.factor;
    } else if (wavelen >= high_wavelen) {  // medium band: neither wavelen < high nor > low
      const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      v = (1 - smooth) * v / s.factor + smooth * v;
    }
  }
  return f;
}

template <class C>
void rope_table(const std::vector<double>& inv_freq, int64_t T, int64_t offset, C* cos_out, C* sin_out) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  // One sincos per (position, frequency); in double so that a position of 10^5 keeps its
  // angle's low bits (f32 angles lose ~1e-3 rad there).
#pragma omp parallel for if (T * half > (1 << 14))
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(offset + t) * inv_freq[i];
      cos_out[t * half + i] = static_cast<C>(std::cos(a));
      sin_out[t * half + i] = static_cast<C>(std::sin(a));
    }
}

template void rope_table<float>(const std::vector<double>&, int64_t, int64_t, float*, float*);
template void rope_table<double>(const std::vector<double>&, int64_t, int64_t, double*, double*);
namespace ref {
// HF's code, transcribed element by element (no table, no shared helper with the fast path).
double ref_inv_freq(int64_t i, int64_t D, double theta, const std::optional<RopeLlama3>& l3) {
  const double base = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(D));
  if (!l3) return base;
  const double old_len = static_cast<double>(l3->original_max_position);
  const double wavelen = 2 * std::numbers::pi / base;
  const double low_freq_wavelen = old_len / l3->low_freq_factor, high_freq_wavelen = old_len / l3->high_freq_factor;
  double scaled = wavelen > low_freq_wavelen ? base / l3->factor : base;
  const double smooth_factor = (old_len / wavelen - l3->low_freq_factor) / (l3->high_freq_factor - l3->low_freq_factor);
  const double smoothed = (1 - smooth_factor) * scaled / l3->factor + smooth_factor * scaled;
  const bool is_medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
  return is_medium ? smoothed : scaled;
}

Tensor rope(const Tensor& x, double theta, const std::optional<RopeLlama3>& llama3, int64_t offset) {
  ATH_CHECK(x.dim() == 4, "ref::rope", "expected [B, T, H, D], got ", x.describe());
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3), half = D / 2;
  const std::vector<double> xv = x.to_vector();  // logical order
  std::vector<double> out(xv.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < D; ++j) {
          const int64_t row = ((b * T + t) * H + h) * D, i = j % half;
          const double a = static_cast<double>(offset + t) * ref_inv_freq(i, D, theta, llama3);
          // rotate_half(x) = cat(-x[half:], x[:half]); out = x cos + rotate_half(x) sin
          const double rot = j < half ? -xv[row + j + half] : xv[row + j - half];
          out[row + j] = xv[row + j] * std::cos(a) + rot * std::sin(a);
        }
  return from_vector(out, x.sizes(), TensorOptions(DType::f64));
}
}  // namespace ref

}  // namespace athanor::cpu

namespace athanor::cpu {
ATHANOR_ISA_DECLARE(template <class T>
                    void rope_apply(const T* x, const RopeStrides& xs, T* out, int64_t B, int64_t T_, int64_t H, int64_t D,
                                    const rope_acc_t<T>* cos_t, const rope_acc_t<T>* sin_t, int sign);)
template <class T>
void rope_apply(const T* x, const RopeStrides& xs, T* out, int64_t B, int64_t T_, int64_t H, int64_t D,
                const rope_acc_t<T>* cos_t, const rope_acc_t<T>* sin_t, int sign) {
  ATHANOR_ISA_CALL(rope_apply<T>, x, xs, out, B, T_, H, D, cos_t, sin_t, sign);
}
#define ATHANOR_INSTANTIATE_ROPE(T)                                                                          \
  template void rope_apply<T>(const T*, const RopeStrides&, T*, int64_t, int64_t, int64_t, int64_t,         \
                              const rope_acc_t<T>*, const rope_acc_t<T>*, int);
ATHANOR_INSTANTIATE_ROPE(float)
ATHANOR_INSTANTIATE_ROPE(double)
ATHANOR_INSTANTIATE_ROPE(bfloat16)
ATHANOR_INSTANTIATE_ROPE(float16)

}  // namespace athanor::cpu
#endif  // ATHANOR_ISA_PRIMARY
