#pragma once
// 16-bit floating-point storage types. Arithmetic is always done in f32; these
// types only define the bit layout and the conversions, which round to nearest
// even (RNE) as PyTorch does and as F16C does (tests/core/test_half.cpp checks
// both instructions bit for bit). One difference: AVX512_BF16's vcvtneps2bf16
// flushes f32 subnormal inputs to zero, where these conversions round them.
//   bf16: 1 sign, 8 exponent, 7 mantissa bits (the top half of an f32).
//   f16 : 1 sign, 5 exponent, 10 mantissa bits; max 65504, subnormals down to 2^-24.
// NaN stays NaN (quieted), inf stays inf, overflow rounds to inf.
#include <cstdint>
#include <cstring>

namespace athanor {

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;  // round to nearest, ties to even; carries into the exponent (→ inf) correctly
  return static_cast<uint16_t>(x >> 16);
}
inline float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

inline uint16_t float_to_f16_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u)  // inf or NaN
    return static_cast<uint16_t>(sign | (a > 0x7f800000u ? (0x7e00u | ((a >> 13) & 0x3ffu)) : 0x7c00u));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {  // below the smallest normal (2^-14): f16 subnormal or zero
    const uint32_t e = a >> 23;
    if (e < 102) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to zero (2^-25 exactly ties to 0)
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // value / 2^-24 = m >> shift
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;  // may become 0x400: the smallest normal, correctly
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = (a >> 13) - (112u << 10);  // rebias the exponent from 127 to 15
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

inline float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return bits_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return sign ? -v : v;
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float f) : bits(float_to_bf16_bits(f)) {}
  static bfloat16 from_bits(uint16_t b) { bfloat16 v; v.bits = b; return v; }
  operator float() const { return bf16_bits_to_float(bits); }
};

struct float16 {
  uint16_t bits = 0;
  float16() = default;
  explicit float16(float f) : bits(float_to_f16_bits(f)) {}
  static float16 from_bits(uint16_t b) { float16 v; v.bits = b; return v; }
  operator float() const { return f16_bits_to_float(bits); }
};

}  // namespace athanor
