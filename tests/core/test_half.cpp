// f16 and bf16 conversions (include/athanor/core/half.h): exhaustive f16
// round-trips, hand-computed expectations, and bit-for-bit agreement with the
// hardware converters (F16C `vcvtps2ph`, AVX512_BF16 `vcvtneps2bf16`) on edge
// values, every half-ulp tie, and ~1e6 random floats across all exponents.
// F16C is part of the build's x86-64-v3 baseline. AVX512_BF16 is not: its comparisons
// are compiled for it (target attribute) and run where the CPU has it; elsewhere they
// skip (missing hardware) and the hand-computed cases still pin down the rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "athanor/core/half.h"

#include <immintrin.h>

namespace athanor {
namespace {

float f(uint32_t bits) { return bits_float(bits); }
bool is_f16_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

// Edge values shared by both formats' hardware comparisons.
std::vector<float> edge_values() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {
      0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 2.0f, 3.0f, 0.1f, -0.1f, 1.0f / 3.0f,
      std::ldexp(1.0f, -24),                                            // f16 min subnormal
      std::ldexp(1.0f, -25),                                            // f16: exact tie between 0 and 2^-24 → 0
      std::nextafter(std::ldexp(1.0f, -25), 1.0f),                      // just above the tie → 2^-24
      std::nextafter(std::ldexp(1.0f, -25), 0.0f),                      // just below → 0
      std::ldexp(1.5f, -24), std::ldexp(2.5f, -24), std::ldexp(3.5f, -24),  // subnormal ties
      std::ldexp(1.0f, -14),                                            // f16 min normal
      std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25),                    // tie between max subnormal and min normal
      std::ldexp(1023.0f, -24),                                         // f16 max subnormal
      65504.0f, 65519.0f, 65519.99f, 65520.0f, 65536.0f, 1e10f, -65504.0f, -65520.0f,
      1.0f + std::ldexp(1.0f, -11), 1.0f + 3 * std::ldexp(1.0f, -11),    // f16 ties at 1
      1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8),      // bf16 ties at 1
      std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
      std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
      f(0x7f7f7fffu), f(0x7f7f8000u), f(0x7f7f8001u),                   // bf16: below/at/above the tie to inf
      inf, -inf, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
      f(0x7f800001u), f(0xff800001u), f(0x7fbfffffu), f(0x7fc00001u), f(0x7fffe000u),  // signalling / payload NaNs
  };
  return v;
}

// ~1e6 floats: half with a uniform exponent over the whole f32 range (all bit
// patterns, so NaN/inf/subnormal too), half concentrated on the f16 range.
std::vector<float> random_floats(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v;
  v.reserve(1'000'000);
  for (int i = 0; i < 500'000; ++i) v.push_back(f(rng()));
  std::uniform_int_distribution<uint32_t> exp(127 - 30, 127 + 17);
  for (int i = 0; i < 500'000; ++i) {
    const uint32_t sign = (rng() & 1u) << 31;
    v.push_back(f(sign | (exp(rng) << 23) | (rng() & 0x7fffffu)));
  }
  return v;
}

// ------------------------------------------------------------------------- f16

TEST(Half, F16AllBitPatternsRoundTrip) {
  int nans = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = f16_bits_to_float(static_cast<uint16_t>(h));
    const uint16_t back = float_to_f16_bits(x);
    if (is_f16_nan(static_cast<uint16_t>(h))) {
      ++nans;
      ASSERT_TRUE(std::isnan(x)) << std::hex << h;
      ASSERT_TRUE(is_f16_nan(back)) << std::hex << h << " -> " << back;
      // The payload and sign survive; the NaN is quieted.
      ASSERT_EQ(back, h | 0x0200u) << std::hex << h;
    } else {
      ASSERT_EQ(back, h) << std::hex << "f16 0x" << h << " -> " << x << " -> 0x" << back;
    }
  }
  EXPECT_EQ(nans, 2 * 1023);
}

