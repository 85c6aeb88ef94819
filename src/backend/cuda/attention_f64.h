#pragma once
// Attention in f64 on the GPU: the exact path the f64 gradchecks run on (issue 30), not a fast
// one; attention.h's flash kernels are the 16/32-bit tensor-core path. Same contract as
// attention.h (q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv] -> o [B, H, Tq, Dv];
// rows of each operand contiguous, rows, heads and batches at AttentionLayout's strides;
// grouped-query heads; causal top-left aligned: key j <= query i), everything in double, in
// the plainest formulation:
//  - forward: one thread per query row, 64 rows of one (b, h) per block; two passes over the
//    keys: m = max_j s_ij and l = Σ_j exp(s_ij - m), lse_i = m + log l; then
//    o_i = Σ_j exp(s_ij - lse_i) v_j (no rescaling), s_ij = scale q_i . k_j;
//  - backward, the same lse / Delta = dO . O formulation as attention.h, deterministic with no
//    atomics: Delta_i = dO_i . O_i (one thread per query row); a dQ pass, one thread per query
//    row, dQ_i = scale Σ_j dS_ij k_j; a dK/dV pass, one thread per key row of a kv head, over
//    the query heads of its group and their rows in order: dV_j = Σ P_ij dO_i,
//    dK_j = scale Σ dS_ij q_i; P_ij = exp(s_ij - lse_i), dS_ij = P_ij (dO_i . v_j - Delta_i);
//  - each thread accumulates its own output row in place in global memory (zeroed first): any
//    head dims D, Dv >= 1; dq, dk, dv are fully overwritten, in the layouts of q, k, v; dO is
//    read in the layout of o. Nothing here synchronises the stream.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/attention.h"

namespace athanor::cuda {

// Checks dims (B, H, Hkv, Tq, Tk, D, Dv >= 1 where used; Hkv divides H); throws before any work.
void attention_f64_check(const AttentionDims& d, const char* op);

// lse: [B, H, Tq] contiguous doubles.
void attention_f64_forward(const double* q, const double* k, const double* v, double* o, double* lse,
                           const AttentionDims& d, const AttentionLayout& layout, bool causal, double scale,
                           cudaStream_t stream);

// delta: scratch of B H Tq doubles (Delta_i).
void attention_f64_backward(const double* q, const double* k, const double* v, const double* o, const double* dout,
                            const double* lse, double* dq, double* dk, double* dv, const AttentionDims& d,
                            const AttentionLayout& layout, bool causal, double scale, double* delta,
                            cudaStream_t stream);

}  // namespace athanor::cuda
