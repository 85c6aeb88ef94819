// Extremum and variance reductions over [outer, r, inner] (see minmax.h).
//
// max/min, inner == 1: one row at a time, 16 independent SIMD lanes each keep
// (best value, first index) and are merged at the end by (value, smallest
// index) — a single vectorized pass that still returns the FIRST extremum. A
// single very long row (a reduction over all elements) is split into chunks
// run in parallel and merged in chunk order, so ties still go to the first.
// inner > 1: blocks of 64 columns keep per-column (best, index) while walking
// r, vectorized across the columns; blocks and rows run in parallel.
//
// var: two passes (mean, then sum of squared deviations) with the same
// row/column structure as sum_3d; never negative, accurate for large means.
#include "backend/cpu/minmax.h"

#include <omp.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "athanor/core/convert.h"

namespace athanor::cpu {
namespace {

// The type elements are compared in: f32 for bf16/f16, the element type otherwise.
template <class T> using cmp_t = std::conditional_t<is_half_v<T>, float, T>;

// True when v should replace `best` (strictly better, or the first NaN).
template <bool Max, class A> inline bool better(A v, A best) {
  if constexpr (std::is_floating_point_v<A>) {
    return (Max ? v > best : v < best) || (v != v && best == best);
  } else {
    return Max ? v > best : v < best;
  }
}
template <class A> inline bool same(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) return a == b || (a != a && b != b);
  else return a == b;
}

constexpr int kLanes = 16;
constexpr int64_t kBlock = 64;
constexpr int64_t kParallelMin = 1 << 15;

// First extremum of row[0, n) (n >= 1); index relative to row.
template <bool Max, class T> void row_extremum(const T* row, int64_t n, cmp_t<T>& out_v, int64_t& out_i) {
  using A = cmp_t<T>;
  A v = cast_value<A>(row[0]);
  int64_t idx = 0;
  int64_t j = 1;
  if (n >= 2 * kLanes) {
    A bv[kLanes];
    int64_t bi[kLanes];
    for (int l = 0; l < kLanes; ++l) bv[l] = cast_value<A>(row[l]), bi[l] = l;
    for (j = kLanes; j + kLanes <= n; j += kLanes) {
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) {
        const A x = cast_value<A>(row[j + l]);
        const bool t = better<Max>(x, bv[l]);
        bv[l] = t ? x : bv[l];
        bi[l] = t ? j + l : bi[l];
      }
    }
    v = bv[0], idx = bi[0];
    for (int l = 1; l < kLanes; ++l)
      if (better<Max>(bv[l], v) || (same(bv[l], v) && bi[l] < idx)) v = bv[l], idx = bi[l];
  }
  for (; j < n; ++j) {  // the tail (or a short row): indices beyond every lane's, so strict is first
    const A x = cast_value<A>(row[j]);
    if (better<Max>(x, v)) v = x, idx = j;
  }
  out_v = v;
  out_i = idx;
}

template <bool Max, class T>
void minmax_impl(const T* x, T* values, int64_t* indices, int64_t outer, int64_t r, int64_t inner) {
  using A = cmp_t<T>;
  const int64_t total = outer * r * inner;
  if (inner == 1) {
    const int nthreads = omp_get_max_threads();
    if (outer < nthreads && r >= kParallelMin && !omp_in_parallel()) {
      // Few long rows: split each row into chunks, merge in chunk order.
      for (int64_t o = 0; o < outer; ++o) {
        const T* row = x + o * r;
        const int64_t nchunks = std::min<int64_t>(nthreads * 4, r / 4096 + 1);
        const int64_t chunk = (r + nchunks - 1) / nchunks;
        std::vector<A> cv(nchunks);
        std::vector<int64_t> ci(nchunks, -1);
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < nchunks; ++c) {
          const int64_t b = c * chunk, e = std::min(r, b + chunk);
          if (b < e) {
            row_extremum<Max>(row + b, e - b, cv[c], ci[c]);
            ci[c] += b;
          }
        }
        A v = cv[0];
        int64_t idx = ci[0];
        for (int64_t c = 1; c < nchunks; ++c)
          if (ci[c] >= 0 && better<Max>(cv[c], v)) v = cv[c], idx = ci[c];
        if (values) values[o] = row[idx];
        indices[o] = idx;
      }
      return;
    }
#pragma omp parallel for if (total > kParallelMin) schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      A v;
      int64_t idx;
      row_extremum<Max>(x + o * r, r, v, idx);
      if (values) values[o] = x[o * r + idx];
      indices[o] = idx;
    }
    return;
  }
  const int64_t nblocks = (inner + kBlock - 1) / kBlock;
#pragma omp parallel for collapse(2) if (total > kParallelMin) schedule(static)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t i0 = b * kBlock, n = std::min(kBlock, inner - i0);
      const T* base = x + o * r * inner + i0;
      A bv[kBlock];
      int64_t bi[kBlock];
      for (int64_t i = 0; i < n; ++i) bv[i] = cast_value<A>(base[i]), bi[i] = 0;
      for (int64_t j = 1; j < r; ++j) {
        const T* row = base + j * inner;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) {
          const A v = cast_value<A>(row[i]);
          const bool t = better<Max>(v, bv[i]);
          bv[i] = t ? v : bv[i];
          bi[i] = t ? j : bi[i];
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        if (values) values[o * inner + i0 + i] = base[bi[i] * inner + i];  // the element itself: exact
        indices[o * inner + i0 + i] = bi[i];
      }
    }
}

}  // namespace

