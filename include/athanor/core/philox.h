#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): the
// one definition of the rounds, compiled by the host compiler for the CPU (core/rng.cpp's
// philox4x32) and by nvcc for the kernels (backend/cuda/philox.cuh), so a CPU run and a
// GPU run draw identical dropout masks for the same (seed, counter) by construction.
// Plain C++ outside nvcc; __host__ __device__ under it.
//
// The 32 x 32 -> 64-bit products are written as one 64-bit multiply (nvcc emits mul.wide,
// i.e. __umulhi and the low product, from it): the same bits on both sides.
#include <cstdint>

#if defined(__CUDACC__)
#define ATHANOR_HOST_DEVICE __host__ __device__
#else
#define ATHANOR_HOST_DEVICE
#endif

namespace athanor {

struct PhiloxBlock {
  uint32_t w[4];
};

// The 4 words of block `counter` of stream `stream` under key `seed`.
ATHANOR_HOST_DEVICE inline PhiloxBlock philox4x32_block(uint64_t seed, uint64_t counter, uint64_t stream = 0) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;  // multipliers
  constexpr uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;  // Weyl key increments
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#if defined(__CUDA_ARCH__)  // the device pass only: the host compiler knows no unroll pragma
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(M0) * c0, p1 = static_cast<uint64_t>(M1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += W0;
    k1 += W1;
  }
  return {{c0, c1, c2, c3}};
}

}  // namespace athanor
