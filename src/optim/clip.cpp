#include "athanor/optim/clip.h"

#include <cmath>

#include "athanor/core/convert.h"
#include "athanor/core/error.h"

namespace athanor::optim {

double grad_norm(const std::vector<Tensor>& params) {
  double total = 0;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    ATH_CHECK(g.is_contiguous(), "grad_norm", "gradient of ", p.describe(), " is not contiguous");
    dispatch(g.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        const T* d = static_cast<const T*>(g.raw_data());
        const int64_t n = g.numel();
        double s = 0;
#pragma omp parallel for reduction(+ : s) if (n > (1 << 14))
        for (int64_t i = 0; i < n; ++i) {
          const double v = cast_value<double>(d[i]);
          s += v * v;
        }
        total += s;
      }
    });
  }
  return std::sqrt(total);
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  ATH_CHECK(max_norm > 0, "clip_grad_norm", "max_norm must be > 0, got ", max_norm);
  const double norm = grad_norm(params);
  if (!std::isfinite(norm)) return norm;  // leave the gradients alone; the caller reports/skips
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return norm;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    dispatch(g.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        T* d = static_cast<T*>(g.raw_data());
        const int64_t n = g.numel();
#pragma omp parallel for if (n > (1 << 14))
        for (int64_t i = 0; i < n; ++i) d[i] = cast_value<T>(cast_value<double>(d[i]) * coef);
      }
    });
    g.bump_version();
  }
  return norm;
}

void clip_grad_value(const std::vector<Tensor>& params, double clip) {
  ATH_CHECK(clip > 0, "clip_grad_value", "clip must be > 0, got ", clip);
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    dispatch(g.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        T* d = static_cast<T*>(g.raw_data());
        for (int64_t i = 0; i < g.numel(); ++i) d[i] = cast_value<T>(std::clamp(cast_value<double>(d[i]), -clip, clip));
      }
    });
    g.bump_version();
  }
}

}  // namespace athanor::optim
