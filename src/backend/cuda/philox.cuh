#pragma once
// Philox4x32-10 on the device: the one definition in athanor/core/philox.h (shared with the
// CPU's philox4x32, core/rng.cpp), so a kernel draws the CPU's numbers for the same
// (seed, counter) by construction.
#include <cstdint>

#include "athanor/core/philox.h"

namespace athanor::cuda {

__device__ inline uint4 philox4x32_device(uint64_t seed, uint64_t counter) {
  const PhiloxBlock b = philox4x32_block(seed, counter);
  return make_uint4(b.w[0], b.w[1], b.w[2], b.w[3]);
}

}  // namespace athanor::cuda
