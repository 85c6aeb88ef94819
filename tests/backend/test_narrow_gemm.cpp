// Narrow f32 GEMMs (backend/cpu/narrow_gemm) against a naive f64 reference: all four
// transposes, the narrow dimension in each of M, N, K around the thresholds, ragged
// large dimensions, padded leading dimensions, alpha, beta (NaN-filled C with beta = 0),
// bias; 1 and 2 OpenMP threads (results must be bitwise the same, also on shapes big
// enough to be split across threads); shapes the path must
// refuse leave C untouched; and the public gemm()/gemm_bias() on the MLP head's shapes
// agree with the oneDNN path they replace.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/narrow_gemm.h"
#include "gemm_check.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {

bool run_narrow(const Gemm& g, const Data& d, std::vector<float>& c) {
  c = d.c0;
  return cpu::narrow_gemm(g.ta, g.tb, g.M, g.N, g.K, g.alpha, d.a.data(), g.lda(), d.b.data(), g.ldb(), g.beta,
                          g.bias ? d.bias.data() : nullptr, c.data(), g.ldc());
}

// The shapes of the sweep: narrow size n in each position, the two other dimensions from
// ragged pairs, epilogue options cycling through the cases.
std::vector<Gemm> sweep() {
  std::vector<Gemm> out;
  const int64_t narrow[] = {1, 7, 8, 10, 12, 13, 16, 17};  // around the routing thresholds
  const int64_t large[][2] = {{129, 257}, {1027, 67}};
  const float betas[] = {0.0f, 1.0f, 0.5f};
  int n_case = 0;
  for (int t = 0; t < 4; ++t)
    for (int pos = 0; pos < 3; ++pos)
      for (int64_t n : narrow)
        for (const auto& big : large) {
          Gemm g;
          g.ta = t & 1;
          g.tb = t & 2;
          const int64_t dims[3] = {pos == 0 ? n : big[0], pos == 1 ? n : (pos == 0 ? big[0] : big[1]),
                                   pos == 2 ? n : big[1]};
          g.M = dims[0], g.N = dims[1], g.K = dims[2];
          g.pad = (n_case % 3) * 5;
          g.alpha = n_case % 2 ? 1.0f : -0.75f;
          g.beta = betas[n_case % 3];
          g.bias = n_case % 4 == 1;
          g.nan_c = g.beta == 0.0f && n_case % 2 == 0;
          out.push_back(g);
          ++n_case;
        }
  return out;
}

}  // namespace

TEST(NarrowGemm, AppliesOnlyToNarrowShapesBigEnoughToMatter) {
  // The MLP head (linear 1024 -> 10 at batch 128): forward, dx, dW.
  EXPECT_TRUE(cpu::narrow_gemm_applies(false, true, 128, 10, 1024, 1.0f));
  EXPECT_TRUE(cpu::narrow_gemm_applies(false, false, 128, 1024, 10, 1.0f));
  EXPECT_TRUE(cpu::narrow_gemm_applies(true, false, 10, 1024, 128, 1.0f));
  // No dimension <= 16, or too little work, or alpha = 0 (C = beta C), or a kind where
  // oneDNN measured as fast (K 13..16, a narrow N in NN/TN, TT with a narrow M or N, NT
  // with a narrow side of 16): the usual path.
  EXPECT_FALSE(cpu::narrow_gemm_applies(false, false, 128, 1024, 16, 1.0f));
  EXPECT_FALSE(cpu::narrow_gemm_applies(false, false, 4096, 10, 256, 1.0f));
  EXPECT_FALSE(cpu::narrow_gemm_applies(true, false, 1024, 10, 1024, 1.0f));
  EXPECT_FALSE(cpu::narrow_gemm_applies(true, true, 10, 1024, 1024, 1.0f));
  EXPECT_FALSE(cpu::narrow_gemm_applies(false, true, 4096, 16, 256, 1.0f));
  EXPECT_FALSE(cpu::narrow_gemm_applies(false, true, 128, 1024, 10, 1.0f));
  EXPECT_TRUE(cpu::narrow_gemm_applies(false, true, 128, 1024, 8, 1.0f));
  EXPECT_FALSE(cpu::narrow_gemm_applies(false, true, 2048, 768, 768, 1.0f));
  EXPECT_FALSE(cpu::narrow_gemm_applies(false, false, 1024, 1024, 10, 1.0f));  // kstat only up to 4M
  EXPECT_FALSE(cpu::narrow_gemm_applies(false, false, 128, 1024, 17, 1.0f));
  EXPECT_FALSE(cpu::narrow_gemm_applies(false, false, 16, 16, 16, 1.0f));
  EXPECT_FALSE(cpu::narrow_gemm_applies(false, false, 64, 63, 16, 1.0f));
  EXPECT_FALSE(cpu::narrow_gemm_applies(false, false, 128, 1024, 10, 0.0f));
  EXPECT_FALSE(cpu::narrow_gemm_applies(false, false, 128, 1024, 0, 1.0f));
}

