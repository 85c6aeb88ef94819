#pragma once
// cuDNN's fused flash attention (its runtime-fusion SDPA engines), forward and backward, behind
// cuda::Candidate::attention_cudnn: the contract of attention.h (q/k/v/o strided per
// AttentionLayout, causal top-left, `scale`, lse [B, H, Tq] f32 in natural log, dq/dk/dv in the
// layouts of q/k/v, dO in o's), for bf16 and f16. attention_forward / attention_backward
// (attention.cu) take this path first when the candidate is on, ATHANOR_CUDA_ATTENTION is not
// "reference", and attention_cudnn_supported() says yes; any failure falls back to our kernels.
//
// The graphs are built on cuDNN's backend API (cudnn_graph.h): matmul, pointwise (scale, the
// causal mask as gen-index/compare/select, exp, log, ...), reduction and reshape nodes, engine
// heuristics, one execution plan per (device, direction, dims, strides, dtype, causal, scale),
// a variant pack per call. cuDNN itself is loaded at run time (cudnn_loader.h).
//
// Invariants:
//  - lse: the forward's "stats" output is cuDNN's softmax statistic max_j s_ij + log(sum_j
//    exp(s_ij - max)) on the scaled scores (cudnn-frontend's softmax node: Stats = M + log(Z)),
//    i.e. our lse; the backward reads it as P = exp(s - lse). So either backward takes either
//    forward's output;
//  - determinism: the backward graph is the "dP workspace" form (dQ = dS K written directly, no
//    f32 dQ accumulator filled by atomics: what cudnn-frontend builds when asked for a
//    deterministic backward on Hopper), and engine configs whose numerical notes say
//    NONDETERMINISTIC are skipped. Whether the chosen engine is bit-identical run to run is what
//    the gpu test GpuAttentionCudnn.BackwardIsBitIdenticalRunToRun checks; until a GPU run has
//    passed it, treat this path as NOT proven deterministic. The dP workspace costs
//    about 2 * B * H * Tq * Tk bytes of device workspace per backward call (from the caching
//    allocator, tag workspace, freed in stream order after the call; where it does not fit,
//    the call falls back to our kernels, and so does every later call of that shape);
//  - the backward's Delta_i = dO_i . O_i (cuDNN's "softmax_sum") lives in the caller's
//    attention_backward workspace (B H Tq floats: the size attention_backward_workspace gives);
//  - not bit-identical to our kernels (different tiling and rounding): compared with tolerances;
//  - declined (our kernels run): f32/f64, grouped-query heads (Hkv != H: cuDNN's backward needs
//    full-head dK/dV buffers and a reduction we have not wired), D not a multiple of 8 or above
//    128, Tq = Tk = 1, strides or pointers not 16-byte aligned, cuDNN missing, and any graph cuDNN refuses
//    at plan-build time (the cuDNN status and message kept: attention_cudnn_last_failure);
//  - no host synchronisation (cuDNN's handle and plans are built on a shape's first call, and
//    kept for the process's life); the plan cache is process-wide, guarded by a mutex.
#include <cuda_runtime_api.h>

#include <string>

#include "athanor/core/dtype.h"
#include "backend/cuda/attention.h"

namespace athanor::cuda {

// The shape/dtype/stride rule alone (no pointers, no library): "" when cuDNN's path could take
// the call, else why not. Host-only; tests check it without a GPU.
std::string attention_cudnn_decline_reason(const AttentionDims& d, const AttentionLayout& layout, DType dtype);

// The rule, the operands' 16-byte alignment and cuDNN's availability.
bool attention_cudnn_supported(const void* q, const void* k, const void* v, const void* o, const AttentionDims& d,
                               const AttentionLayout& layout, DType dtype);

// "" when cuDNN loaded; else the loader's one-line reason (bench/tests report it).
std::string attention_cudnn_unavailable_reason();

// Run cuDNN's forward / backward (the caller has checked attention_cudnn_supported). False when
// no plan could be built for the call, an operand is misaligned or the execution failed to
// launch (attention_cudnn_last_failure says which): the caller then runs its own kernels, which
// overwrite every output.
bool attention_cudnn_forward(const void* q, const void* k, const void* v, void* o, float* lse, const AttentionDims& d,
                             const AttentionLayout& layout, bool causal, double scale, DType dtype,
                             cudaStream_t stream);
// `workspace` is attention_backward's (attention_backward_workspace(d) bytes).
bool attention_cudnn_backward(const void* q, const void* k, const void* v, const void* o, const void* dout,
                              const float* lse, void* dq, void* dk, void* dv, const AttentionDims& d,
                              const AttentionLayout& layout, bool causal, double scale, DType dtype, void* workspace,
                              cudaStream_t stream);

// Builds the forward or backward operation graph for the call and finalizes it without a device
// (no handle, no heuristics): "" when cuDNN accepts every node and the graph, else the failure.
// Host-only (needs the library, not a GPU): tests check the graphs' descriptors here.
std::string attention_cudnn_graph_check(const AttentionDims& d, const AttentionLayout& layout, bool causal,
                                        DType dtype, bool backward);

// The last plan-build or execution failure ("" if none): the graph, the cuDNN status string
// and cuDNN's last error message.
std::string attention_cudnn_last_failure();

}  // namespace athanor::cuda
