#pragma once
// Element conversion between any two dtypes' C++ types. Low-precision targets
// round to nearest even (via f32); bool is "non-zero".
#include <type_traits>

#include "athanor/core/half.h"

namespace athanor {

template <class T> inline constexpr bool is_half_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;
// f32, f64, bf16, f16: the types a floating dispatch branch must handle.
template <class T> inline constexpr bool is_float_type_v = std::is_floating_point_v<T> || is_half_v<T>;

template <class D, class S> inline D cast_value(S v) {
  if constexpr (std::is_same_v<D, S>) {
    return v;
  } else if constexpr (is_half_v<D>) {
    return D(static_cast<float>(v));
  } else if constexpr (std::is_same_v<D, bool>) {
    return static_cast<float>(v) != 0.0f;
  } else if constexpr (is_half_v<S>) {
    return static_cast<D>(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}

}  // namespace athanor