template <class T>
void minmax_3d(const T* x, T* values, int64_t* indices, int64_t outer, int64_t r, int64_t inner, bool is_max) {
  if (outer * inner == 0) return;
  if (is_max) minmax_impl<true>(x, values, indices, outer, r, inner);
  else minmax_impl<false>(x, values, indices, outer, r, inner);
}

template <class T, class A>
void var_3d(const T* x, T* var, A* mean, int64_t outer, int64_t r, int64_t inner, int64_t correction) {
  const A inv_n = A(1) / static_cast<A>(r);
  const A denom = static_cast<A>(std::max<int64_t>(r - correction, 0));
  const int64_t total = outer * r * inner;
  if (inner == 1) {
#pragma omp parallel for if (total > kParallelMin) schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      const T* row = x + o * r;
      A s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < r; ++j) s += cast_value<A>(row[j]);
      const A m = s * inv_n;
      A q = 0;
#pragma omp simd reduction(+ : q)
      for (int64_t j = 0; j < r; ++j) {
        const A d = cast_value<A>(row[j]) - m;
        q += d * d;
      }
      var[o] = cast_value<T>(q / denom);
      if (mean) mean[o] = m;
    }
    return;
  }
  const int64_t nblocks = (inner + kBlock - 1) / kBlock;
#pragma omp parallel for collapse(2) if (total > kParallelMin) schedule(static)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t i0 = b * kBlock, n = std::min(kBlock, inner - i0);
      const T* base = x + o * r * inner + i0;
      A s[kBlock], q[kBlock];
      for (int64_t i = 0; i < n; ++i) s[i] = 0, q[i] = 0;
      for (int64_t j = 0; j < r; ++j) {
        const T* row = base + j * inner;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) s[i] += cast_value<A>(row[i]);
      }
      for (int64_t i = 0; i < n; ++i) s[i] *= inv_n;  // now the mean
      for (int64_t j = 0; j < r; ++j) {
        const T* row = base + j * inner;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) {
          const A d = cast_value<A>(row[i]) - s[i];
          q[i] += d * d;
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        var[o * inner + i0 + i] = cast_value<T>(q[i] / denom);
        if (mean) mean[o * inner + i0 + i] = s[i];
      }
    }
}

namespace ref {
template <class T>
void minmax_3d(const T* x, T* values, int64_t* indices, int64_t outer, int64_t r, int64_t inner, bool is_max) {
  using C = std::conditional_t<is_float_type_v<T>, double, T>;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      int64_t best = 0;
      for (int64_t j = 1; j < r; ++j) {
        const C v = cast_value<C>(x[(o * r + j) * inner + i]);
        const C b = cast_value<C>(x[(o * r + best) * inner + i]);
        bool take = is_max ? v > b : v < b;
        if constexpr (std::is_floating_point_v<C>) {
          if (b != b) take = false;       // already holding the first NaN
          else if (v != v) take = true;   // NaN propagates
        }
        if (take) best = j;
      }
      if (values) values[o * inner + i] = x[(o * r + best) * inner + i];
      indices[o * inner + i] = best;
    }
}

template <class T, class A>
void var_3d(const T* x, T* var, A* mean, int64_t outer, int64_t r, int64_t inner, int64_t correction) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double s = 0;
      for (int64_t j = 0; j < r; ++j) s += cast_value<double>(x[(o * r + j) * inner + i]);
      const double m = s / static_cast<double>(r);
      double q = 0;
      for (int64_t j = 0; j < r; ++j) {
        const double d = cast_value<double>(x[(o * r + j) * inner + i]) - m;
        q += d * d;
      }
      var[o * inner + i] = cast_value<T>(q / static_cast<double>(std::max<int64_t>(r - correction, 0)));
      if (mean) mean[o * inner + i] = static_cast<A>(m);
    }
}
}  // namespace ref

#define ATHANOR_INSTANTIATE_MINMAX(T)                                                            \
  template void minmax_3d<T>(const T*, T*, int64_t*, int64_t, int64_t, int64_t, bool);          \
  template void ref::minmax_3d<T>(const T*, T*, int64_t*, int64_t, int64_t, int64_t, bool);
ATHANOR_INSTANTIATE_MINMAX(float)
ATHANOR_INSTANTIATE_MINMAX(double)
ATHANOR_INSTANTIATE_MINMAX(bfloat16)
ATHANOR_INSTANTIATE_MINMAX(float16)
ATHANOR_INSTANTIATE_MINMAX(int32_t)
ATHANOR_INSTANTIATE_MINMAX(int64_t)
ATHANOR_INSTANTIATE_MINMAX(uint8_t)
#undef ATHANOR_INSTANTIATE_MINMAX

#define ATHANOR_INSTANTIATE_VAR(T, A)                                                            \
  template void var_3d<T, A>(const T*, T*, A*, int64_t, int64_t, int64_t, int64_t);             \
  template void ref::var_3d<T, A>(const T*, T*, A*, int64_t, int64_t, int64_t, int64_t);
ATHANOR_INSTANTIATE_VAR(float, float)
ATHANOR_INSTANTIATE_VAR(double, double)
ATHANOR_INSTANTIATE_VAR(bfloat16, float)
ATHANOR_INSTANTIATE_VAR(float16, float)
#undef ATHANOR_INSTANTIATE_VAR

}  // namespace athanor::cpu
