// The f32 GEMM dispatch (issue 7): GEMMs of at least 16^3 multiply-adds run on cached
// oneDNN matmul primitives (transposes as strides, alpha as output scale, beta as a sum
// post-op, the bias in the epilogue, scratchpad in a per-thread buffer); smaller
// ones on dnnl_sgemm. Both against the naive double-accumulating reference, with odd
// sizes, transposes, padded leading dimensions, alpha/beta and the fused bias.
//
// Tolerance: K <= 600 and N(0,1) inputs, so f32 accumulation differs from the double
// reference by ~K * 2^-24 relative: atol = rtol = 1e-4 (the f32 matmul test's bound).
#include <array>

#include "backend/cpu/gemm.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
// Odd sizes, M = 1 included; all on the primitive path (>= 16^3 multiply-adds).
const std::vector<std::array<int64_t, 3>> kLargeShapes = {{130, 67, 257}, {257, 129, 65}, {1, 4099, 600}};

std::string shape_name(int64_t M, int64_t N, int64_t K, bool ta, bool tb) {
  return std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + (ta ? " ta" : "") + (tb ? " tb" : "");
}
}  // namespace

TEST(GemmDispatch, F32PrimitivePathMatchesReferenceWithTransposesAlphaBeta) {
  Generator g(31);
  const size_t before = cpu::gemm_cached_primitives(/*bf16_inputs=*/false);
  for (auto [M, N, K] : kLargeShapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(shape_name(M, N, K, ta, tb));
        Tensor A = randn(ta ? Shape{K, M} : Shape{M, K}, {}, g), B = randn(tb ? Shape{N, K} : Shape{K, N}, {}, g);
        for (auto [alpha, beta] : std::vector<std::pair<float, float>>{{1.0f, 0.0f}, {1.5f, 0.25f}}) {
          Tensor fast = full({M, N}, 0.5), ref = full({M, N}, 0.5);
          cpu::gemm(ta, tb, M, N, K, alpha, A.data_ptr<float>(), A.size(1), B.data_ptr<float>(), B.size(1), beta,
                    fast.data_ptr<float>(), N);
          cpu::ref::gemm<float>(ta, tb, M, N, K, alpha, A.data_ptr<float>(), A.size(1), B.data_ptr<float>(), B.size(1),
                                beta, ref.data_ptr<float>(), N);
          EXPECT_CLOSE(fast, ref, 1e-4, 1e-4);
        }
      }
  // The large shapes went through primitives (one per shape, layout and alpha/beta).
  EXPECT_GE(cpu::gemm_cached_primitives(false), before + kLargeShapes.size() * 4);
}

TEST(GemmDispatch, F32PrimitivePathWithPaddedLeadingDimensions) {
  // Sub-matrices of wider buffers (lda/ldb/ldc > row length), as batched matmul and views hand them over.
  Generator g(32);
  const int64_t M = 129, N = 131, K = 127;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(shape_name(M, N, K, ta, tb));
      const int64_t lda = (ta ? M : K) + 5, ldb = (tb ? K : N) + 3, ldc = N + 7;
      Tensor A = randn({ta ? K : M, lda}, {}, g), B = randn({tb ? N : K, ldb}, {}, g);
      Tensor fast = full({M, ldc}, 0.5), ref = full({M, ldc}, 0.5);
      cpu::gemm(ta, tb, M, N, K, 1.0f, A.data_ptr<float>(), lda, B.data_ptr<float>(), ldb, 0.0f, fast.data_ptr<float>(), ldc);
      cpu::ref::gemm<float>(ta, tb, M, N, K, 1.0, A.data_ptr<float>(), lda, B.data_ptr<float>(), ldb, 0.0,
                            ref.data_ptr<float>(), ldc);
      EXPECT_CLOSE(fast, ref, 1e-4, 1e-4);  // the padding columns stay 0.5 in both
    }
}

