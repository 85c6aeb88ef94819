#pragma once
// For the kernel files compiled once per instruction-set level (isa.h). CMake lists
// them in ATHANOR_ISA_KERNELS and compiles each three times, with ATHANOR_ISA_LEVEL = 1
// (avx2), 2 (avx512) and 3 (avx512_bf16); every pass is built with the portable
// flags (-march=x86-64-v3), and only the code between ATHANOR_ISA_BEGIN and
// ATHANOR_ISA_END is compiled for the pass's level (#pragma GCC target). That code
// lives in the level's own namespace, athanor::cpu::avx2 / avx512 / avx512_bf16, so the
// three passes never define the same symbol, and no inline function or template
// instantiation with AVX-512 code can be picked by the linker for a caller at
// another level. Templates and inline functions defined outside the region (std::,
// core headers) keep the baseline target: inlined into a kernel they are compiled
// for its level, their out-of-line copies stay x86-64-v3.
//
// GCC does not update __AVX512F__ and friends inside a target region in C++ (the file
// is preprocessed before it is parsed), so kernels test ATHANOR_CPU_AVX512 and
// ATHANOR_CPU_AVX512BF16, which follow the pass's level.
//
// A kernel file:
//   ATHANOR_ISA_BEGIN           namespace athanor::cpu::<level> { ... kernels ... }
//   ATHANOR_ISA_END
//   #if ATHANOR_ISA_PRIMARY     compiled once (in the avx2 pass), in namespace athanor::cpu:
//                               the references, anything level-independent, and the public
//                               entry points, each a dispatch to the active level:
//     ATHANOR_ISA_DECLARE(template <class T> void f(const T*, int64_t);)
//     template <class T> void f(const T* x, int64_t n) { ATHANOR_ISA_CALL(f<T>, x, n); }
//   #endif
#include <immintrin.h>

#include "backend/cpu/isa.h"

#if !defined(ATHANOR_ISA_LEVEL)
#error "backend/cpu/isa_kernel.h: this file must be listed in ATHANOR_ISA_KERNELS (CMakeLists.txt), which compiles it once per level"
#endif
#if !defined(__GNUC__) || defined(__clang__)
#error "the per-level kernels use GCC's #pragma GCC target; build athanor with g++"
#endif

#define ATHANOR_ISA_PRIMARY (ATHANOR_ISA_LEVEL == 1)
#define ATHANOR_CPU_AVX512 (ATHANOR_ISA_LEVEL >= 2)
#define ATHANOR_CPU_AVX512BF16 (ATHANOR_ISA_LEVEL >= 3)

// GCC 12 reports the deliberately undefined pass-through operands inside its own AVX-512
// intrinsics (_mm512_undefined_*, PR 105593) as (maybe-)uninitialized once they are
// inlined into a kernel: a known false positive, silenced inside the kernel regions only.
#define ATHANOR_ISA_DIAGNOSTICS_                                 \
  _Pragma("GCC diagnostic push")                                  \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")     \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")

#if ATHANOR_ISA_LEVEL == 1
#define ATHANOR_ISA_NS avx2
#define ATHANOR_ISA_TARGET_PUSH_ _Pragma("GCC push_options")
#elif ATHANOR_ISA_LEVEL == 2
#define ATHANOR_ISA_NS avx512
#define ATHANOR_ISA_TARGET_PUSH_ \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512cd,avx512dq,avx512vl\")")
#elif ATHANOR_ISA_LEVEL == 3
#define ATHANOR_ISA_NS avx512_bf16
#define ATHANOR_ISA_TARGET_PUSH_ \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512cd,avx512dq,avx512vl,avx512bf16\")")
#else
#error "ATHANOR_ISA_LEVEL must be 1, 2 or 3"
#endif

#define ATHANOR_ISA_BEGIN ATHANOR_ISA_TARGET_PUSH_ ATHANOR_ISA_DIAGNOSTICS_ namespace athanor::cpu::ATHANOR_ISA_NS {
#define ATHANOR_ISA_END \
  }                     \
  _Pragma("GCC diagnostic pop") _Pragma("GCC pop_options")

// Declares the given kernels in each level's namespace (where the other passes define them).
#define ATHANOR_ISA_DECLARE(...)  \
  namespace avx2 {                \
  __VA_ARGS__                     \
  }                               \
  namespace avx512 {              \
  __VA_ARGS__                     \
  }                               \
  namespace avx512_bf16 {         \
  __VA_ARGS__                     \
  }

// Calls fn(args...) at the active level and returns its result (a statement).
#define ATHANOR_ISA_CALL(fn, ...)                                              \
  switch (::athanor::cpu::active_isa()) {                                      \
    case ::athanor::cpu::Isa::avx512_bf16: return avx512_bf16::fn(__VA_ARGS__); \
    case ::athanor::cpu::Isa::avx512: return avx512::fn(__VA_ARGS__);           \
    case ::athanor::cpu::Isa::avx2: break;                                     \
  }                                                                            \
  return avx2::fn(__VA_ARGS__)
