#pragma once
// The inverted-dropout kernel of ops/dropout.cpp on a contiguous buffer: element i (its
// row-major index) is kept iff (word >> 8) >= threshold, word = philox4x32(seed, offset +
// i / 4)[i % 4]; kept elements are multiplied by scale, the others become 0 (x may be y).
// The mask depends only on (seed, offset, i): the same for any thread count and level.
#include <cstdint>

namespace athanor::cpu {

// T: float, double, bfloat16, float16 (16-bit values are scaled in f32 and rounded once).
template <class T>
void dropout_apply(const T* x, T* y, int64_t n, uint64_t seed, uint64_t offset, uint32_t threshold, double scale);

}  // namespace athanor::cpu
