// Statistics of tensors where they live (athanor/ops/value_stats.h). CPU: plain loops in
// f64 over a contiguous view. CUDA: src/ops/cuda/value_stats.h computes every tensor's
// fields into one small device tensor, read back once.
#include "athanor/ops/value_stats.h"

#include <algorithm>
#include <cmath>

#include "athanor/core/convert.h"
#include "athanor/core/error.h"
#ifdef ATHANOR_HAS_CUDA
#include "backend/cuda/stats.h"
#include "ops/cuda/value_stats.h"
#endif

namespace athanor {
namespace {

void check_floating(const Tensor& x, const char* fn) {
  ATH_CHECK(x.defined(), fn, "an undefined tensor", Hint{"pass defined tensors only"});
  ATH_CHECK(is_floating(x.dtype()), fn, "needs a floating tensor, got ", x.describe(),
            Hint{"convert it with .to(DType::f32) first"});
}

void check_one_device(const std::vector<Tensor>& xs, const char* fn) {
  for (const Tensor& x : xs) {
    check_floating(x, fn);
    ATH_CHECK(x.device() == xs[0].device(), fn, "tensors on ", xs[0].device().str(), " and ", x.device().str(),
              Hint{"call it once per device"});
  }
}

// x's elements in row-major order on the host (x itself when it already is so).
Tensor host_dense(const Tensor& x) {
  if (x.is_contiguous() && x.device().is_cpu()) return x;
  Tensor c = empty(x.sizes(), TensorOptions(x.dtype()));
  copy_into(c, x);
  return c;
}

template <class Fn> void for_each_value(const Tensor& x, Fn&& fn) {
  const Tensor c = host_dense(x);
  const int64_t n = c.numel();
  dispatch(c.dtype(), [&]<class T>() {
    const T* d = static_cast<const T*>(c.raw_data());
    for (int64_t i = 0; i < n; ++i) fn(i, cast_value<double>(d[i]));
  });
}

TensorStats cpu_stats(const Tensor& x, Saturation sat) {
  TensorStats s;
  s.numel = x.numel();
  for_each_value(x, [&](int64_t, double v) {
    if (std::isnan(v)) return void(s.nans += 1);
    if (std::isinf(v)) return void(s.infs += 1);
    s.finite += 1;
    s.sum += v;
    s.sum_squares += v * v;
    s.absmax = std::max(s.absmax, std::fabs(v));
    s.min = std::min(s.min, v);
    s.max = std::max(s.max, v);
    if (v == 0) s.zeros += 1;
    if (sat == Saturation::sigmoid && (v < 0.01 || v > 0.99)) s.saturated += 1;
    if (sat == Saturation::tanh && std::fabs(v) > 0.99) s.saturated += 1;
  });
  return s;
}

// Units of x: the last dim, or dim 1 of NCHW; inner: the elements of a unit in a row.
void unit_geometry(const Tensor& x, int64_t& units, int64_t& inner) {
  const bool nchw = x.dim() == 4;
  units = x.dim() == 0 ? 1 : nchw ? x.size(1) : x.size(-1);
  inner = nchw ? x.size(2) * x.size(3) : 1;
}

#ifdef ATHANOR_HAS_CUDA
// Read by the device kernels: a CUDA tensor of a dtype and rank they take (else host copy).
bool on_device(const Tensor& x) { return !x.device().is_cpu() && detail::cuda_stats_readable(x); }
#endif

}  // namespace

double TensorStats::l2_norm() const {
  if (nans > 0) return std::nan("");
  if (infs > 0) return std::numeric_limits<double>::infinity();
  return std::sqrt(sum_squares);
}

std::vector<TensorStats> value_stats_list(const std::vector<Tensor>& xs, Saturation sat) {
  check_one_device(xs, "value_stats_list");
  std::vector<TensorStats> out;
  if (xs.empty()) return out;
#ifdef ATHANOR_HAS_CUDA
  if (std::all_of(xs.begin(), xs.end(), on_device)) {
    const Tensor dev = detail::cuda_value_stats(xs, static_cast<int>(sat));
    const Tensor host = dev.cpu();  // the one read
    const double* f = host.data_ptr<double>();
    for (size_t i = 0; i < xs.size(); ++i, f += cuda::kStatsFields) {
      TensorStats s;
      s.numel = xs[i].numel();
      s.finite = f[cuda::kFinite], s.sum = f[cuda::kSum], s.sum_squares = f[cuda::kSumSquares];
      s.absmax = f[cuda::kAbsMax], s.zeros = f[cuda::kZeros], s.saturated = f[cuda::kSaturated];
      s.min = f[cuda::kMin], s.max = f[cuda::kMax], s.nans = f[cuda::kNaN], s.infs = f[cuda::kInf];
      out.push_back(s);
    }
    return out;
  }
#endif
  for (const Tensor& x : xs) out.push_back(cpu_stats(x, sat));
  return out;
}

TensorStats value_stats(const Tensor& x, Saturation sat) { return value_stats_list({x}, sat)[0]; }

std::vector<double> squared_distances(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ATH_CHECK(a.size() == b.size(), "squared_distances", a.size(), " tensors against ", b.size(),
            Hint{"pass the two lists pairwise"});
  std::vector<Tensor> all = a;
  all.insert(all.end(), b.begin(), b.end());
  check_one_device(all, "squared_distances");
  for (size_t i = 0; i < a.size(); ++i)
    ATH_CHECK(a[i].sizes() == b[i].sizes() && a[i].dtype() == b[i].dtype(), "squared_distances", "pair ", i, ": ",
              a[i].describe(), " and ", b[i].describe(), Hint{"each pair must have one shape and dtype"});
  std::vector<double> out;
  if (a.empty()) return out;
#ifdef ATHANOR_HAS_CUDA
  if (std::all_of(all.begin(), all.end(), on_device)) {
    const Tensor host = detail::cuda_squared_distances(a, b).cpu();  // the one read
    return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + a.size());
  }
#endif
  for (size_t i = 0; i < a.size(); ++i) {
    const Tensor w0 = host_dense(a[i]), w1 = host_dense(b[i]);
    double diff = 0;
    const int64_t n = w0.numel();
    dispatch(w0.dtype(), [&]<class T>() {
      const T* p = static_cast<const T*>(w0.raw_data());
      const T* q = static_cast<const T*>(w1.raw_data());
      for (int64_t k = 0; k < n; ++k) {
        const double d = cast_value<double>(q[k]) - cast_value<double>(p[k]);
        diff += d * d;
      }
    });
    out.push_back(diff);
  }
  return out;
}

