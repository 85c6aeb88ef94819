// The device side of value_stats.h: the tensors' geometry handed to src/backend/cuda/stats.h.
#include "ops/cuda/value_stats.h"

#include <algorithm>

#include "athanor/core/allocator.h"
#include "athanor/core/error.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda/stats.h"

namespace athanor::detail {
namespace {

cuda::StatsInput input(const Tensor& x) {
  cuda::StatsInput in;
  in.data = x.device_data();
  in.dtype = x.dtype();
  in.ndim = static_cast<int>(x.dim());
  for (int d = 0; d < in.ndim; ++d) in.sizes[d] = x.size(d), in.strides[d] = x.stride(d);
  in.contiguous = x.is_contiguous();
  in.numel = x.numel();
  return in;
}

Tensor workspace(const Shape& shape, DType dt, Device dev) {
  return empty(shape, TensorOptions(dt).with_device(dev).with_tag(MemTag::workspace));
}

}  // namespace

bool cuda_stats_readable(const Tensor& x) {
  return (x.dtype() == DType::f32 || x.dtype() == DType::bf16 || x.dtype() == DType::f16) && x.dim() <= cuda::kMaxIndexDims;
}

Tensor cuda_value_stats(const std::vector<Tensor>& xs, int sat) {
  ATH_ASSERT(!xs.empty());
  const Device dev = xs[0].device();
  const int64_t n = static_cast<int64_t>(xs.size());
  Tensor out = workspace({n, cuda::kStatsFields}, DType::f64, dev);
  Tensor scratch = workspace({cuda::kStatsScratch}, DType::f64, dev);
  cuda::DeviceGuard g(dev.index);
  const cudaStream_t s = cuda::compute_stream(dev.index);
  double* o = static_cast<double*>(out.device_data());
  for (int64_t i = 0; i < n; ++i)  // one scratch: the launches run in stream order
    cuda::value_stats(input(xs[static_cast<size_t>(i)]), static_cast<cuda::SaturationMode>(sat),
                       static_cast<double*>(scratch.device_data()), o + i * cuda::kStatsFields, s);
  return out;
}

Tensor cuda_squared_distances(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ATH_ASSERT(!a.empty() && a.size() == b.size());
  const Device dev = a[0].device();
  Tensor out = workspace({static_cast<int64_t>(a.size())}, DType::f64, dev);
  Tensor scratch = workspace({cuda::kStatsScratch}, DType::f64, dev);
  cuda::DeviceGuard g(dev.index);
  const cudaStream_t s = cuda::compute_stream(dev.index);
  for (size_t i = 0; i < a.size(); ++i)
    cuda::squared_distance(input(a[i]), input(b[i]), static_cast<double*>(scratch.device_data()),
                           static_cast<double*>(out.device_data()) + i, s);
  return out;
}

void cuda_units_fired(const Tensor& x, int64_t units, int64_t inner, const Tensor& fired) {
  cuda::DeviceGuard g(x.device().index);
  cuda::units_fired(input(x), units, inner, static_cast<unsigned char*>(fired.device_data()),
                    cuda::compute_stream(x.device().index));
}

Tensor cuda_histogram_counts(const Tensor& x, double min, double width, const std::vector<double>& limits) {
  ATH_ASSERT(!limits.empty() && limits.size() <= static_cast<size_t>(cuda::kMaxHistogramBuckets));
  cuda::HistogramSpec h;
  h.min = min, h.width = width, h.buckets = static_cast<int>(limits.size());
  std::copy(limits.begin(), limits.end(), h.limits);
  Tensor counts = zeros({h.buckets}, TensorOptions(DType::i64).with_device(x.device()).with_tag(MemTag::workspace));
  cuda::DeviceGuard g(x.device().index);
  cuda::histogram_counts(input(x), h, static_cast<unsigned long long*>(counts.device_data()),
                         cuda::compute_stream(x.device().index));
  return counts;
}

}  // namespace athanor::detail