TEST(NarrowGemm, MatchesF64ReferenceOnAllTransposesAndThreadCounts) {
  int handled = 0;
  for (const Gemm& g : sweep()) {
    const Data d = make_data(g, 1000 + g.M * 7 + g.N * 3 + g.K);
    std::vector<float> c1, c2;
    bool took1, took2;
    {
      ThreadCount one(1);
      took1 = run_narrow(g, d, c1);
    }
    {
      ThreadCount two(2);
      took2 = run_narrow(g, d, c2);
    }
    ASSERT_EQ(took1, took2) << g.str();
    ASSERT_EQ(took1, cpu::narrow_gemm_applies(g.ta, g.tb, g.M, g.N, g.K, g.alpha)) << g.str();
    if (!took1) {  // refused: C untouched (bitwise, NaN included)
      EXPECT_EQ(std::memcmp(c1.data(), d.c0.data(), c1.size() * sizeof(float)), 0) << g.str();
      continue;
    }
    ++handled;
    EXPECT_TRUE(check(g, d, c1));
    // Each element is summed by one thread in a fixed order: the thread count changes nothing.
    EXPECT_EQ(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)), 0) << g.str() << ": 1 vs 2 threads";
  }
  // The sweep must exercise the path (17, the too-small n = 1 cases and the kinds left to
  // oneDNN are refused).
  EXPECT_GE(handled, 50);
}

// Shapes with enough work to be split across two threads (the sweep's run on one): every
// path (dot with N or M narrow, kstat, bcast with M narrow, packed TT), 1 vs 2 threads.
TEST(NarrowGemm, SplitAcrossThreadsMatchesReferenceAndOneThread) {
  const Gemm shapes[] = {
      {false, true, 600, 10, 1024, 3, 1.0f, 0.0f, true, true},    // dot, N narrow (linear forward)
      {false, true, 10, 600, 1030, 0, 0.5f, 1.0f, false, false},  // dot, M narrow
      {false, false, 1024, 512, 8, 5, 1.0f, 0.5f, false, false},  // kstat (dx-like), 4M: the largest it takes
      {true, false, 10, 1030, 600, 0, 1.0f, 1.0f, false, false},  // bcast, M narrow (dW, accumulated)
      {true, true, 1024, 512, 8, 2, -1.0f, 0.0f, true, true},     // TT, narrow K: packed op(B), kstat
  };
  for (const Gemm& g : shapes) {
    ASSERT_GE(g.M * g.N * g.K, 2 * cpu::kNarrowWorkPerThread) << g.str() << " would run on one thread";
    const Data d = make_data(g, 4242 + g.K);
    std::vector<float> c1, c2;
    {
      ThreadCount one(1);
      ASSERT_TRUE(run_narrow(g, d, c1)) << g.str();
    }
    {
      ThreadCount two(2);
      ASSERT_TRUE(run_narrow(g, d, c2)) << g.str();
    }
    EXPECT_TRUE(check(g, d, c2));
    EXPECT_EQ(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)), 0) << g.str() << ": 1 vs 2 threads";
  }
}

TEST(NarrowGemm, PortableKernelMatchesF64Reference) {
  ThreadCount two(2);
  for (const Gemm& g : sweep()) {
    if (std::min({g.M, g.N, g.K}) > cpu::kNarrowMaxDim) continue;
    const Data d = make_data(g, 77 + g.M + g.N * 5 + g.K * 11);
    std::vector<float> c = d.c0;
    cpu::detail::narrow_gemm_portable(g.ta, g.tb, g.M, g.N, g.K, g.alpha, d.a.data(), g.lda(), d.b.data(), g.ldb(),
                                      g.beta, g.bias ? d.bias.data() : nullptr, c.data(), g.ldc());
    EXPECT_TRUE(check(g, d, c));
  }
}

TEST(NarrowGemm, SwitchedOffItRefuses) {
  const Gemm g{false, false, 128, 1024, 10};
  const Data d = make_data(g, 5);
  std::vector<float> c;
  cpu::set_narrow_gemm_enabled(false);
  const bool took = run_narrow(g, d, c);
  cpu::set_narrow_gemm_enabled(true);
  EXPECT_FALSE(took);
  EXPECT_EQ(c, d.c0);
  EXPECT_TRUE(run_narrow(g, d, c));
  EXPECT_TRUE(check(g, d, c));
}

// cpu::gemm / cpu::gemm_bias on the MLP head's three GEMMs: the narrow path (now taken)
// and the oneDNN path (switch off) both match the f64 reference, and each other within
// f32 rounding.
TEST(NarrowGemm, PublicGemmEntryPointsOnMlpHeadShapes) {
  ThreadCount two(2);
  // {ta, tb, M, N, K, pad, alpha, beta, bias, nan_c}
  const Gemm shapes[] = {
      {false, true, 128, 10, 1024, 0, 1.0f, 0.0f, true, true},    // y = x W^T + b
      {false, false, 128, 1024, 10, 0, 1.0f, 0.0f, false, true},  // dx = g W
      {true, false, 10, 1024, 128, 0, 1.0f, 0.0f, false, true},   // dW = g^T x
      {true, false, 10, 1024, 128, 0, 1.0f, 1.0f, false, false},  // dW += g^T x (gradient accumulation)
  };
  for (const Gemm& g : shapes) expect_fast_path_matches_onednn(g, 31 + g.K, cpu::set_narrow_gemm_enabled, "narrow path");
}

}  // namespace athanor
