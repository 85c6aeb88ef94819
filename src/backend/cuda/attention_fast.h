#pragma once
// The fast CUDA flash attention for bf16/f16 (FlashAttention-2's forward): the same contract as
// attention.h (operands, AttentionLayout strides, GQA, causal top-left aligned, lse f32 [B, H, Tq]
// in natural log), so a forward by either implementation pairs with a backward by the other.
//
// Invariants of the fast forward (attention_fast.cu):
//  - one block of 4 warps per (b, h, query tile of 64 rows), each warp owning 16 rows end to
//    end; key/value tiles of 64 rows stream through shared memory, double-buffered with
//    cp.async (the causal grid runs the longest query tiles first);
//  - S = Q K^T, the online softmax statistics and the O accumulator live in registers
//    (mma.sync m16n8k16, f32 accumulation); P is rounded to the input type in registers and fed
//    as the A operand of P V (no shared-memory round trip);
//  - causal key tiles wholly above the diagonal are skipped, the diagonal tiles masked;
//  - taken only for bf16/f16, D == Dv in {64, 128}, and operands whose pointers and strides
//    allow 16-byte loads (cp.async); anything else runs on attention.cu's kernels.
// The fast backward (FlashAttention-2's, deterministic: no atomics) has a dK/dV pass with the
// warps owning 16 keys and computing S^T = K Q^T, dP^T = V dO^T in registers (so P^T and dS^T
// are the A operands of dV += P^T dO, dK += dS^T Q), and a dQ pass with the warps owning 16
// query rows (dQ += dS K), after a Delta = rowsum(dO * O) kernel; attention_fast.cu.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "athanor/core/dtype.h"
#include "backend/cuda/attention.h"

namespace athanor::cuda {

// Which implementation attention_forward / attention_backward run for bf16/f16 (f32 is always
// the reference): fast_fwd is the fast forward with the reference backward (the fallback should
// the fast backward misbehave somewhere).
enum class AttentionImpl { reference, fast, fast_fwd };

// Parses ATHANOR_CUDA_ATTENTION's value: null or "" -> fast (the default since its first GPU run:
// every GpuAttentionFast test passed on an H200, 3.5x the reference kernel's forward+backward,
// bench/RESULTS.md), "fast", "reference", "fast_fwd"; anything else throws (naming the variable
// and the accepted values).
AttentionImpl parse_attention_impl(const char* value);
const char* attention_impl_name(AttentionImpl impl);
// The process's choice: set_attention_impl's if called, else ATHANOR_CUDA_ATTENTION read once.
AttentionImpl attention_impl();
// Overrides the environment for the rest of the process (benchmarks and tests compare both).
void set_attention_impl(AttentionImpl impl);

// Whether the fast forward takes this call (dtype, head dims, 16-byte alignment of the
// pointers and strides); false means attention.cu's kernels run it.
bool attention_fast_supported(const void* q, const void* k, const void* v, const void* o, const AttentionDims& d,
                              const AttentionLayout& layout, DType dtype);

// Whether the fast backward takes this call: attention_fast_supported's conditions, and dO
// (layout of o) and dq, dk, dv (layouts of q, k, v) 16-byte aligned too.
bool attention_fast_backward_supported(const void* q, const void* k, const void* v, const void* o, const void* dout,
                                       const void* dq, const void* dk, const void* dv, const AttentionDims& d,
                                       const AttentionLayout& layout, DType dtype);

// The fast forward; the caller has run attention_check and attention_fast_supported.
void attention_fast_forward(const void* q, const void* k, const void* v, void* o, float* lse, const AttentionDims& d,
                            const AttentionLayout& layout, bool causal, double scale, DType dtype,
                            cudaStream_t stream);

// The fast backward (attention.h's attention_backward contract: the same workspace, dq, dk, dv
// fully overwritten, deterministic); the caller has run attention_check and
// attention_fast_backward_supported.
void attention_fast_backward(const void* q, const void* k, const void* v, const void* o, const void* dout,
                             const float* lse, void* dq, void* dk, void* dv, const AttentionDims& d,
                             const AttentionLayout& layout, bool causal, double scale, DType dtype, void* workspace,
                             cudaStream_t stream);

}  // namespace athanor::cuda
