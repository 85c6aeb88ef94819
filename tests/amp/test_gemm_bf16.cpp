// bf16 GEMM on oneDNN's matmul primitive (AVX512_BF16, f32 accumulation) against
// the naive reference on the same bf16 inputs, with transposes, odd sizes,
// alpha/beta, bf16 and f32 outputs, and the primitive cache.
//
// Tolerances: the reference accumulates in double and rounds once to the output
// dtype; the fast path accumulates in f32 (relative ~K * 2^-24, negligible here)
// and rounds once. For bf16 outputs the two roundings may land one bf16 ulp
// apart: rtol = 2^-7 (two half-ulps of margin), plus atol = 1e-2 for entries
// that nearly cancel (|C| ~ sqrt(K) for N(0,1) inputs). For f32 outputs:
// atol = rtol = 1e-4 (the f32 test's bound).
#include <array>

#include <cmath>

#include "backend/cpu/gemm.h"
#include "backend/cpu/weight_packing.h"
#include "backend/cpu/workspace.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
const std::vector<std::array<int64_t, 3>> kShapes = {{1, 1, 1}, {7, 13, 300}, {64, 48, 96}, {130, 3, 257}, {33, 65, 17}};
}

TEST(GemmBf16, MatchesReferenceWithTransposesAndOddSizes) {
  Generator g(21);
  for (auto [M, N, K] : kShapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + (ta ? " ta" : "") + (tb ? " tb" : ""));
        Tensor A = randn(ta ? Shape{K, M} : Shape{M, K}, DType::bf16, g), B = randn(tb ? Shape{N, K} : Shape{K, N}, DType::bf16, g);
        for (float beta : {0.0f, 0.25f}) {
          Tensor fast = full({M, N}, 0.5, DType::bf16), ref = full({M, N}, 0.5, DType::bf16);
          cpu::gemm_lowp<bfloat16>(ta, tb, M, N, K, 1.5f, A.data_ptr<bfloat16>(), A.size(1), B.data_ptr<bfloat16>(),
                                   B.size(1), beta, fast.data_ptr<bfloat16>(), N);
          cpu::ref::gemm<bfloat16>(ta, tb, M, N, K, 1.5, A.data_ptr<bfloat16>(), A.size(1), B.data_ptr<bfloat16>(),
                                   B.size(1), beta, ref.data_ptr<bfloat16>(), N);
          EXPECT_CLOSE(fast, ref, 1e-2, 1.0 / 128);
          // bf16 inputs, f32 output.
          Tensor fast32 = full({M, N}, 0.5), ref32 = full({M, N}, 0.5);
          Tensor A32 = A.to(DType::f32), B32 = B.to(DType::f32);
          cpu::gemm_bf16_f32out(ta, tb, M, N, K, 1.5f, A.data_ptr<bfloat16>(), A.size(1), B.data_ptr<bfloat16>(),
                                B.size(1), beta, fast32.data_ptr<float>(), N);
          cpu::ref::gemm<float>(ta, tb, M, N, K, 1.5, A32.data_ptr<float>(), A32.size(1), B32.data_ptr<float>(),
                                B32.size(1), beta, ref32.data_ptr<float>(), N);
          EXPECT_CLOSE(fast32, ref32, 1e-4, 1e-4);
        }
      }
}

