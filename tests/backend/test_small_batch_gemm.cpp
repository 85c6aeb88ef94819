// Small-batch f32 GEMMs (backend/cpu/small_batch_gemm) against a naive f64 reference: the
// three kinds it takes (NT forward, NN dx, TN dW; NT with A's rows 4 KiB apart, which it
// copies first) on sizes off every block (rows of A and B not multiples of the tiles, K
// off the 16-lane vectors and across the 256-deep panels, columns off the 64-column
// panels), padded leading dimensions, alpha, beta (NaN-filled C with beta = 0), bias; 1
// and 2 OpenMP threads must give bitwise the same C; shapes it refuses leave C untouched;
// and cpu::gemm / gemm_bias on the MLP's shapes agree with the oneDNN path they replace.
// The tiles are AVX-512 kernels: each test runs at every level the CPU has, and at avx2
// checks that the path is off (applies to nothing, leaves C untouched).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/small_batch_gemm.h"
#include "gemm_check.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {

bool run_small_batch(const Gemm& g, const Data& d, std::vector<float>& c) {
  c = d.c0;
  return cpu::small_batch_gemm(g.ta, g.tb, g.M, g.N, g.K, g.alpha, d.a.data(), g.lda(), d.b.data(), g.ldb(), g.beta,
                               g.bias ? d.bias.data() : nullptr, c.data(), g.ldc());
}

bool have_path() { return cpu::small_batch_gemm_applies(false, true, 128, 1024, 1024, 1.0f); }

// At the avx2 level there are no small-batch tiles (they are AVX-512 kernels): the path
// applies to nothing and leaves C untouched, and cpu::gemm takes oneDNN for these shapes.
void expect_path_off(const Gemm& g, const Data& d) {
  std::vector<float> c;
  EXPECT_FALSE(cpu::small_batch_gemm_applies(g.ta, g.tb, g.M, g.N, g.K, g.alpha)) << g.str();
  EXPECT_FALSE(run_small_batch(g, d, c)) << g.str();
  EXPECT_EQ(std::memcmp(c.data(), d.c0.data(), c.size() * sizeof(float)), 0) << g.str() << ": C was written";
}

}  // namespace

TEST(SmallBatchGemm, AppliesToALinearLayersGemmsAtSmallBatch) {
  for_each_isa_level([](int level) {
  if (level == static_cast<int>(cpu::Isa::avx2)) {
    EXPECT_FALSE(have_path());
    EXPECT_FALSE(cpu::small_batch_gemm_applies(true, false, 1024, 784, 128, 1.0f));
    return;
  }
  // The MLP's 784 -> 1024 -> 1024 at batch 128: forward (NT), dx (NN), dW (TN).
  EXPECT_TRUE(cpu::small_batch_gemm_applies(false, true, 128, 1024, 784, 1.0f));
  EXPECT_TRUE(cpu::small_batch_gemm_applies(false, false, 128, 1024, 1024, 1.0f));
  EXPECT_TRUE(cpu::small_batch_gemm_applies(true, false, 1024, 784, 128, 1.0f));
  // Batches of 2048 rows (a GPT's T x B), short K for the dot tiles, narrow sizes, TT,
  // alpha = 0: the usual path.
  EXPECT_FALSE(cpu::small_batch_gemm_applies(false, true, 2048, 1024, 256, 1.0f));
  EXPECT_FALSE(cpu::small_batch_gemm_applies(false, false, 2048, 256, 1024, 1.0f));
  EXPECT_FALSE(cpu::small_batch_gemm_applies(true, false, 1024, 256, 2048, 1.0f));
  EXPECT_FALSE(cpu::small_batch_gemm_applies(false, true, 128, 1024, 256, 1.0f));
  EXPECT_FALSE(cpu::small_batch_gemm_applies(false, true, 256, 1024, 1024, 1.0f));  // dot tiles measured slower
  EXPECT_FALSE(cpu::small_batch_gemm_applies(false, true, 128, 4096, 1024, 1.0f));
  EXPECT_FALSE(cpu::small_batch_gemm_applies(false, true, 128, 1024, 2048, 1.0f));
  EXPECT_FALSE(cpu::small_batch_gemm_applies(false, true, 128, 10, 1024, 1.0f));
  EXPECT_FALSE(cpu::small_batch_gemm_applies(true, true, 128, 1024, 1024, 1.0f));
  EXPECT_FALSE(cpu::small_batch_gemm_applies(false, true, 128, 1024, 1024, 0.0f));
  });
}

