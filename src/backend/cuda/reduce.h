#pragma once
// Sums over any subset of a strided tensor's dims (sum, mean, the bias gradient, the
// broadcast add's backward): out[o] = scale Σ_r x[kept(o) + reduced(r)], accumulated in f64
// in a fixed order (strided_index.h's reduce_chunks: each chunk's elements in index order,
// then the chunks of an output in chunk order), so the result is the same bits every run, with no
// atomics. x in f32, bf16 or f16 (read in place at its strides); out contiguous over the
// kept dims, in f32, bf16 or f16, rounded once from f64. f64 x sums into an f64 out.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "athanor/core/dtype.h"
#include "backend/cuda/strided_index.h"

namespace athanor::cuda {

struct ReduceSumArgs {
  const void* x = nullptr;
  DType x_dtype = DType::f32;
  int kept_ndim = 0, red_ndim = 0;
  int64_t kept_sizes[kMaxIndexDims] = {}, kept_strides[kMaxIndexDims] = {};
  int64_t red_sizes[kMaxIndexDims] = {}, red_strides[kMaxIndexDims] = {};
  double scale = 1.0;
  void* out = nullptr;
  DType out_dtype = DType::f32;
};

// Doubles of scratch reduce_sum needs for these sizes.
int64_t reduce_sum_scratch(int64_t outputs, int64_t reduced);
void reduce_sum(const ReduceSumArgs& args, double* scratch, cudaStream_t stream);

// The sum's adjoint in f64: out (contiguous over `sizes`) = scale g[i at g_strides] (stride 0 on
// the broadcast dims): the backward of an f64 sum or mean, with the scale applied in f64.
struct BroadcastArgs {
  int ndim = 0;
  int64_t sizes[kMaxIndexDims] = {}, g_strides[kMaxIndexDims] = {};
};
void broadcast_scale(const double* g, const BroadcastArgs& b, double scale, double* out, cudaStream_t stream);

}  // namespace athanor::cuda