void accumulate_fired_units(const Tensor& x, Tensor& fired) {
  check_floating(x, "accumulate_fired_units");
  int64_t units = 1, inner = 1;
  unit_geometry(x, units, inner);
  ATH_CHECK(units > 0, "accumulate_fired_units", "no units in ", x.describe(), Hint{"pass a tensor with features"});
  if (!fired.defined()) fired = zeros({units}, TensorOptions(DType::u8).with_device(x.device()).with_tag(MemTag::workspace));
  ATH_CHECK(fired.dtype() == DType::u8 && fired.dim() == 1 && fired.size(0) == units && fired.device() == x.device() &&
                fired.is_contiguous(),
            "accumulate_fired_units", "the record ", fired.describe(), " does not fit ", x.describe(), " (", units,
            " units)", Hint{"start a new record (an undefined tensor) when the layer's width changes"});
#ifdef ATHANOR_HAS_CUDA
  if (on_device(x)) {
    detail::cuda_units_fired(x, units, inner, fired);
    return;
  }
#endif
  ATH_CHECK(fired.device().is_cpu(), "accumulate_fired_units", "a ", x.describe(), " the CUDA kernels cannot read",
            Hint{"convert it to f32, bf16 or f16"});
  uint8_t* f = fired.data_ptr<uint8_t>();
  for_each_value(x, [&](int64_t i, double v) {
    if (v > 0) f[(i / inner) % units] = 1;
  });
}

std::vector<double> histogram_counts(const Tensor& x, double min, double width, const std::vector<double>& limits) {
  check_floating(x, "histogram_counts");
  const int64_t nb = static_cast<int64_t>(limits.size());
  ATH_CHECK(nb >= 1 && width > 0, "histogram_counts", nb, " buckets of width ", width,
            Hint{"pass at least one bucket limit and a positive width"});
#ifdef ATHANOR_HAS_CUDA
  if (on_device(x) && nb <= cuda::kMaxHistogramBuckets) {
    const Tensor host = detail::cuda_histogram_counts(x, min, width, limits).cpu();  // the one read
    std::vector<double> out;
    for (int64_t i = 0; i < nb; ++i) out.push_back(static_cast<double>(host.data_ptr<int64_t>()[i]));
    return out;
  }
#endif
  std::vector<double> out(static_cast<size_t>(nb), 0.0);
  for_each_value(x, [&](int64_t, double v) {
    if (!std::isfinite(v)) return;
    // Bucket i holds (limit[i-1], limit[i]]; the first also holds min itself.
    int64_t i = static_cast<int64_t>(std::ceil((v - min) / width)) - 1;
    i = std::clamp<int64_t>(i, 0, nb - 1);
    while (i > 0 && v <= limits[static_cast<size_t>(i - 1)]) --i;  // rounding at the edges
    while (i + 1 < nb && v > limits[static_cast<size_t>(i)]) ++i;
    out[static_cast<size_t>(i)] += 1;
  });
  return out;
}

}  // namespace athanor