TEST(Half, F16HandComputed) {
  struct Case { float x; uint16_t bits; };
  const Case cases[] = {
      {0.0f, 0x0000}, {-0.0f, 0x8000}, {1.0f, 0x3c00}, {-2.0f, 0xc000}, {0.5f, 0x3800},
      {65504.0f, 0x7bff}, {65519.0f, 0x7bff}, {65520.0f, 0x7c00}, {-65520.0f, 0xfc00}, {1e10f, 0x7c00},
      {std::ldexp(1.0f, -24), 0x0001},                            // min subnormal
      {std::ldexp(1.0f, -25), 0x0000},                            // tie → even (0)
      {std::nextafter(std::ldexp(1.0f, -25), 1.0f), 0x0001},
      {std::ldexp(1.5f, -24), 0x0002},                            // tie 1|2 → 2
      {std::ldexp(2.5f, -24), 0x0002},                            // tie 2|3 → 2
      {std::ldexp(1.0f, -14), 0x0400},                            // min normal
      {std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25), 0x0400},    // tie 0x3ff|0x400 → 0x400
      {1.0f + std::ldexp(1.0f, -11), 0x3c00},                     // tie → even
      {1.0f + 3 * std::ldexp(1.0f, -11), 0x3c02},                 // tie → even (up)
      {std::numeric_limits<float>::infinity(), 0x7c00}, {-std::numeric_limits<float>::infinity(), 0xfc00},
  };
  for (const Case& c : cases) EXPECT_EQ(float_to_f16_bits(c.x), c.bits) << c.x;
  EXPECT_TRUE(is_f16_nan(float_to_f16_bits(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(f16_bits_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_bits_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_bits_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(static_cast<float>(float16(0.1f)), 0.0999755859375f);
}

uint16_t hw_f16(float x) { return _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT); }

TEST(Half, F16MatchesF16COnEdgeValues) {
  for (float x : edge_values())
    EXPECT_EQ(float_to_f16_bits(x), hw_f16(x)) << std::hex << "x = " << x << " (0x" << float_bits(x) << ")";
}

TEST(Half, F16MatchesF16COnEveryHalfUlpTie) {
  // For every finite f16 h: the exact midpoint to the next f16 up, and the f32
  // neighbours of that midpoint, on both signs.
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const float lo = f16_bits_to_float(static_cast<uint16_t>(h));
    const float hi = h + 1 == 0x7c00u ? 65536.0f : f16_bits_to_float(static_cast<uint16_t>(h + 1));  // 65536: one ulp past max
    const float mid = lo + (hi - lo) / 2;  // exact in f32
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)})
      for (float s : {x, -x})
        ASSERT_EQ(float_to_f16_bits(s), hw_f16(s)) << std::hex << "x = " << s << " (0x" << float_bits(s) << ")";
  }
}

TEST(Half, F16MatchesF16COnRandomFloats) {
  int bad = 0;
  for (float x : random_floats(1)) {
    if (float_to_f16_bits(x) != hw_f16(x) && ++bad <= 5)
      ADD_FAILURE() << std::hex << "x = " << x << " (0x" << float_bits(x) << "): athanor 0x" << float_to_f16_bits(x)
                    << ", F16C 0x" << hw_f16(x);
  }
  EXPECT_EQ(bad, 0);
}

TEST(Half, F16ToFloatMatchesF16COnAllBitPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float sw = f16_bits_to_float(static_cast<uint16_t>(h));
    const float hw = _cvtsh_ss(static_cast<unsigned short>(h));
    if (is_f16_nan(static_cast<uint16_t>(h))) {
      // Both are NaN with the same sign and payload. (F16C also sets the f32
      // quiet bit on a signalling f16 NaN; the software conversion keeps it a
      // signalling f32 NaN, which any arithmetic quiets anyway.)
      ASSERT_TRUE(std::isnan(sw)) << std::hex << h;
      ASSERT_EQ(float_bits(sw) | 0x00400000u, float_bits(hw)) << std::hex << h;
    } else {
      ASSERT_EQ(float_bits(sw), float_bits(hw)) << std::hex << h;
    }
  }
}

// ------------------------------------------------------------------------ bf16

