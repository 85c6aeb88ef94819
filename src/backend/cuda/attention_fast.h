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
// (bench/cuda_attention.cpp --tiles all). Forward names f<query rows>x<key rows>w<warps>: a warp
// owns query rows / warps of them, 16 (one m16 tile) or 32 (two m-tiles: each K/V fragment
// loaded from shared memory feeds two MMAs). Backward names b<keys>x<queries>w<warps> give the
// dK/dV pass (a warp owns keys / warps keys: 16, or 32 as two m-tiles sharing each Q/dO
// fragment); the dQ pass runs the same number of warps, 16 query rows each, key tiles of 64.
//   f64x64w4   forward 4 warps x 16 rows, 64 keys a tile (the default: the kernels as before)
//   f128x64w8  forward 8 warps x 16 rows, 64 keys a tile
//   f128x64w4  forward 4 warps x 32 rows (two m-tiles), 64 keys a tile            (D 64 only)
//   f64x128w4  forward 4 warps x 16 rows, 128 keys a tile (half the tile steps)   (D 64 only)
//   b64x64w4   dK/dV 4 warps x 16 keys, 64 queries a step; dQ 4 warps (the default)
//   b128x64w8  dK/dV 8 warps x 16 keys, 64 queries a step; dQ 8 warps
//   b128x16w4  dK/dV 4 warps x 32 keys (two m-tiles), 16 queries a step; dQ 4 warps (D 64 only)
// At D 128 the dK/dV query step is 32 in every configuration (the registers), and a name marked
// "D 64 only" runs the default's kernels (attention_tiles_instantiated says which).
// Every configuration is deterministic (bit-identical run to run) and matches the reference
// kernels within the tests' tolerances; across configurations no bit-identity is promised.
enum class FwdTiles { f64x64w4, f128x64w8, f128x64w4, f64x128w4 };
enum class BwdTiles { b64x64w4, b128x64w8, b128x16w4 };
inline constexpr FwdTiles kFwdTilesAll[] = {FwdTiles::f64x64w4, FwdTiles::f128x64w8, FwdTiles::f128x64w4,
                                            FwdTiles::f64x128w4};
inline constexpr BwdTiles kBwdTilesAll[] = {BwdTiles::b64x64w4, BwdTiles::b128x64w8, BwdTiles::b128x16w4};
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