TEST(GemmBf16, ManyRowsPackBOnceAndMatchReference) {
  // From 512 rows a plain B (a weight gradient's activation) is packed into oneDNN's blocked
  // layout by gemm_bf16_f32out / gemm_lowp before the GEMM. Sizes off the layout's blocks
  // (K % 32, N % 64) leave padding, which must read as zeros: the scratch the packed copy
  // lands in is first filled with NaN (the allocator hands the same block back).
  Generator g(25);
  for (auto [M, N, K] : std::vector<std::array<int64_t, 3>>{{520, 100, 70}, {512, 64, 32}, {600, 784, 128}, {640, 130, 33}})
    for (bool ta : {false, true}) {
      SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + (ta ? " ta" : ""));
      const int64_t ldb = N + 3;
      Tensor A = randn(ta ? Shape{K, M} : Shape{M, K}, DType::bf16, g), B = randn({K, ldb}, DType::bf16, g);
      const cpu::PackedLayout l = cpu::packed_layout(true, K, N);
      for (float beta : {0.0f, 0.5f}) {
        {
          const cpu::Workspace poison(static_cast<std::size_t>(l.bytes()));
          std::fill_n(poison.as<float>(), l.bytes() / 4, std::nanf(""));
        }
        Tensor fast32 = full({M, N}, 0.5), ref32 = full({M, N}, 0.5);
        Tensor A32 = A.to(DType::f32), B32 = B.to(DType::f32);
        cpu::gemm_bf16_f32out(ta, false, M, N, K, 1.5f, A.data_ptr<bfloat16>(), A.size(1), B.data_ptr<bfloat16>(), ldb,
                              beta, fast32.data_ptr<float>(), N);
        cpu::ref::gemm<float>(ta, false, M, N, K, 1.5, A32.data_ptr<float>(), A32.size(1), B32.data_ptr<float>(), ldb,
                              beta, ref32.data_ptr<float>(), N);
        EXPECT_CLOSE(fast32, ref32, 1e-4, 1e-4);
        {
          const cpu::Workspace poison(static_cast<std::size_t>(l.bytes()));
          std::fill_n(poison.as<float>(), l.bytes() / 4, std::nanf(""));
        }
        Tensor fast = full({M, N}, 0.5, DType::bf16), ref = full({M, N}, 0.5, DType::bf16);
        cpu::gemm_lowp<bfloat16>(ta, false, M, N, K, 1.5f, A.data_ptr<bfloat16>(), A.size(1), B.data_ptr<bfloat16>(), ldb,
                                 beta, fast.data_ptr<bfloat16>(), N);
        cpu::ref::gemm<bfloat16>(ta, false, M, N, K, 1.5, A.data_ptr<bfloat16>(), A.size(1), B.data_ptr<bfloat16>(), ldb,
                                 beta, ref.data_ptr<bfloat16>(), N);
        EXPECT_CLOSE(fast, ref, 1e-2, 1.0 / 128);
      }
    }
}

TEST(GemmBf16, LeadingDimensionsLargerThanRows) {
  // Sub-matrices of wider buffers (lda/ldb/ldc > row length), as batched matmul hands them over.
  Generator g(22);
  const int64_t M = 9, N = 11, K = 37;
  Tensor A = randn({M, K + 5}, DType::bf16, g), B = randn({K, N + 3}, DType::bf16, g);
  Tensor fast = zeros({M, N + 7}, DType::bf16), ref = zeros({M, N + 7}, DType::bf16);
  cpu::gemm_lowp<bfloat16>(false, false, M, N, K, 1.0f, A.data_ptr<bfloat16>(), K + 5, B.data_ptr<bfloat16>(), N + 3,
                           0.0f, fast.data_ptr<bfloat16>(), N + 7);
  cpu::ref::gemm<bfloat16>(false, false, M, N, K, 1.0, A.data_ptr<bfloat16>(), K + 5, B.data_ptr<bfloat16>(), N + 3,
                           0.0, ref.data_ptr<bfloat16>(), N + 7);
  EXPECT_CLOSE(fast, ref, 1e-2, 1.0 / 128);
  // Transposed operands stored with padded rows (ld > stored row length).
  Tensor At = randn({K, M + 4}, DType::bf16, g), Bt = randn({N, K + 6}, DType::bf16, g);
  Tensor fast_t = zeros({M, N}, DType::bf16), ref_t = zeros({M, N}, DType::bf16);
  cpu::gemm_lowp<bfloat16>(true, true, M, N, K, 1.0f, At.data_ptr<bfloat16>(), M + 4, Bt.data_ptr<bfloat16>(), K + 6,
                           0.0f, fast_t.data_ptr<bfloat16>(), N);
  cpu::ref::gemm<bfloat16>(true, true, M, N, K, 1.0, At.data_ptr<bfloat16>(), M + 4, Bt.data_ptr<bfloat16>(), K + 6,
                           0.0, ref_t.data_ptr<bfloat16>(), N);
  EXPECT_CLOSE(fast_t, ref_t, 1e-2, 1.0 / 128);
}

