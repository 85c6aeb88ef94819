#pragma once
// The device side of athanor/ops/value_stats.h (src/backend/cuda/stats.h over tensors):
// results stay on the device, on its compute stream; nothing synchronises.
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor::detail {

// Whether the kernels read x in place (f32, bf16 or f16; at most 8 dims).
bool cuda_stats_readable(const Tensor& x);
// f64 [xs.size(), cuda::kStatsFields] on xs' device; `sat` is a cuda::SaturationMode.
Tensor cuda_value_stats(const std::vector<Tensor>& xs, int sat);
// f64 [a.size()]: Σ (b - a)^2 per pair.
Tensor cuda_squared_distances(const std::vector<Tensor>& a, const std::vector<Tensor>& b);
// fired[unit] = 1 where an element of the unit is > 0 (fired: u8 [units] on x's device).
void cuda_units_fired(const Tensor& x, int64_t units, int64_t inner, const Tensor& fired);
// i64 [limits.size()] of bucket counts (limits.size() <= cuda::kMaxHistogramBuckets).
Tensor cuda_histogram_counts(const Tensor& x, double min, double width, const std::vector<double>& limits);

}  // namespace athanor::detail
