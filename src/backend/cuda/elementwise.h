#pragma once
// Elementwise CUDA kernels, casts and the embedding lookup: plain functions on contiguous
// device buffers, launched on `stream`.
//
// Invariants:
//  - casts f32 -> bf16/f16 round to nearest even with denormals kept, exactly as the CPU's
//    cast() (core/half.h); widening is exact;
//  - the embedding backward is deterministic without float atomics: each thread owns one
//    column of a group of dW rows and adds the tokens' rows in token order, so dW is the same
//    bits every run (and the CPU's order of additions, row by row).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "athanor/core/dtype.h"

namespace athanor::cuda {

struct DeviceErrorRecord;  // device_error.h

// y = x converted; from/to in {f32, bf16, f16} (same dtype: a copy).
void cast(const void* x, DType from, void* y, DType to, int64_t n, cudaStream_t stream);
void add(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream);   // y = a + b
void mul(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream);   // y = a * b
void scale(const float* x, float alpha, float* y, int64_t n, cudaStream_t stream);    // y = alpha x
// GELU, tanh approximation (GPT-2's): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_tanh_forward(const float* x, float* y, int64_t n, cudaStream_t stream);
void gelu_tanh_backward(const float* dy, const float* x, float* dx, int64_t n, cudaStream_t stream);

// out[n, :] = weight[idx[n], :] for n < N, rows of `dim` elements of `dtype` (f32, bf16, f16:
// copied bit for bit; f64 too), the table `num` rows. An id outside [0, num) is validated on the
// device: recorded in `err` (device_error.h: raised at the next read from the device, no host
// sync here) and its row left zero.
void embedding_forward(const void* weight, DType dtype, const int64_t* idx, void* out, int64_t N, int64_t num,
                       int64_t dim, DeviceErrorRecord* err, cudaStream_t stream);
// dweight[idx[n], :] += f32(dy[n, :]) in n order into an f32 [num, dim] buffer (dy f32, bf16 or
// f16); rows n with idx[n] == padding_idx or out of range are skipped.
void embedding_backward(const void* dy, DType dy_dtype, const int64_t* idx, float* dweight, int64_t N, int64_t num,
                        int64_t dim, int64_t padding_idx, cudaStream_t stream);
// The same for an f64 table: f64 dy summed in f64 (same order) into an f64 [num, dim] buffer.
void embedding_backward(const double* dy, const int64_t* idx, double* dweight, int64_t N, int64_t num, int64_t dim,
                        int64_t padding_idx, cudaStream_t stream);

}  // namespace athanor::cuda
