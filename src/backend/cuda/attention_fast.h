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

// Tile configurations of the fast kernels, chosen at run time so that one bench run ranks them
// (bench/cuda_attention.cpp --tiles all). Names: f<query rows>x<key rows>w<warps> for the
// forward (a warp owns query rows / warps rows: 16 = one m16 tile, 32 = two, each K/V fragment
// from shared memory then feeding two MMAs); b<keys>x<queries>w<warps> for the backward (the
// dK/dV pass's key and query tiles, which are the dQ pass's query and key tiles, both passes
// with that many warps; at D 128 the dK/dV query tile is halved, for the registers). Two
// m-tiles per warp (f128x64w4) exist at D 64 only (GPT-2's heads); at D 128 that name runs
// f64x64w4 (attention_tiles_instantiated says so); every other name has kernels at D 64 and 128.
// Every configuration is deterministic and matches the reference kernels within the tests'
// tolerances; configurations sum in different orders, so they differ from each other in bits.
enum class FwdTiles { f64x64w4, f128x64w8, f128x64w4 };
enum class BwdTiles { b64x64w4, b128x64w8 };
inline constexpr FwdTiles kFwdTilesAll[] = {FwdTiles::f64x64w4, FwdTiles::f128x64w8, FwdTiles::f128x64w4};
inline constexpr BwdTiles kBwdTilesAll[] = {BwdTiles::b64x64w4, BwdTiles::b128x64w8};
struct AttentionTiles {
  FwdTiles fwd = FwdTiles::f64x64w4;  // the default: the kernels' configuration before the variants
  BwdTiles bwd = BwdTiles::b64x64w4;
  // (Spelled out: the .cu files compile as C++17.)
  bool operator==(const AttentionTiles& o) const { return fwd == o.fwd && bwd == o.bwd; }
};
const char* fwd_tiles_name(FwdTiles t);
const char* bwd_tiles_name(BwdTiles t);
// Parses ATHANOR_CUDA_ATTENTION_TILES's value "<forward>,<backward>" (e.g. "f128x64w4,b64x64w4");
// null or "" -> the default; anything else throws, naming the variable and the known names.
AttentionTiles parse_attention_tiles(const char* value);
// The process's choice: set_attention_tiles's if called, else ATHANOR_CUDA_ATTENTION_TILES read
// once (at the first fast call, so a bad value fails there).
AttentionTiles attention_tiles();
void set_attention_tiles(AttentionTiles tiles);
// Whether the configuration has its own kernels at head dim D (else the default's run).
bool attention_tiles_instantiated(FwdTiles t, int64_t D);
bool attention_tiles_instantiated(BwdTiles t, int64_t D);

// Whether the fast forward takes this call (dtype, head dims, 16-byte alignment of the
// pointers and strides); false means attention.cu's kernels run it.
bool attention_fast_supported(const void* q, const void* k, const void* v, const void* o, const AttentionDims& d,
                              const AttentionLayout& layout, DType dtype);

// Whether the fast backward takes this call: attention_fast_supported's conditions, and dO
// (layout of o) and dq, dk, dv (layouts of q, k, v) 16-byte aligned too.
bool attention_fast_backward_supported(const void* q, const void* k, const void* v, const void* o, const void* dout,
                                       const void* dq, const void* dk, const void* dv, const AttentionDims& d,
                                       const AttentionLayout& layout, DType dtype);

// The fast forward (in attention_tiles()'s configuration); the caller has run attention_check
// and attention_fast_supported.
void attention_fast_forward(const void* q, const void* k, const void* v, void* o, float* lse, const AttentionDims& d,
                            const AttentionLayout& layout, bool causal, double scale, DType dtype,
                            cudaStream_t stream);

// The fast backward (in attention_tiles()'s configuration; attention.h's attention_backward contract: the same workspace, dq, dk, dv
// fully overwritten, deterministic); the caller has run attention_check and
// attention_fast_backward_supported.
void attention_fast_backward(const void* q, const void* k, const void* v, const void* o, const void* dout,
                             const float* lse, void* dq, void* dk, void* dv, const AttentionDims& d,
                             const AttentionLayout& layout, bool causal, double scale, DType dtype, void* workspace,
                             cudaStream_t stream);

}  // namespace athanor::cuda
