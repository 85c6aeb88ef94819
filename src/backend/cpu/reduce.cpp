#include "backend/cpu/reduce.h"

#include <omp.h>

#include <algorithm>

#include "athanor/core/convert.h"
#include "backend/cpu/stealing_runs.h"

namespace athanor::cpu {
namespace {
template <class T> using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;
}

namespace {
// x of type T, out of type O (O = T, or f32 for a bf16/f16 x: sum under autocast).
template <class T, class O> void sum_3d_impl(const T* x, O* out, int64_t outer, int64_t r, int64_t inner, double scale) {
  using A = acc_t<T>;
  const A s = static_cast<A>(scale);
  if (inner == 1) {
#pragma omp parallel for if (outer * r > (1 << 15)) schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      const T* row = x + o * r;
      A acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t j = 0; j < r; ++j) acc += cast_value<A>(row[j]);
      out[o] = cast_value<O>(acc * s);
    }
    return;
  }
  // Tasks are (o, block of columns): a bias gradient (outer 1, r = rows) still splits over
  // the threads. Each element sums its r values in order j = 0..r-1, whatever the split.
  constexpr int64_t kCols = 512;  // per-task accumulator on the stack (no allocation)
  const int64_t threads = omp_get_max_threads();
  // Blocks of equal width (multiples of 16 columns, at most kCols) and, when outer alone does
  // not cover the threads, a multiple of `threads` of them per outer index: 1152 columns as
  // 512 + 512 + 128 left one thread 1024 columns and the other 128 (small GPT's qkv bias).
  int64_t nblocks = (inner + kCols - 1) / kCols;
  if (outer < threads) nblocks = (std::max(nblocks, threads) + threads - 1) / threads * threads;
  const int64_t cols = std::min(kCols, (inner + nblocks - 1) / nblocks + 15) / 16 * 16;
  nblocks = (inner + cols - 1) / cols;
  parallel_for_stealing(outer * nblocks, outer * r * inner > (1 << 15), [&](int64_t task) {
    const int64_t o = task / nblocks, i0 = (task % nblocks) * cols, n = std::min(cols, inner - i0);
    A acc[kCols];
    std::fill(acc, acc + n, A(0));
    for (int64_t j = 0; j < r; ++j) {
      const T* row = x + (o * r + j) * inner + i0;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) acc[i] += cast_value<A>(row[i]);
    }
    O* dst = out + o * inner + i0;
    for (int64_t i = 0; i < n; ++i) dst[i] = cast_value<O>(acc[i] * s);
  });
}
}  // namespace

template <class T> void sum_3d(const T* x, T* out, int64_t outer, int64_t r, int64_t inner, double scale) {
  sum_3d_impl<T, T>(x, out, outer, r, inner, scale);
}
template <class L>
void sum_3d_lowp_input(const L* x, float* out, int64_t outer, int64_t r, int64_t inner, double scale) {
  sum_3d_impl<L, float>(x, out, outer, r, inner, scale);
}
template void sum_3d_lowp_input<bfloat16>(const bfloat16*, float*, int64_t, int64_t, int64_t, double);
template void sum_3d_lowp_input<float16>(const float16*, float*, int64_t, int64_t, int64_t, double);

namespace ref {
template <class T> void sum_3d(const T* x, T* out, int64_t outer, int64_t r, int64_t inner, double scale) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double acc = 0;
      for (int64_t j = 0; j < r; ++j) acc += cast_value<double>(x[(o * r + j) * inner + i]);
      out[o * inner + i] = cast_value<T>(acc * scale);
    }
}
}  // namespace ref

#define ATHANOR_INSTANTIATE_SUM(T)                                                  \
  template void sum_3d<T>(const T*, T*, int64_t, int64_t, int64_t, double);        \
  template void ref::sum_3d<T>(const T*, T*, int64_t, int64_t, int64_t, double);
ATHANOR_INSTANTIATE_SUM(float)
ATHANOR_INSTANTIATE_SUM(double)
ATHANOR_INSTANTIATE_SUM(bfloat16)
ATHANOR_INSTANTIATE_SUM(float16)
#undef ATHANOR_INSTANTIATE_SUM

}  // namespace athanor::cpu
