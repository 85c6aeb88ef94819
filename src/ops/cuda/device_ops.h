#pragma once
// The CUDA forwards' building blocks on tensors (over src/backend/cuda/pointwise.h and
// reduce.h): a pointwise op over broadcast, strided inputs of mixed 16/32-bit dtypes; a
// deterministic sum over any dims; casts. Every result is a new contiguous tensor on the
// inputs' device, computed on its compute stream; nothing synchronises.
#include <initializer_list>
#include <vector>

#include "athanor/core/tensor.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/pointwise.h"

namespace athanor::detail {

// The floating dtypes the CUDA pointwise and reduction kernels read and write.
bool cuda_pointwise_dtype(DType d);
// "not yet supported on cuda" unless t is f32, bf16 or f16 (named `name` in the error).
void check_cuda_dtype(const char* op, const Tensor& t, const char* name);
// The same for the kernels that also take f64 (GEMM, softmax, cross-entropy, sums, embedding,
// attention, conv and pooling, rope): f32, bf16, f16 or f64.
void check_cuda_dtype_or_f64(const char* op, const Tensor& t, const char* name);

// y = op(inputs broadcast to `shape`) in `out_dtype` (f32, f64, bf16, f16; the math in f64
// when any of them is f64); alpha: scale's and rsqrt_add's constant, rounded to f32 when the
// math is f32.
Tensor cuda_pointwise(cuda::PointwiseOp op, const std::vector<Tensor>& inputs, const Shape& shape, DType out_dtype,
                      double alpha = 1.0);
// Dropout's mask over x (its keep bits from Philox (seed, offset)), kept elements times `scale`.
Tensor cuda_dropout_mask(const Tensor& x, uint64_t seed, uint64_t offset, uint32_t threshold, double scale);
// scale Σ x over `dims` (sorted, unique, wrapped) with keepdim semantics, in `out_dtype`.
Tensor cuda_sum_dims(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, double scale, DType out_dtype);
// C [m, n] = op(A) op(B) (+ bias, epilogue) on cuBLASLt, A, B, C contiguous row-major on cuda:dev
// (batch > 1: strided-batched at m k, k n, m n); C in f32 from 16-bit A, B when c_f32. TF32 off.
void cuda_gemm(int dev, DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& b,
               const Tensor& c, const Tensor& bias = Tensor(), int64_t batch = 1,
               cuda::GemmEpilogue epi = cuda::GemmEpilogue::none, bool c_f32 = false);
// t as a contiguous tensor of `dtype` on its device (t itself when it already is one): a
// same-dtype copy through core's copy (the bits, any dtype), a conversion through the pointwise
// kernel (f32, bf16, f16, f64).
Tensor cuda_as(const Tensor& t, DType dtype);

}  // namespace athanor::detail
