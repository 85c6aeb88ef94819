#pragma once
// Strided copies, fills and in-place adds on one device: what core's tensor copies
// (copy_into, contiguous, clone), fill_ and autograd's gradient accumulation need on CUDA
// tensors (core/device_hooks.h). Launched on `stream`; nothing here synchronises.
//
// Invariants:
//  - up to kMaxCopyDims dims; a 0 stride in src broadcasts; element offsets are int64;
//  - a copy between f32, bf16 and f16 converts through f32 with round-to-nearest-even (the
//    CPU's cast, core/half.h); other dtypes copy only to their own dtype (same bits);
//  - add_inplace computes in f32 (f64 for f64) and rounds once, as the CPU's add_into; with
//    the candidate pointwise_vectorized (candidates.h) and 16-byte aligned buffers it reads
//    and writes 16 bytes at a time, with the same bits.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "athanor/core/dtype.h"

namespace athanor::cuda {

inline constexpr int kMaxCopyDims = 8;
struct StridedLayout {
  int ndim = 0;
  int64_t sizes[kMaxCopyDims] = {};
  int64_t dst_strides[kMaxCopyDims] = {};
  int64_t src_strides[kMaxCopyDims] = {};
};

// True when copy_strided can convert `from` to `to` on the device.
bool can_copy(DType from, DType to);
void copy_strided(void* dst, DType dst_dtype, const void* src, DType src_dtype, const StridedLayout& layout, int64_t n,
                  cudaStream_t stream);
// Every element of dst (layout's dst strides) set to the `elem_bytes`-wide bit pattern.
void fill_pattern(void* dst, int elem_bytes, uint64_t pattern, const StridedLayout& layout, int64_t n, cudaStream_t stream);
// acc[i] += g[i] for i < n; dtype in {f32, f64, bf16, f16}.
void add_inplace(void* acc, const void* g, DType dtype, int64_t n, cudaStream_t stream);

}  // namespace athanor::cuda
