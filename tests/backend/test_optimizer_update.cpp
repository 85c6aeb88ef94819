// The optimizers' f32 loops (backend/cpu/optimizer_update.h) give the same bits at every ISA
// level: the AVX-512 passes and the avx2 level's scalar loops round each formula the same
// way (explicit FMAs where the vector code fuses, every other product rounded on its own).
// So a run's trajectory does not depend on which server it runs on. The gradient norm's f64
// sum of squares is summed in another order at avx2 and is compared to a tolerance.
#include <cmath>
#include <cstring>
#include <vector>

#include "athanor/core/half.h"
#include "athanor/core/rng.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/optimizer_update.h"
#include "test_util.h"

namespace athanor {
namespace {

std::vector<float> values(int64_t n, uint64_t seed, float scale, float offset = 0.0f) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    const auto w = philox4x32(seed, static_cast<uint64_t>(i));
    v[i] = offset + scale * (static_cast<float>(w[0] >> 8) / 16777216.0f - 0.5f);
  }
  return v;
}

struct State {
  std::vector<float> w, b, m, v;
  std::vector<uint16_t> copy;
};

// Three steps of each update on n values (n off the 16-lane blocks: the masked tail too), with
// and without a bf16 / f16 copy and a folded clip coefficient.
State run_updates(int64_t n, DType copy_dtype, double grad_scale) {
  State s{values(n, 1, 2.0f), values(n, 2, 0.1f), values(n, 3, 0.01f), values(n, 4, 0.001f, 0.001f), {}};
  s.copy.assign(n, 0);
  const std::vector<float> g = values(n, 5, 0.5f);
  for (int step = 0; step < 3; ++step) {
    cpu::SgdConsts sk{0.05f, 0.01f, 0.9f, 0.8f, step == 1, step == 0, grad_scale};
    cpu::sgd_f32(s.w.data(), g.data(), s.b.data(), n, sk, s.copy.data(), copy_dtype);
    cpu::AdamConsts ak{0.9f, 0.999f, 1e-8f, 0.01f, 1e-3f * (step + 1), 1.0f / std::sqrt(1.0f - 0.999f), 1.0f - 1e-5f,
                       step == 2, grad_scale};
    cpu::adam_f32(s.w.data(), g.data(), s.m.data(), s.v.data(), n, ak, s.copy.data(), copy_dtype);
  }
  cpu::scale_f32(s.w.data(), n, 0.73);
  return s;
}

TEST(OptimizerUpdate, SameBitsAtEveryLevel) {
  const std::vector<cpu::Isa> levels = cpu::isa_supported_levels();
  for (DType copy : {DType::bf16, DType::f16})
    for (double scale : {1.0, 0.37}) {
      SCOPED_TRACE(std::string(dtype_name(copy)) + " copy, grad_scale " + std::to_string(scale));
      State want;
      {
        const cpu::ScopedIsa top(levels.back());
        want = run_updates(1000 + 7, copy, scale);
      }
      for (const cpu::Isa level : levels) {
        SCOPED_TRACE(cpu::isa_name(level));
        const cpu::ScopedIsa at(level);
        const State got = run_updates(1000 + 7, copy, scale);
        EXPECT_EQ(std::memcmp(got.w.data(), want.w.data(), want.w.size() * 4), 0);
        EXPECT_EQ(std::memcmp(got.b.data(), want.b.data(), want.b.size() * 4), 0);
        EXPECT_EQ(std::memcmp(got.m.data(), want.m.data(), want.m.size() * 4), 0);
        EXPECT_EQ(std::memcmp(got.v.data(), want.v.data(), want.v.size() * 4), 0);
        EXPECT_EQ(got.copy, want.copy);
        std::vector<uint16_t> narrowed(want.w.size());
        cpu::narrow_f32(want.w.data(), narrowed.data(), static_cast<int64_t>(narrowed.size()), copy);
        for (size_t i = 0; i < narrowed.size(); ++i)
          ASSERT_EQ(narrowed[i], copy == DType::bf16 ? float_to_bf16_bits(want.w[i]) : float_to_f16_bits(want.w[i])) << i;
        // The norm's sum of squares: f64 sums in another order, so to f64 rounding.
        double exact = 0;
        for (float x : want.w) exact += static_cast<double>(x) * x;
        EXPECT_NEAR(cpu::sum_squares_f32(want.w.data(), static_cast<int64_t>(want.w.size())), exact, 1e-12 * exact);
      }
    }
}

}  // namespace
}  // namespace athanor