TEST(Half, BF16HandComputed) {
  struct Case { uint32_t x; uint16_t bits; const char* what; };
  const Case cases[] = {
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0"},
      {0x3f800000u, 0x3f80, "1"},
      {0x3f808000u, 0x3f80, "1 + 2^-8: tie -> even (down)"},
      {0x3f818000u, 0x3f82, "tie -> even (up)"},
      {0x3f808001u, 0x3f81, "just above the tie"},
      {0x3f807fffu, 0x3f80, "just below the tie"},
      {0x40490fdbu, 0x4049, "pi -> 3.140625"},
      {0x7f7f7fffu, 0x7f7f, "below the tie to inf -> max finite bf16"},
      {0x7f7f8000u, 0x7f80, "max finite bf16 + half ulp: tie -> even = inf"},
      {0x7f7fffffu, 0x7f80, "FLT_MAX -> inf"},
      {0xff7fffffu, 0xff80, "-FLT_MAX -> -inf"},
      {0x7f800000u, 0x7f80, "inf"},
      {0xff800000u, 0xff80, "-inf"},
      {0x7fc00000u, 0x7fc0, "qNaN"},
      {0x7f800001u, 0x7fc0, "sNaN with its payload in the low half: quieted, still NaN"},
      {0xffa00000u, 0xffe0, "negative sNaN: quieted, sign and payload kept"},
      {0x00010000u, 0x0001, "smallest bf16 subnormal"},
      {0x00008000u, 0x0000, "subnormal tie -> even (0)"},
      {0x00018000u, 0x0002, "subnormal tie -> even (2)"},
      {0x00008001u, 0x0001, "subnormal above the tie"},
      {0x007fffffu, 0x0080, "largest f32 subnormal rounds up to the smallest normal"},
  };
  for (const Case& c : cases) EXPECT_EQ(float_to_bf16_bits(f(c.x)), c.bits) << c.what;
  for (uint32_t b = 0; b < 65536; ++b) {  // bf16 -> f32 -> bf16 is exact for all non-NaN patterns
    const bool nan = (b & 0x7f80u) == 0x7f80u && (b & 0x7fu);
    const uint16_t back = float_to_bf16_bits(bf16_bits_to_float(static_cast<uint16_t>(b)));
    ASSERT_EQ(back, nan ? (b | 0x40u) : b) << std::hex << b;
  }
  EXPECT_EQ(static_cast<float>(bfloat16(3.0f)), 3.0f);
}

__attribute__((target("avx512f,avx512vl,avx512bf16"))) uint16_t hw_bf16(float x) {
  const __m128bh r = _mm_cvtneps_pbh(_mm_set1_ps(x));
  uint16_t out[8];
  std::memcpy(out, &r, sizeof(out));
  return out[0];
}
bool is_f32_subnormal(float x) { return (float_bits(x) & 0x7f800000u) == 0 && (float_bits(x) & 0x7fffffu) != 0; }

// vcvtneps2bf16 always treats subnormal inputs as zero (it ignores MXCSR.DAZ);
// athanor (like PyTorch's c10::BFloat16 on the CPU) rounds them to nearest even
// instead. So subnormals are compared with the exact RNE result, everything
// else bit for bit with the instruction.
void expect_bf16_matches_hw(float x, int* bad) {
  const uint16_t sw = float_to_bf16_bits(x);
  if (is_f32_subnormal(x)) {
    EXPECT_EQ(hw_bf16(x), float_bits(x) >> 31 << 15) << "vcvtneps2bf16 flushes subnormal inputs";
    const uint32_t u = float_bits(x), low = u & 0xffffu, keep = u >> 16;
    const uint16_t rne = static_cast<uint16_t>(keep + (low > 0x8000u || (low == 0x8000u && (keep & 1u))));
    if (sw != rne && ++*bad <= 5) ADD_FAILURE() << std::hex << "subnormal 0x" << u << ": athanor 0x" << sw << ", RNE 0x" << rne;
    return;
  }
  if (sw != hw_bf16(x) && ++*bad <= 5)
    ADD_FAILURE() << std::hex << "x = " << x << " (0x" << float_bits(x) << "): athanor 0x" << sw << ", AVX512_BF16 0x"
                  << hw_bf16(x);
}

bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vl");
}
constexpr const char* kNoBf16 = "this CPU has no AVX512_BF16 (vcvtneps2bf16) to compare with";

TEST(Half, BF16MatchesAvx512Bf16OnEdgeValues) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << kNoBf16;
  int bad = 0;
  for (float x : edge_values()) expect_bf16_matches_hw(x, &bad);
  for (uint32_t hi = 0; hi < 65536; ++hi)  // every tie and its neighbours
    for (uint32_t lo : {0x7fffu, 0x8000u, 0x8001u}) expect_bf16_matches_hw(f(hi << 16 | lo), &bad);
  EXPECT_EQ(bad, 0);
}

TEST(Half, BF16MatchesAvx512Bf16OnRandomFloats) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << kNoBf16;
  int bad = 0;
  for (float x : random_floats(2)) expect_bf16_matches_hw(x, &bad);
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace athanor
