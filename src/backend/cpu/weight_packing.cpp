// Packing a weight into oneDNN's blocked B layout (weight_packing.h). The forward's B is
// W^T, so its panels are transposes of 64-row blocks of W: done in 16 x 16 register
// tiles of 32-bit elements (an f32, or a pair of bf16 along k, which the bf16 layout
// keeps side by side). dx's B is W itself: row segments copied (f32) or two rows
// interleaved element by element (bf16).
// Weight packing (weight_packing.h): the layout arithmetic once, the packing loops
// compiled once per ISA level (isa_kernel.h).
#include "backend/cpu/weight_packing.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "athanor/core/half.h"
#include "backend/cpu/isa_kernel.h"

ATHANOR_ISA_BEGIN

namespace {

#if ATHANOR_CPU_AVX512
// r[i] = row i of a 16 x 16 tile of 32-bit elements -> r[j] = column j.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  __m512 u[16];  // u[4g + c], 128-bit lane L: column 4L + c of rows 4g .. 4g + 3
  for (int g = 0; g < 4; ++g) {
    const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 2]);
    const __m512d c = _mm512_castps_pd(t[4 * g + 1]), d = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
  }
  for (int c = 0; c < 4; ++c) {  // a 4 x 4 transpose of 128-bit lanes
    const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44), v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    r[4 + c] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
    r[8 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
  }
}

// B = W^T with 32-bit elements (f32, or bf16 pairs along k): W32 is [rows, cols32] with
// leading dimension ld32; element (r, c) goes to dst32[(r / 64) * panel + c * 64 + r % 64].
// Rows [r0, r1) with r0 a multiple of 16; the whole 16 x 16 tiles here, the edges to
// the caller (returns the first row and column this did not cover).
void transpose_tiles(const uint32_t* W32, int64_t ld32, int64_t cols32, int64_t panel, int64_t r0, int64_t r1,
                     uint32_t* dst32, int64_t& rows_done, int64_t& cols_done) {
  const int64_t r_end = r0 + (r1 - r0) / 16 * 16, c_end = cols32 / 16 * 16;
  for (int64_t r = r0; r < r_end; r += 16) {
    uint32_t* out = dst32 + (r / 64) * panel + r % 64;
    for (int64_t c = 0; c < c_end; c += 16) {
      __m512 t[16];
      for (int i = 0; i < 16; ++i) t[i] = _mm512_loadu_ps(W32 + (r + i) * ld32 + c);
      transpose16(t);
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(out + (c + i) * 64, t[i]);
    }
  }
  rows_done = r_end;
  cols_done = c_end;
}
#endif

}  // namespace

void pack_weight_rows(const PackedLayout& l, bool w_is_bt, const void* W, int64_t ldw, int64_t r0, int64_t r1, void* dst) {
  if (r1 <= r0) return;
#if ATHANOR_CPU_AVX512
  if (w_is_bt && r0 % 16 == 0 && (!l.bf16 || ldw % 2 == 0)) {
    // 32-bit elements: f32, or bf16 pairs (k, k + 1), which both W's rows and the
    // packed layout keep side by side.
    const int64_t cols32 = l.bf16 ? l.K / 2 : l.K, ld32 = l.bf16 ? ldw / 2 : ldw, panel = l.bf16 ? l.Kp / 2 * 64 : l.Kp * 64;
    int64_t rows_done = r0, cols_done = 0;
    transpose_tiles(static_cast<const uint32_t*>(W), ld32, cols32, panel, r0, r1, static_cast<uint32_t*>(dst), rows_done,
                    cols_done);
    // The edges: columns past the last whole tile (in W's elements) of the rows done, then the rows left.
    const int64_t first_col = l.bf16 ? cols_done * 2 : cols_done;
    if (first_col < l.K)
      for (int64_t r = r0; r < rows_done; ++r)
        for (int64_t k = first_col; k < l.K; ++k) {
          const int64_t at = detail::packed_index(l, k, r);
          if (l.bf16) static_cast<bfloat16*>(dst)[at] = static_cast<const bfloat16*>(W)[r * ldw + k];
          else static_cast<float*>(dst)[at] = static_cast<const float*>(W)[r * ldw + k];
        }
    detail::pack_weight_rows_scalar(l, w_is_bt, W, ldw, rows_done, r1, dst);
    return;
  }
  if (!w_is_bt && !l.bf16) {  // f32 B = W: each row's 64-column segments, copied
    for (int64_t k = r0; k < r1; ++k)
      for (int64_t n = 0; n < l.N; n += 64)
        std::memcpy(static_cast<float*>(dst) + detail::packed_index(l, k, n), static_cast<const float*>(W) + k * ldw + n,
                    static_cast<size_t>(std::min<int64_t>(64, l.N - n)) * sizeof(float));
    return;
  }
  if (!w_is_bt && l.bf16 && r0 % 2 == 0) {  // bf16 B = W: rows k and k + 1 interleaved element by element
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5,
                                        36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    const auto* w = static_cast<const uint16_t*>(W);
    auto* out = static_cast<uint16_t*>(dst);
    const int64_t pair_end = r0 + (std::min(r1, l.K) - r0) / 2 * 2, n_end = l.N / 32 * 32;
    for (int64_t k = r0; k < pair_end; k += 2) {
      for (int64_t n = 0; n < n_end; n += 32) {
        const __m512i a = _mm512_loadu_si512(w + k * ldw + n), b = _mm512_loadu_si512(w + (k + 1) * ldw + n);
        uint16_t* o = out + detail::packed_index(l, k, n);  // 32 columns stay inside one 64-column panel
        _mm512_storeu_si512(o, _mm512_permutex2var_epi16(a, lo, b));
        _mm512_storeu_si512(o + 32, _mm512_permutex2var_epi16(a, hi, b));
      }
      for (int64_t n = n_end; n < l.N; ++n) {
        out[detail::packed_index(l, k, n)] = w[k * ldw + n];
        out[detail::packed_index(l, k + 1, n)] = w[(k + 1) * ldw + n];
      }
    }
    detail::pack_weight_rows_scalar(l, w_is_bt, W, ldw, pair_end, r1, dst);
    return;
  }
#endif
  detail::pack_weight_rows_scalar(l, w_is_bt, W, ldw, r0, r1, dst);
}

