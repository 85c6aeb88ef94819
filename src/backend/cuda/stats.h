#pragma once
// The statistics the trainer's observer reads of a device tensor (src/ops/value_stats.cpp,
// train/step_observer.cpp), computed on the device so only a handful of doubles cross to
// the host: no copy of the tensor, no scratch the size of the tensor.
//  - value_stats: the fields of StatsField over a strided f32/bf16/f16 tensor, in f64,
//    written to out[0..kStatsFields); a fixed grid of kStatsBlocks blocks (grid-stride
//    loop, per-thread f64 partials, a block tree) then one block over the block partials:
//    the same order, and bits, every run;
//  - squared_distance: Σ (b - a)^2 in f64 over two tensors of one shape (non-finite values
//    included, so a NaN weight shows as a NaN distance, as on the CPU);
//  - units_fired: fired[unit] = 1 where an element of the unit is > 0 (units: the last dim,
//    or dim 1 of NCHW with `inner` = H W);
//  - histogram_counts: counts[b] += the finite values in bucket b of the CPU's rule
//    (step_observer.cpp histogram()), with atomics on 64-bit counts.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "athanor/core/dtype.h"
#include "backend/cuda/strided_index.h"

namespace athanor::cuda {

// The fields, in this order, of one tensor's statistics. Counts are exact in f64 below 2^53.
enum StatsField : int {
  kFinite = 0,    // finite values
  kSum,           // Σ v over the finite values
  kSumSquares,    // Σ v^2 over the finite values
  kAbsMax,        // max |v| over the finite values (0 when none)
  kZeros,         // finite values == 0
  kSaturated,     // finite values saturated by the mode (sigmoid: v < 0.01 || v > 0.99; tanh: |v| > 0.99)
  kMin,           // min finite value (+inf when none)
  kMax,           // max finite value (-inf when none)
  kNaN,           // NaN values
  kInf,           // ±inf values
  kStatsFields
};
enum class SaturationMode : int { none = 0, sigmoid = 1, tanh = 2 };

inline constexpr int kStatsBlocks = 256, kStatsThreads = 256;
inline constexpr int kMaxHistogramBuckets = 128;

// One strided tensor on the device: element i (row-major over sizes) at data + offset(i).
struct StatsInput {
  const void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  int64_t sizes[kMaxIndexDims] = {}, strides[kMaxIndexDims] = {};
  bool contiguous = true;
  int64_t numel = 0;
};

// Doubles of scratch value_stats and squared_distance need.
inline constexpr int64_t kStatsScratch = int64_t{kStatsBlocks} * kStatsFields;

void value_stats(const StatsInput& x, SaturationMode mode, double* scratch, double* out, cudaStream_t stream);
// out[0] = Σ (b - a)^2; a and b of one shape (each at its own strides).
void squared_distance(const StatsInput& a, const StatsInput& b, double* scratch, double* out, cudaStream_t stream);
void units_fired(const StatsInput& x, int64_t units, int64_t inner, unsigned char* fired, cudaStream_t stream);
struct HistogramSpec {
  double min = 0, width = 0;
  int buckets = 0;                          // 1..kMaxHistogramBuckets
  double limits[kMaxHistogramBuckets] = {};  // bucket i holds (limits[i-1], limits[i]]
};
void histogram_counts(const StatsInput& x, const HistogramSpec& h, unsigned long long* counts, cudaStream_t stream);

}  // namespace athanor::cuda
