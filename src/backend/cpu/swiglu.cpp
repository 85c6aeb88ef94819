// SwiGLU's elementwise passes (see swiglu.h).
#include "backend/cpu/swiglu.h"

#include <cmath>
#include <type_traits>

#include "athanor/core/convert.h"
#include "athanor/core/half.h"

namespace athanor::cpu {
namespace {
template <class T> using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;
constexpr int64_t kGrain = 1 << 14;  // one exp per element: threads pay off from ~16k elements
}  // namespace

template <class T> void swiglu_forward(const T* g, const T* u, T* y, int64_t n) {
  using C = acc_t<T>;
#pragma omp parallel for simd schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) {
    const C gv = cast_value<C>(g[i]);
    y[i] = cast_value<T>(gv / (C(1) + std::exp(-gv)) * cast_value<C>(u[i]));
  }
}

template <class T> void swiglu_backward(const T* dy, const T* g, const T* u, T* dg, T* du, int64_t n) {
  using C = acc_t<T>;
#pragma omp parallel for simd schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) {
    const C gv = cast_value<C>(g[i]), d = cast_value<C>(dy[i]);
    const C s = C(1) / (C(1) + std::exp(-gv));
    dg[i] = cast_value<T>(d * cast_value<C>(u[i]) * s * (C(1) + gv * (C(1) - s)));
    du[i] = cast_value<T>(d * gv * s);
  }
}

#define ATHANOR_INSTANTIATE_SWIGLU(T)                                        \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t);          \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t);
ATHANOR_INSTANTIATE_SWIGLU(float)
ATHANOR_INSTANTIATE_SWIGLU(double)
ATHANOR_INSTANTIATE_SWIGLU(bfloat16)
ATHANOR_INSTANTIATE_SWIGLU(float16)

}  // namespace athanor::cpu
