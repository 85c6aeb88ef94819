#pragma once
// The index arithmetic of the CUDA pointwise and reduction kernels (pointwise.h, reduce.h),
// in plain C++ so the CPU tests run the very function the kernels run
// (tests/gpu/test_gpu_index.cpp emulates the kernels' loops with it).
//
// Invariants:
//  - linear index i counts row-major over `sizes` (the last dim fastest), the order of the
//    output a pointwise kernel writes contiguously;
//  - an operand's offset is Σ coord[d] stride[d] in elements; a 0 stride broadcasts;
//  - the chunking of a reduction depends on the shapes only, so the order of its additions,
//    and its bits, are the same every run.
#include <cstdint>

#if defined(__CUDACC__)
#define ATH_HOST_DEVICE __host__ __device__
#else
#define ATH_HOST_DEVICE
#endif

namespace athanor::cuda {

inline constexpr int kMaxIndexDims = 8;

// Element offset of linear index i (row-major over sizes[0..ndim)) at these strides.
ATH_HOST_DEVICE inline int64_t strided_offset(int64_t i, const int64_t* sizes, const int64_t* strides, int ndim) {
  int64_t off = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    const int64_t s = sizes[d];
    off += (i % s) * strides[d];
    i /= s;
  }
  return off;
}

// A reduction's chunking: `outputs` sums of `reduced` elements each; chunk c of output o
// adds elements c, c + chunks, c + 2 chunks, ... (< reduced; at most `chunk` of them) in that
// order, then the partials of o are added in chunk order. Interleaved, not contiguous runs:
// the threads of adjacent chunks read adjacent elements, so a sum over contiguous dims reads
// coalesced (contiguous runs of 64 put each lane of a warp on its own cache line: a 4M-element
// mean took 3 ms on an H200). Enough chunks to give ~128k threads, each at least 64 elements.
struct ReduceChunks {
  int64_t chunks = 1, chunk = 1;
};
ATH_HOST_DEVICE inline ReduceChunks reduce_chunks(int64_t outputs, int64_t reduced) {
  ReduceChunks c;
  const int64_t want = outputs >= (int64_t{1} << 17) ? 1 : ((int64_t{1} << 17) + outputs - 1) / outputs;
  const int64_t most = reduced <= 64 ? 1 : (reduced + 63) / 64;
  c.chunks = want < most ? want : most;
  if (c.chunks < 1) c.chunks = 1;
  c.chunk = reduced <= 0 ? 1 : (reduced + c.chunks - 1) / c.chunks;
  c.chunks = reduced <= 0 ? 1 : (reduced + c.chunk - 1) / c.chunk;  // no empty trailing chunk
  return c;
}

}  // namespace athanor::cuda
