#pragma once
// What the pointwise kernel's gpu tests share (test_gpu_pointwise.cpp: the plan and the
// vectorized kernel; test_gpu_pointwise_f64.cpp: f64): 1-D calls of every op, the op constants,
// input values with the special cases, and a bitwise comparison of tensors that lets NaN match NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "athanor/core/tensor.h"
#include "backend/cuda/pointwise.h"

namespace athanor::pointwise_test {

using cuda::PointwiseArgs;
using cuda::PointwiseOp;

inline constexpr int kOps = static_cast<int>(PointwiseOp::silu_backward) + 1;  // the last op of the enum
inline PointwiseOp op_at(int k) { return static_cast<PointwiseOp>(k); }
inline const DType kFloat3[] = {DType::f32, DType::bf16, DType::f16};

// Dropout at p = 0.5 (a shifted index flips half the keep bits), at a nonzero Philox offset.
inline constexpr uint64_t kSeed = 20261127, kOffset = 777;
inline constexpr uint32_t kThreshold = 1u << 23;

inline void set_constants(PointwiseArgs& a) {
  a.alpha = a.op == PointwiseOp::scale ? 0.3 : a.op == PointwiseOp::dropout ? 2.0 : 1e-5;
  a.seed = kSeed, a.offset = kOffset, a.threshold = kThreshold;
}

// A 1-D call over n contiguous elements (the pointers set by the caller).
inline PointwiseArgs args_1d(PointwiseOp op, int64_t n, DType in0, DType in1, DType out) {
  PointwiseArgs a;
  a.op = op;
  a.ndim = 1;
  a.sizes[0] = n;
  a.n_in = cuda::pointwise_arity(op);
  for (int k = 0; k < a.n_in; ++k) {
    a.in[k].dtype = k == 0 ? in0 : in1;
    a.in[k].strides[0] = 1;
    a.in[k].contiguous = true;
  }
  a.out_dtype = out;
  set_constants(a);
  return a;
}

// The same bits element by element, except that a NaN matches any NaN: the device's conversions
// and arithmetic give the canonical NaN where the CPU keeps the payload.
inline ::testing::AssertionResult same_bits_or_nan(const Tensor& got_t, const Tensor& want_t) {
  const Tensor got = got_t.cpu().contiguous(), want = want_t.cpu().contiguous();
  if (got.dtype() != want.dtype() || got.sizes() != want.sizes())
    return ::testing::AssertionFailure() << got.describe() << " vs " << want.describe();
  const std::vector<double> gv = got.to_vector(), wv = want.to_vector();
  const std::size_t es = dtype_size(got.dtype());
  const auto* g = static_cast<const uint8_t*>(got.raw_data());
  const auto* w = static_cast<const uint8_t*>(want.raw_data());
  for (std::size_t i = 0; i < gv.size(); ++i) {
    if (std::memcmp(g + i * es, w + i * es, es) == 0 || (std::isnan(gv[i]) && std::isnan(wv[i]))) continue;
    uint64_t gb = 0, wb = 0;
    std::memcpy(&gb, g + i * es, es);
    std::memcpy(&wb, w + i * es, es);
    return ::testing::AssertionFailure() << "element " << i << ": got " << gv[i] << " (bits 0x" << std::hex << gb
                                         << "), want " << std::dec << wv[i] << " (bits 0x" << std::hex << wb << ")";
  }
  return ::testing::AssertionSuccess();
}

// Host values of input slot `slot`: uniform in [-3, 3], with ±0, ±inf, NaN, subnormals of
// f32 and of the 16-bit types, and large values every few elements.
inline std::vector<float> input_values(int64_t n, int slot) {
  std::mt19937 g(1234u + static_cast<unsigned>(slot));
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 1e-40f, -3e-39f, 6e-8f, 3e-5f, 70000.0f, -1e30f, 1.0f};
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = i % 61 == 17 ? specials[(i / 61) % 12] : d(g);
  return v;
}

}  // namespace athanor::pointwise_test