// gemm_bias against the reference with C prefilled by the bias and beta = 1, in every
// dtype: f32 on a primitive (large) and on sgemm + prefill (small), f64 (OpenBLAS),
// f16 (through f32). bf16 is in tests/amp/test_gemm_bf16.cpp.
template <class T>
void check_gemm_bias(DType dt, int64_t M, int64_t N, int64_t K, double atol, double rtol, uint64_t seed) {
  Generator g(seed);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_name(M, N, K, ta, tb));
      Tensor A = randn(ta ? Shape{K, M} : Shape{M, K}, dt, g), B = randn(tb ? Shape{N, K} : Shape{K, N}, dt, g);
      Tensor bias = randn({N}, dt, g);
      Tensor fast = full({M, N}, 123.0, dt);  // gemm_bias writes C without reading it
      Tensor ref = contiguous(expand(unsqueeze(bias, 0), {M, N}));
      cpu::gemm_bias<T>(ta, tb, M, N, K, A.data_ptr<T>(), A.size(1), B.data_ptr<T>(), B.size(1), bias.data_ptr<T>(),
                        fast.data_ptr<T>(), N);
      cpu::ref::gemm<T>(ta, tb, M, N, K, 1.0, A.data_ptr<T>(), A.size(1), B.data_ptr<T>(), B.size(1), 1.0,
                        ref.data_ptr<T>(), N);
      EXPECT_CLOSE(fast, ref, atol, rtol);
      // Without a bias, C = op(A) op(B).
      Tensor fast0 = full({M, N}, 123.0, dt), ref0 = zeros({M, N}, dt);
      cpu::gemm_bias<T>(ta, tb, M, N, K, A.data_ptr<T>(), A.size(1), B.data_ptr<T>(), B.size(1), nullptr,
                        fast0.data_ptr<T>(), N);
      cpu::ref::gemm<T>(ta, tb, M, N, K, 1.0, A.data_ptr<T>(), A.size(1), B.data_ptr<T>(), B.size(1), 0.0,
                        ref0.data_ptr<T>(), N);
      EXPECT_CLOSE(fast0, ref0, atol, rtol);
    }
}

TEST(GemmDispatch, GemmBiasMatchesReferenceInEveryDtype) {
  check_gemm_bias<float>(DType::f32, 130, 67, 257, 1e-4, 1e-4, 33);   // primitive, bias in the epilogue
  check_gemm_bias<float>(DType::f32, 7, 13, 30, 1e-4, 1e-4, 34);      // 2730 < 16^3: sgemm after a bias prefill
  check_gemm_bias<double>(DType::f64, 33, 17, 65, 1e-12, 1e-12, 35);  // OpenBLAS
  // f16 inputs, f32 accumulation, one rounding to f16 (2^-11 relative) in both.
  check_gemm_bias<float16>(DType::f16, 33, 17, 65, 1e-2, 1.0 / 1024, 36);
}

TEST(GemmDispatch, LinearAboveThePrimitiveThresholdMatchesReference) {
  // linear's forward is one gemm_bias call: x [.., in] W[out, in]^T + b, here with a 3-D x.
  Generator g(37);
  const int64_t in = 257, out = 67;
  Tensor x = randn({2, 65, in}, {}, g), w = randn({out, in}, {}, g), b = randn({out}, {}, g);
  Tensor y = linear(x, w, b);
  Tensor expect = contiguous(expand(unsqueeze(b, 0), {130, out}));
  cpu::ref::gemm<float>(false, true, 130, out, in, 1.0, x.data_ptr<float>(), in, w.data_ptr<float>(), in, 1.0,
                        expect.data_ptr<float>(), out);
  EXPECT_CLOSE(y.reshape({130, out}), expect, 1e-4, 1e-4);
  Tensor expect0 = zeros({130, out});
  cpu::ref::gemm<float>(false, true, 130, out, in, 1.0, x.data_ptr<float>(), in, w.data_ptr<float>(), in, 0.0,
                        expect0.data_ptr<float>(), out);
  EXPECT_CLOSE(linear(x, w).reshape({130, out}), expect0, 1e-4, 1e-4);
}

TEST(GemmDispatch, RepeatedShapesReuseCachedPrimitives) {
  Generator g(38);
  const int64_t M = 128, N = 130, K = 129;
  Tensor A = randn({M, K}, {}, g), B = randn({N, K}, {}, g), C = empty({M, N}), bias = randn({N}, {}, g);
  cpu::gemm(false, true, M, N, K, 1.0f, A.data_ptr<float>(), K, B.data_ptr<float>(), K, 0.0f, C.data_ptr<float>(), N);
  cpu::gemm_bias<float>(false, true, M, N, K, A.data_ptr<float>(), K, B.data_ptr<float>(), K, bias.data_ptr<float>(),
                        C.data_ptr<float>(), N);
  const size_t n = cpu::gemm_cached_primitives(false);
  const MemoryStats s0 = Allocator::cpu().stats();
  for (int i = 0; i < 3; ++i) {
    cpu::gemm(false, true, M, N, K, 1.0f, A.data_ptr<float>(), K, B.data_ptr<float>(), K, 0.0f, C.data_ptr<float>(), N);
    cpu::gemm_bias<float>(false, true, M, N, K, A.data_ptr<float>(), K, B.data_ptr<float>(), K, bias.data_ptr<float>(),
                          C.data_ptr<float>(), N);
  }
  EXPECT_EQ(cpu::gemm_cached_primitives(false), n);
  // Warm calls allocate nothing from the system (the scratchpad is a per-thread buffer).
  EXPECT_EQ(Allocator::cpu().stats().system_allocs, s0.system_allocs);
}

}  // namespace athanor
