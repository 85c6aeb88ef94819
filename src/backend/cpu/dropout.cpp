// The dropout kernel (dropout.h), compiled once per ISA level (isa_kernel.h): the Philox
// rounds run 16 blocks (64 elements) at a time at the avx512 levels, and the keep bits
// are applied as one 64-bit mask; at the avx2 level one block at a time.
#include "backend/cpu/dropout.h"

#include <algorithm>
#include <type_traits>

#include "athanor/core/convert.h"
#include "athanor/core/rng.h"
#include "backend/cpu/isa_kernel.h"

#define ATHANOR_INSTANTIATE_DROPOUT(T) \
  template void dropout_apply<T>(const T*, T*, int64_t, uint64_t, uint64_t, uint32_t, double);

ATHANOR_ISA_BEGIN
namespace {

#if ATHANOR_CPU_AVX512
// hi and lo 32-bit halves of a * m for 16 lanes.
inline void mulhilo(__m512i a, __m512i m, __m512i& hi, __m512i& lo) {
  const __m512i pe = _mm512_mul_epu32(a, m);                         // even lanes, 64-bit products
  const __m512i po = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);  // odd lanes
  hi = _mm512_mask_blend_epi32(__mmask16(0xAAAA), _mm512_srli_epi64(pe, 32), po);
  lo = _mm512_mask_blend_epi32(__mmask16(0xAAAA), pe, _mm512_slli_epi64(po, 32));
}

// Keep mask of the 64 elements drawn from Philox blocks base .. base+15 (stream 0):
// bit 4k + j is word j of block base + k compared with the threshold. The rounds
// are bit-identical to athanor::philox4x32, 16 blocks per vector lane set.
inline uint64_t keep_mask64(uint64_t seed, uint64_t base, uint32_t threshold) {
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(base))), iota);
  // the high counter word: +1 in lanes where the low word wrapped around
  const __mmask16 wrapped = _mm512_cmplt_epu32_mask(c0, iota);
  __m512i c1 = _mm512_mask_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(base >> 32))), wrapped,
                                     _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(base >> 32))),
                                     _mm512_set1_epi32(1));
  __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  const __m512i M0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u)), M1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  for (int r = 0; r < 10; ++r) {
    __m512i hi0, lo0, hi1, lo1;
    mulhilo(c0, M0, hi0, lo0);
    mulhilo(c2, M1, hi1, lo1);
    c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(static_cast<int>(k0)));
    c1 = lo1;
    c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(static_cast<int>(k1)));
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  const __m512i thr = _mm512_set1_epi32(static_cast<int>(threshold));
  auto keep = [&](__m512i w) { return static_cast<uint64_t>(_mm512_cmpge_epu32_mask(_mm512_srli_epi32(w, 8), thr)); };
  return _pdep_u64(keep(c0), 0x1111111111111111ull) | _pdep_u64(keep(c1), 0x2222222222222222ull) |
         _pdep_u64(keep(c2), 0x4444444444444444ull) | _pdep_u64(keep(c3), 0x8888888888888888ull);
}
#endif

// Keep mask of elements 64 g .. 64 g + 63 (bit i = element 64 g + i).
inline uint64_t group_mask(uint64_t seed, uint64_t offset, int64_t g, uint32_t threshold) {
#if ATHANOR_CPU_AVX512
  return keep_mask64(seed, offset + static_cast<uint64_t>(16 * g), threshold);
#else
  uint64_t m = 0;
  for (int k = 0; k < 16; ++k) {
    const auto r = philox4x32(seed, offset + static_cast<uint64_t>(16 * g + k));
    for (int j = 0; j < 4; ++j) m |= static_cast<uint64_t>((r[j] >> 8) >= threshold) << (4 * k + j);
  }
  return m;
#endif
}

// y[i] = keep(i) ? x[i] * scale : 0 on contiguous buffers (x may be y), 64 elements per step.
}  // namespace

template <class T>
void dropout_apply(const T* x, T* y, int64_t n, uint64_t seed, uint64_t offset, uint32_t threshold, double scale_d) {
  using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const S scale = static_cast<S>(scale_d);
  const int64_t groups = (n + 63) / 64;
#pragma omp parallel for if (n > (1 << 14)) schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const uint64_t m = group_mask(seed, offset, g, threshold);
    const int64_t i0 = 64 * g, len = std::min<int64_t>(64, n - i0);
#if ATHANOR_CPU_AVX512
    if constexpr (std::is_same_v<T, float>) {
      const __m512 s = _mm512_set1_ps(scale);
      for (int64_t k = 0; k < len; k += 16) {
        const __mmask16 in = len - k >= 16 ? __mmask16(0xffff) : __mmask16((1u << (len - k)) - 1u);
        const __mmask16 keep = static_cast<__mmask16>(m >> k);
        const __m512 v = _mm512_maskz_loadu_ps(in, x + i0 + k);
        _mm512_mask_storeu_ps(y + i0 + k, in, _mm512_maskz_mul_ps(keep, v, s));
      }
      continue;
    }
#endif
    for (int64_t k = 0; k < len; ++k) {
      const S v = cast_value<S>(x[i0 + k]) * scale;
      y[i0 + k] = cast_value<T>(((m >> k) & 1u) ? v : S(0));
    }
  }
}

ATHANOR_INSTANTIATE_DROPOUT(float)
ATHANOR_INSTANTIATE_DROPOUT(double)
ATHANOR_INSTANTIATE_DROPOUT(bfloat16)
ATHANOR_INSTANTIATE_DROPOUT(float16)
ATHANOR_ISA_END

#if ATHANOR_ISA_PRIMARY
namespace athanor::cpu {

ATHANOR_ISA_DECLARE(template <class T> void dropout_apply(const T* x, T* y, int64_t n, uint64_t seed, uint64_t offset,
                                                          uint32_t threshold, double scale);)

template <class T>
void dropout_apply(const T* x, T* y, int64_t n, uint64_t seed, uint64_t offset, uint32_t threshold, double scale) {
  ATHANOR_ISA_CALL(dropout_apply<T>, x, y, n, seed, offset, threshold, scale);
}
ATHANOR_INSTANTIATE_DROPOUT(float)
ATHANOR_INSTANTIATE_DROPOUT(double)
ATHANOR_INSTANTIATE_DROPOUT(bfloat16)
ATHANOR_INSTANTIATE_DROPOUT(float16)

}  // namespace athanor::cpu
#endif  // ATHANOR_ISA_PRIMARY
