#include "athanor/core/rng.h"

#include <cmath>
#include <limits>

#include "athanor/core/convert.h"
#include "athanor/core/error.h"
#include "athanor/core/philox.h"

namespace athanor {

// The rounds are athanor/core/philox.h's, the kernels' too (backend/cuda/philox.cuh).
std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t counter, uint64_t stream) {
  const PhiloxBlock b = philox4x32_block(seed, counter, stream);
  return {b.w[0], b.w[1], b.w[2], b.w[3]};
}

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> l(mu_);
  state_ = {seed, 0};
}
GeneratorState Generator::state() const {
  std::lock_guard<std::mutex> l(mu_);
  return state_;
}
void Generator::set_state(const GeneratorState& s) {
  std::lock_guard<std::mutex> l(mu_);
  state_ = s;
}
GeneratorState Generator::reserve(uint64_t blocks) {
  std::lock_guard<std::mutex> l(mu_);
  GeneratorState s = state_;
  state_.offset += blocks;
  return s;
}

Generator& default_generator() {
  static Generator g(0);
  return g;
}
void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

namespace {
void check_float(const Tensor& t, const char* op) {
  ATH_CHECK(t.defined() && is_floating(t.dtype()), op, "needs a floating-point tensor, got ", t.describe());
  ATH_CHECK(t.is_contiguous(), op, "needs a contiguous tensor, got strides ", shape_str(t.strides()),
            Hint{"fill a contiguous tensor and copy it, or call contiguous() first"});
}
}  // namespace

namespace {
// The largest value of T strictly below hi: rounding lo + (hi-lo)*u to a short
// type can land on hi itself, and uniform_ promises [lo, hi).
template <class T> T largest_below(double hi) {
  T r = cast_value<T>(hi);
  for (int i = 0; i < 4 && cast_value<double>(r) >= hi; ++i) {
    if constexpr (is_half_v<T>) {
      const uint16_t b = r.bits;
      r = T::from_bits((b & 0x7fffu) == 0 ? uint16_t{0x8001u} : (b & 0x8000u) ? uint16_t(b + 1) : uint16_t(b - 1));
    } else {
      r = std::nextafter(r, -std::numeric_limits<T>::infinity());
    }
  }
  return r;
}
}  // namespace

Tensor& uniform_(Tensor& t, double lo, double hi, Generator& gen) {
  check_float(t, "uniform_");
  const int64_t n = t.numel();
  const GeneratorState s = gen.reserve(static_cast<uint64_t>((n + 3) / 4));
  dispatch(t.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
      T* d = static_cast<T*>(t.raw_data());
      const int64_t blocks = (n + 3) / 4;
      const T top = largest_below<T>(hi);
#pragma omp parallel for if (n > (1 << 15)) schedule(static)
      for (int64_t b = 0; b < blocks; ++b) {
        const auto r = philox4x32(s.seed, s.offset + b);
        for (int64_t j = 0; j < 4 && 4 * b + j < n; ++j) {
          T v = cast_value<T>(lo + (hi - lo) * static_cast<double>(uint_to_unit_float(r[j])));
          if (cast_value<double>(v) >= hi && hi > lo) v = top;
          d[4 * b + j] = v;
        }
      }
    }
  });
  t.bump_version();
  return t;
}

Tensor& normal_(Tensor& t, double mean, double std, Generator& gen) {
  check_float(t, "normal_");
  const int64_t n = t.numel();
  const int64_t blocks = (n + 1) / 2;  // one block -> two normals (Box–Muller on two uniform pairs)
  const GeneratorState s = gen.reserve(static_cast<uint64_t>(blocks));
  dispatch(t.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
      T* d = static_cast<T*>(t.raw_data());
#pragma omp parallel for if (n > (1 << 14)) schedule(static)
      for (int64_t b = 0; b < blocks; ++b) {
        const auto r = philox4x32(s.seed, s.offset + b);
        for (int j = 0; j < 2 && 2 * b + j < n; ++j) {
          // u1 in (0, 1] so the log is finite; u2 in [0, 1).
          const double u1 = 1.0 - static_cast<double>(uint_to_unit_float(r[2 * j]));
          const double u2 = static_cast<double>(uint_to_unit_float(r[2 * j + 1]));
          const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
          d[2 * b + j] = cast_value<T>(mean + std * z);
        }
      }
    }
  });
  t.bump_version();
  return t;
}

Tensor rand(const Shape& shape, const TensorOptions& opts, Generator& gen) {
  TensorOptions o = opts;
  o.requires_grad = false;
  Tensor t = empty(shape, o);
  uniform_(t, 0.0, 1.0, gen);
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor randn(const Shape& shape, const TensorOptions& opts, Generator& gen) {
  TensorOptions o = opts;
  o.requires_grad = false;
  Tensor t = empty(shape, o);
  normal_(t, 0.0, 1.0, gen);
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor randint(int64_t lo, int64_t hi, const Shape& shape, Generator& gen) {
  ATH_CHECK(hi > lo, "randint", "empty range [", lo, ", ", hi, ")");
  Tensor t = empty(shape, TensorOptions(DType::i64));
  const int64_t n = t.numel();
  const GeneratorState s = gen.reserve(static_cast<uint64_t>((n + 1) / 2));
  const uint64_t range = static_cast<uint64_t>(hi - lo);
  int64_t* d = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const auto r = philox4x32(s.seed, s.offset + i / 2);
    const uint64_t x = (static_cast<uint64_t>(r[2 * (i % 2)]) << 32) | r[2 * (i % 2) + 1];
    d[i] = lo + static_cast<int64_t>(x % range);  // bias < range / 2^64: negligible
  }
  return t;
}

}  // namespace athanor