TEST(GemmBf16, BiasInTheEpilogueMatchesReference) {
  // gemm_bias (linear's forward under autocast): bf16 x, W, b; the bias added by the
  // primitive before the single rounding to bf16. Reference: C prefilled with the bias,
  // beta = 1, accumulated in double, rounded once.
  Generator g(24);
  for (auto [M, N, K] : kShapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + (ta ? " ta" : "") + (tb ? " tb" : ""));
        Tensor A = randn(ta ? Shape{K, M} : Shape{M, K}, DType::bf16, g), B = randn(tb ? Shape{N, K} : Shape{K, N}, DType::bf16, g);
        Tensor bias = randn({N}, DType::bf16, g);
        Tensor fast = full({M, N}, 99.0, DType::bf16), ref = contiguous(expand(unsqueeze(bias, 0), {M, N}));
        cpu::gemm_bias<bfloat16>(ta, tb, M, N, K, A.data_ptr<bfloat16>(), A.size(1), B.data_ptr<bfloat16>(), B.size(1),
                                 bias.data_ptr<bfloat16>(), fast.data_ptr<bfloat16>(), N);
        cpu::ref::gemm<bfloat16>(ta, tb, M, N, K, 1.0, A.data_ptr<bfloat16>(), A.size(1), B.data_ptr<bfloat16>(),
                                 B.size(1), 1.0, ref.data_ptr<bfloat16>(), N);
        EXPECT_CLOSE(fast, ref, 1e-2, 1.0 / 128);
      }
}

TEST(GemmBf16, PrimitivesAreCachedByShape) {
  Generator g(23);
  Tensor A = randn({17, 19}, DType::bf16, g), B = randn({19, 23}, DType::bf16, g), C = empty({17, 23}, DType::bf16);
  cpu::gemm_lowp<bfloat16>(false, false, 17, 23, 19, 1.0f, A.data_ptr<bfloat16>(), 19, B.data_ptr<bfloat16>(), 23, 0.0f,
                           C.data_ptr<bfloat16>(), 23);
  const size_t n = cpu::gemm_bf16_cached_primitives();
  for (int i = 0; i < 3; ++i)
    cpu::gemm_lowp<bfloat16>(false, false, 17, 23, 19, 1.0f, A.data_ptr<bfloat16>(), 19, B.data_ptr<bfloat16>(), 23,
                             0.0f, C.data_ptr<bfloat16>(), 23);
  EXPECT_EQ(cpu::gemm_bf16_cached_primitives(), n);
}

TEST(GemmBf16, Float16StaysExactViaF32) {
  Generator g(24);
  const int64_t M = 5, N = 6, K = 40;
  Tensor A = randn({K, M}, DType::f16, g), B = randn({N, K}, DType::f16, g);
  Tensor fast = zeros({M, N}, DType::f16), ref = zeros({M, N}, DType::f16);
  cpu::gemm_lowp<float16>(true, true, M, N, K, 1.0f, A.data_ptr<float16>(), M, B.data_ptr<float16>(), K, 0.0f,
                          fast.data_ptr<float16>(), N);
  cpu::ref::gemm<float16>(true, true, M, N, K, 1.0, A.data_ptr<float16>(), M, B.data_ptr<float16>(), K, 0.0,
                          ref.data_ptr<float16>(), N);
  EXPECT_CLOSE(fast, ref, 1e-2, 1.0 / 1024);
}

}  // namespace athanor