void pack_weight(const PackedLayout& l, bool w_is_bt, const void* W, int64_t ldw, void* dst) {
  const int64_t rows = w_is_bt ? l.N : l.K;
#pragma omp parallel if (rows * (w_is_bt ? l.K : l.N) > (1 << 15))
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    ATHANOR_ISA_NS::pack_weight_rows(l, w_is_bt, W, ldw, pack_share_begin(rows, t, n), pack_share_begin(rows, t + 1, n), dst);
  }
}

ATHANOR_ISA_END

#if ATHANOR_ISA_PRIMARY
namespace athanor::cpu {

PackedLayout packed_layout(bool bf16, int64_t K, int64_t N) {
  const int64_t kb = bf16 ? 32 : 16;
  return PackedLayout{bf16, K, N, (K + kb - 1) / kb * kb, (N + 63) / 64 * 64};
}

int64_t pack_share_begin(int64_t rows, int t, int threads) {
  if (t >= threads) return rows;
  return std::min(rows, rows * t / threads / 16 * 16);
}

namespace detail {

void pack_weight_rows_scalar(const PackedLayout& l, bool w_is_bt, const void* W, int64_t ldw, int64_t r0, int64_t r1,
                             void* dst) {
  const int64_t cols = w_is_bt ? l.K : l.N;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t k = w_is_bt ? c : r, n = w_is_bt ? r : c, at = packed_index(l, k, n);
      if (l.bf16) static_cast<bfloat16*>(dst)[at] = static_cast<const bfloat16*>(W)[r * ldw + c];
      else static_cast<float*>(dst)[at] = static_cast<const float*>(W)[r * ldw + c];
    }
}

}  // namespace detail

ATHANOR_ISA_DECLARE(
    void pack_weight_rows(const PackedLayout& l, bool w_is_bt, const void* W, int64_t ldw, int64_t r0, int64_t r1,
                          void* dst);
    void pack_weight(const PackedLayout& l, bool w_is_bt, const void* W, int64_t ldw, void* dst);)

void pack_weight_rows(const PackedLayout& l, bool w_is_bt, const void* W, int64_t ldw, int64_t r0, int64_t r1, void* dst) {
  ATHANOR_ISA_CALL(pack_weight_rows, l, w_is_bt, W, ldw, r0, r1, dst);
}
void pack_weight(const PackedLayout& l, bool w_is_bt, const void* W, int64_t ldw, void* dst) {
  ATHANOR_ISA_CALL(pack_weight, l, w_is_bt, W, ldw, dst);
}

}  // namespace athanor::cpu
#endif  // ATHANOR_ISA_PRIMARY