TEST(SmallBatchGemm, MatchesF64ReferenceOnRaggedShapesAndThreadCounts) {
  for_each_isa_level([](int level) {
  const Gemm shapes[] = {
      // NT (dot tiles: 3 rows of A x 8 rows of B; K passes of <= 1024)
      {false, true, 128, 1024, 784, 0, 1.0f, 0.0f, true, true},   // the MLP's fc1 forward, bias
      {false, true, 97, 259, 807, 3, -0.75f, 0.5f, false, false},  // every edge: rows 97 = 32*3+1, 259 = 32*8+3, K tail 7
      {false, true, 160, 262, 1024, 0, 1.0f, 1.0f, true, false},  // beta = 1 with bias
      {false, true, 100, 2047, 769, 5, 2.0f, 0.0f, false, true},
      {false, true, 97, 259, 1000, 24, 1.0f, 0.0f, true, true},  // lda = 1024: A copied to unaliased rows, K < lda
      // NN (outer tiles: 6 rows x 64 columns over 256-deep panels)
      {false, false, 128, 1024, 1024, 0, 1.0f, 0.0f, false, true},  // the MLP's fc2 dx
      {false, false, 101, 300, 600, 4, 0.5f, 1.0f, true, false},    // 101 = 16*6+5, 300 = 4*64+44, 3 panels of K
      {false, false, 64, 257, 256, 0, 1.0f, 0.0f, false, true},     // last column block of one column
      // TN (the batch is K)
      {true, false, 1024, 784, 128, 0, 1.0f, 0.0f, false, true},  // the MLP's fc1 dW: rows split across threads
      {true, false, 1024, 1024, 128, 2, 1.0f, 1.0f, false, false},  // fc2 dW accumulated: columns split
      {true, false, 301, 333, 77 + 64, 0, -1.0f, 0.25f, true, false},
  };
  for (const Gemm& g : shapes) {
    const Data d = make_data(g, 700 + g.M * 5 + g.N * 3 + g.K);
    if (level == static_cast<int>(cpu::Isa::avx2)) {
      expect_path_off(g, d);
      continue;
    }
    ASSERT_TRUE(cpu::small_batch_gemm_applies(g.ta, g.tb, g.M, g.N, g.K, g.alpha)) << g.str();
    std::vector<float> c1, c2;
    {
      ThreadCount one(1);
      ASSERT_TRUE(run_small_batch(g, d, c1)) << g.str();
    }
    {
      ThreadCount two(2);
      ASSERT_TRUE(run_small_batch(g, d, c2)) << g.str();
    }
    EXPECT_TRUE(check(g, d, c2));
    // Each element is summed by one thread in a fixed order: the thread count changes nothing.
    EXPECT_EQ(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)), 0) << g.str() << ": 1 vs 2 threads";
  }
  });
}

