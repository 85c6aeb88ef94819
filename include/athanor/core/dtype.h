#pragma once
// Element types. Floating: f32, f64, bf16, f16. Integral: i32, i64, u8, boolean.
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "athanor/core/half.h"

namespace athanor {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, u8, boolean };

std::size_t dtype_size(DType dt);
const char* dtype_name(DType dt);
DType dtype_from_name(const std::string& name);  // "f32", "float32", "bf16", … ; throws on unknown
bool is_floating(DType dt);
inline bool is_low_precision(DType dt) { return dt == DType::bf16 || dt == DType::f16; }
// NumPy/PyTorch-style promotion of two tensor dtypes (bool < integers < floats; bf16+f16 -> f32).
DType promote_types(DType a, DType b);

template <class T> struct dtype_traits;
template <> struct dtype_traits<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_traits<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_traits<bfloat16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_traits<float16> { static constexpr DType value = DType::f16; };
template <> struct dtype_traits<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_traits<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_traits<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_traits<bool> { static constexpr DType value = DType::boolean; };
template <class T> inline constexpr DType dtype_of = dtype_traits<T>::value;

// Calls fn.template operator()<T>() with the C++ type of `dt`:
//   dispatch(dt, [&]<class T>() { ... });
template <class Fn> decltype(auto) dispatch(DType dt, Fn&& fn) {
  switch (dt) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::bf16: return fn.template operator()<bfloat16>();
    case DType::f16: return fn.template operator()<float16>();
    case DType::i32: return fn.template operator()<int32_t>();
    case DType::i64: return fn.template operator()<int64_t>();
    case DType::u8: return fn.template operator()<uint8_t>();
    case DType::boolean: return fn.template operator()<bool>();
  }
  return fn.template operator()<float>();  // unreachable
}

}  // namespace athanor
