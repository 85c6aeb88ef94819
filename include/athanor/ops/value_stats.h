#pragma once
// Statistics of tensors for the observers (the trainer's per-layer norms, activation
// statistics, histograms, update ratios): computed where the tensor lives, so a CUDA tensor
// is read on the device and only a handful of doubles per tensor come back to the host (one
// read for a whole list). Not ops of the registry: no autograd, no dispatch, no result
// tensor; a CPU tensor is read by a plain loop in f64.
// Every function takes floating tensors of any dtype and layout; a CUDA tensor of a dtype or
// rank the device kernels do not read (f64, > 8 dims) is copied to the host first.
#include <cstdint>
#include <limits>
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor {

// Which values count as saturated (TensorStats::saturated).
enum class Saturation { none, sigmoid /* v < 0.01 || v > 0.99 */, tanh /* |v| > 0.99 */ };

struct TensorStats {
  int64_t numel = 0;
  // Over the finite values only:
  double finite = 0, sum = 0, sum_squares = 0, absmax = 0, zeros = 0, saturated = 0;
  double min = std::numeric_limits<double>::infinity(), max = -std::numeric_limits<double>::infinity();
  // The non-finite values:
  double nans = 0, infs = 0;
  // sqrt(Σ v^2) over every value: NaN when a value is NaN, inf when one is ±inf.
  double l2_norm() const;
};

// The statistics of each tensor (all on one device), in order; one device-to-host read.
std::vector<TensorStats> value_stats_list(const std::vector<Tensor>& xs, Saturation sat = Saturation::none);
TensorStats value_stats(const Tensor& x, Saturation sat = Saturation::none);

// Σ (b[i] - a[i])^2 over every element (non-finite values included), for each pair of
// tensors of one shape and dtype (all on one device); one device-to-host read.
std::vector<double> squared_distances(const std::vector<Tensor>& a, const std::vector<Tensor>& b);

// The units of x that fired (some element > 0), OR-ed into `fired`: a u8 tensor [units] on
// x's device (made, zeroed, when undefined). Units: the last dim, or dim 1 of a 4-D (NCHW)
// x. Nothing is read back.
void accumulate_fired_units(const Tensor& x, Tensor& fired);

// The finite values of x counted into limits.size() buckets, bucket i holding
// (limits[i-1], limits[i]] (the first also min itself): ceil((v - min) / width) - 1 corrected
// against the limits, as train/step_observer.cpp's histogram() does; width > 0.
std::vector<double> histogram_counts(const Tensor& x, double min, double width, const std::vector<double>& limits);

}  // namespace athanor