// relu (linear_relu's forward): C is max(the same GEMM's C, 0), bitwise, padding untouched;
// only the NT (dot) shapes take it.
TEST(SmallBatchGemm, ReluEpilogueIsMaxOfThePlainResult) {
  for_each_isa_level([](int level) {
  ThreadCount two(2);
  if (level == static_cast<int>(cpu::Isa::avx2)) {
    const Gemm g{false, true, 128, 1024, 784, 0, 1.0f, 0.0f, true, true};
    const Data d = make_data(g, 300 + g.K);
    std::vector<float> c = d.c0;
    EXPECT_FALSE(cpu::small_batch_gemm(g.ta, g.tb, g.M, g.N, g.K, g.alpha, d.a.data(), g.lda(), d.b.data(), g.ldb(),
                                       g.beta, d.bias.data(), c.data(), g.ldc(), /*relu=*/true));
    EXPECT_EQ(std::memcmp(c.data(), d.c0.data(), c.size() * sizeof(float)), 0) << "C was written";  // NaN-filled
    return;
  }
  for (const Gemm& g : {Gemm{false, true, 128, 1024, 784, 0, 1.0f, 0.0f, true, true},
                        Gemm{false, true, 97, 259, 1000, 24, 0.5f, 1.0f, true, false}}) {
    const Data d = make_data(g, 300 + g.K);
    std::vector<float> plain, fused = d.c0;
    ASSERT_TRUE(run_small_batch(g, d, plain)) << g.str();
    ASSERT_TRUE(cpu::small_batch_gemm(g.ta, g.tb, g.M, g.N, g.K, g.alpha, d.a.data(), g.lda(), d.b.data(), g.ldb(), g.beta,
                                      g.bias ? d.bias.data() : nullptr, fused.data(), g.ldc(), /*relu=*/true))
        << g.str();
    int64_t clamped = 0;
    for (int64_t i = 0; i < g.M; ++i)
      for (int64_t j = 0; j < g.ldc(); ++j) {
        const int64_t at = i * g.ldc() + j;
        const float want = j < g.N ? std::max(plain[at], 0.0f) : d.c0[at];
        ASSERT_EQ(std::memcmp(&fused[at], &want, sizeof(float)), 0) << g.str() << " at (" << i << ", " << j << ")";
        clamped += j < g.N && plain[at] < 0.0f;
      }
    EXPECT_GT(clamped, g.M * g.N / 4) << g.str();  // the clamp is really exercised
  }
  const Gemm nn{false, false, 128, 300, 300};
  const Data d = make_data(nn, 12);
  std::vector<float> c = d.c0;
  EXPECT_FALSE(cpu::small_batch_gemm(false, false, nn.M, nn.N, nn.K, 1.0f, d.a.data(), nn.lda(), d.b.data(), nn.ldb(), 0.0f,
                                     nullptr, c.data(), nn.ldc(), /*relu=*/true));
  EXPECT_EQ(c, d.c0);
  });
}

TEST(SmallBatchGemm, RefusedShapesAndSwitchedOffLeaveCUntouched) {
  const Gemm refused{false, true, 2048, 300, 256};
  Data d = make_data(refused, 9);
  std::vector<float> c;
  EXPECT_FALSE(run_small_batch(refused, d, c));
  EXPECT_EQ(c, d.c0);
  if (!have_path()) return;
  const Gemm g{false, false, 128, 300, 300};
  d = make_data(g, 10);
  cpu::set_small_batch_gemm_enabled(false);
  const bool took = run_small_batch(g, d, c);
  cpu::set_small_batch_gemm_enabled(true);
  EXPECT_FALSE(took);
  EXPECT_EQ(c, d.c0);
  EXPECT_TRUE(run_small_batch(g, d, c));
  EXPECT_TRUE(check(g, d, c));
}

// cpu::gemm / cpu::gemm_bias on the MLP's hidden layer (1024 -> 1024 at batch 128): this
// path (now taken) and the oneDNN path (switch off) both match the f64 reference, and each
// other within f32 rounding.
TEST(SmallBatchGemm, PublicGemmEntryPointsOnMlpShapes) {
  ThreadCount two(2);
  // {ta, tb, M, N, K, pad, alpha, beta, bias, nan_c}
  expect_fast_path_matches_onednn({false, true, 128, 1024, 1024, 0, 1.0f, 0.0f, true, true}, 58, cpu::set_small_batch_gemm_enabled,
                                  "small-batch path");  // y = x W^T + b
  expect_fast_path_matches_onednn({false, false, 128, 1024, 1024, 0, 1.0f, 0.0f, false, true}, 59,
                                  cpu::set_small_batch_gemm_enabled, "small-batch path");  // dx = g W
  expect_fast_path_matches_onednn({true, false, 1024, 1024, 128, 0, 1.0f, 1.0f, false, false}, 60,
                                  cpu::set_small_batch_gemm_enabled, "small-batch path");  // dW += g^T x
}

}  // namespace athanor
