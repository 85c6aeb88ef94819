#pragma once
// Weights packed in the blocked layout oneDNN's matmul kernels (brgemm, AVX-512) read
// their B operand in. Given a plain B, a matmul packs it into this layout on every
// call; a packed copy kept next to the weight, rewritten only when the weight changes
// (the optimizer's step), saves that work on the MLP's and GPTs' linear shapes, bf16
// most (bench_gemm_shapes; bench/RESULTS.md).
//
// The layout of B [K, N] (oneDNN 2.6's BA16a64b for f32, BA16a64b2a for bf16): N in
// panels of 64 columns, each panel a [Kp, 64] row-major block (f32) or [Kp/2, 64, 2]
// (bf16: pairs of consecutive k side by side), Kp = K rounded up to 16 (f32) / 32
// (bf16), the last panel and the rows past K zero-filled. gemm_packed (gemm.h) checks
// that oneDNN asks for exactly this layout before it runs on it.
//
// A linear's weight W [out, in] feeds two GEMMs: the forward x W^T (B = W^T: K = in,
// N = out; W's rows are B's columns) and the input gradient dy W (B = W: K = out,
// N = in). pack_weight_rows packs from W either way.
#include <cstdint>

namespace athanor::cpu {

struct PackedLayout {
  bool bf16 = false;     // element type: bf16, else f32
  int64_t K = 0, N = 0;  // B's logical shape
  int64_t Kp = 0, Np = 0;
  int64_t elements() const { return Kp * Np; }
  int64_t bytes() const { return elements() * (bf16 ? 2 : 4); }
  bool operator==(const PackedLayout&) const = default;
};
PackedLayout packed_layout(bool bf16, int64_t K, int64_t N);

// Writes rows [r0, r1) of W (row-major, leading dimension ldw; f32 or bf16 as the
// layout says) into their places in `dst`, the whole packed buffer. w_is_bt: W is B^T
// ([N, K], linear's forward), else W is B ([K, N], dx). Never writes the padding: dst
// must come zero-filled. For a bf16 W = B, r0 must be even (rows pair up). Single
// threaded; callers split the rows between threads (pack_weight does).
void pack_weight_rows(const PackedLayout& l, bool w_is_bt, const void* W, int64_t ldw, int64_t r0, int64_t r1, void* dst);
// All of W's rows, over the OpenMP threads (each thread a contiguous share of rows).
void pack_weight(const PackedLayout& l, bool w_is_bt, const void* W, int64_t ldw, void* dst);
// The row where thread t of `threads` starts its share of a W with `rows` rows (rounded
// so every share but the last starts on a 16-row boundary, which pack_weight_rows needs
// for its vector path; even, as bf16 W = B needs).
int64_t pack_share_begin(int64_t rows, int t, int threads);

namespace detail {
// Element (k, n) of B in the packed buffer: its index.
inline int64_t packed_index(const PackedLayout& l, int64_t k, int64_t n) {
  const int64_t panel = (n / 64) * l.Kp * 64;
  return l.bf16 ? panel + (k / 2) * 128 + (n % 64) * 2 + (k % 2) : panel + k * 64 + n % 64;
}
// The scalar packing loop (what pack_weight_rows runs at the avx2 level, and the tests' reference).
void pack_weight_rows_scalar(const PackedLayout& l, bool w_is_bt, const void* W, int64_t ldw, int64_t r0, int64_t r1,
                             void* dst);
}  // namespace detail

}  // namespace athanor::cpu
