#include "grad_buffer.h"

#include "athanor/core/convert.h"
#include "athanor/core/error.h"

namespace athanor {

void add_into(Tensor& acc, const Tensor& g) {
  ATH_ASSERT(acc.is_contiguous());
  Tensor src = g;
  if (g.dtype() != acc.dtype() || !g.is_contiguous() || g.sizes() != acc.sizes()) {
    src = empty(acc.sizes(), TensorOptions(acc.dtype()).with_tag(MemTag::workspace));
    copy_into(src, g);
  }
  dispatch(acc.dtype(), [&]<class T>() {
    T* a = static_cast<T*>(acc.raw_data());
    const T* b = static_cast<const T*>(src.raw_data());
    const int64_t n = acc.numel();
    if constexpr (is_half_v<T>) {
      for (int64_t i = 0; i < n; ++i) a[i] = T(static_cast<float>(a[i]) + static_cast<float>(b[i]));
    } else if constexpr (std::is_same_v<T, bool>) {
      for (int64_t i = 0; i < n; ++i) a[i] = a[i] || b[i];
    } else {
#pragma omp parallel for simd if (n > (1 << 16)) schedule(static)
      for (int64_t i = 0; i < n; ++i) a[i] += b[i];
    }
  });
  acc.bump_version();
}

Tensor add_new(const Tensor& a, const Tensor& b) {
  Tensor out = empty(a.sizes(), TensorOptions(a.dtype()));
  copy_into(out, a);
  add_into(out, b);
  return out;
}

}  // namespace athanor
