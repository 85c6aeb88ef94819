// Packed weights (backend/cpu/weight_packing) against oneDNN itself: our packing of W
// (forward: B = W^T; dx: B = W) must equal, byte for byte, oneDNN's reorder of the plain
// B into the blocked layout its matmul asks for; for edge shapes (K, N not multiples of
// the blocks, odd K for bf16 pairs), row shares as threads split them, and 1 and 2
// threads. gemm_packed on the packed copy must give what the plain-B GEMM gives (the same
// kernels, so the same bits) and agree with a naive f64 product.
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "athanor/core/half.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/weight_packing.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {

// W filled with distinct, exactly representable values (bf16 too), NaN-free.
template <class T> std::vector<T> make_w(int64_t rows, int64_t ld, uint32_t seed) {
  std::vector<T> w(rows * ld);
  for (size_t i = 0; i < w.size(); ++i) w[i] = T(static_cast<float>(static_cast<int>((i * 2654435761u + seed) % 509) - 254) / 64.0f);
  return w;
}

// oneDNN's own reorder of B (given as W, plain, row stride ld) into its blocked layout.
template <class T> std::vector<T> onednn_packed(const cpu::PackedLayout& l, bool w_is_bt, const std::vector<T>& w, int64_t ld) {
  using md = dnnl::memory::desc;
  const auto dt = l.bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  const md plain({l.K, l.N}, dt, w_is_bt ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1});
  const md blocked({l.K, l.N}, dt, l.bf16 ? dnnl::memory::format_tag::BA16a64b2a : dnnl::memory::format_tag::BA16a64b);
  EXPECT_EQ(static_cast<int64_t>(blocked.get_size()), l.bytes());
  std::vector<T> out(l.elements());
  dnnl::memory src(plain, eng, const_cast<T*>(w.data())), dst(blocked, eng, out.data());
  dnnl::reorder(src, dst).execute(s, src, dst);
  s.wait();
  return out;
}

template <class T> void check_packing(int64_t K, int64_t N, bool w_is_bt, int64_t pad) {
  constexpr bool bf16 = std::is_same_v<T, bfloat16>;
  const cpu::PackedLayout l = cpu::packed_layout(bf16, K, N);
  const int64_t rows = w_is_bt ? N : K, ld = (w_is_bt ? K : N) + pad;
  const std::vector<T> w = make_w<T>(rows, ld, static_cast<uint32_t>(K * 31 + N));
  const std::vector<T> want = onednn_packed(l, w_is_bt, w, ld);
  const std::string what = std::string(bf16 ? "bf16" : "f32") + (w_is_bt ? " W=B^T" : " W=B") + " K=" + std::to_string(K) +
                           " N=" + std::to_string(N) + " pad=" + std::to_string(pad);
  for (int threads : {1, 2}) {
    ThreadCount tc(threads);
    std::vector<T> got(l.elements(), T(0.0f));
    cpu::pack_weight(l, w_is_bt, w.data(), ld, got.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(T)), 0) << what << ", " << threads << " threads";
  }
  // Any split into row ranges at 16-row boundaries (even ones for bf16 W = B), in any order.
  std::vector<T> got(l.elements(), T(0.0f)), ref(l.elements(), T(0.0f));
  const int64_t cut = std::min(rows, int64_t{48});
  cpu::pack_weight_rows(l, w_is_bt, w.data(), ld, cut, rows, got.data());
  cpu::pack_weight_rows(l, w_is_bt, w.data(), ld, 0, cut, got.data());
  cpu::detail::pack_weight_rows_scalar(l, w_is_bt, w.data(), ld, 0, rows, ref.data());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(T)), 0) << what << ", split at " << cut;
  EXPECT_EQ(std::memcmp(ref.data(), want.data(), ref.size() * sizeof(T)), 0) << what << ", scalar";
}

}  // namespace

TEST(WeightPacking, MatchesOnednnReorderF32) {
  for (bool bt : {true, false})
    for (auto [K, N] : std::vector<std::pair<int64_t, int64_t>>{{784, 1024}, {256, 768}, {16, 64}, {17, 65}, {1024, 10}, {100, 130}, {3, 5}})
      for (int64_t pad : {0, 3}) check_packing<float>(K, N, bt, pad);
}

TEST(WeightPacking, MatchesOnednnReorderBf16) {
  for (bool bt : {true, false})
    for (auto [K, N] : std::vector<std::pair<int64_t, int64_t>>{{784, 1024}, {256, 768}, {32, 64}, {33, 65}, {1023, 10}, {100, 130}, {3, 5}})
      for (int64_t pad : {0, 2, 3}) check_packing<bfloat16>(K, N, bt, pad);
}

TEST(WeightPacking, ShareBoundariesCoverAllRowsOnSixteenRowSteps) {
  for (int64_t rows : {1, 15, 16, 17, 100, 1024})
    for (int threads : {1, 2, 3}) {
      EXPECT_EQ(cpu::pack_share_begin(rows, 0, threads), 0);
      EXPECT_EQ(cpu::pack_share_begin(rows, threads, threads), rows);
      for (int t = 1; t < threads; ++t) {
        const int64_t b = cpu::pack_share_begin(rows, t, threads);
        EXPECT_EQ(b % 16, 0);
        EXPECT_LE(cpu::pack_share_begin(rows, t - 1, threads), b);
      }
    }
}

// The GEMM on a packed B gives the plain-B GEMM's bits (same oneDNN kernels) and the
// naive product's values.
template <class T> void check_gemm_packed(int64_t M, int64_t N, int64_t K, bool w_is_bt, bool bias) {
  constexpr bool bf16 = std::is_same_v<T, bfloat16>;
  const cpu::PackedLayout l = cpu::packed_layout(bf16, K, N);
  const int64_t ld = w_is_bt ? K : N;
  const std::vector<T> w = make_w<T>(w_is_bt ? N : K, ld, 7), a = make_w<T>(M, K, 11), b = make_w<T>(1, N, 13);
  std::vector<T> packed(l.elements(), T(0.0f));
  cpu::pack_weight(l, w_is_bt, w.data(), ld, packed.data());
  std::vector<T> got(M * N, T(NAN)), plain(M * N, T(NAN)), ref(M * N);
  if (!cpu::gemm_packed_supported(bf16)) {
    // oneDNN reads another layout on this CPU (its ISA, printed by the test): gemm_packed
    // declines and writes nothing, and no linear asks for a packed copy it would not read.
    EXPECT_FALSE(cpu::gemm_packed<T>(M, a.data(), K, l, packed.data(), bias ? b.data() : nullptr, got.data(), N));
    EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](T v) { return std::isnan(static_cast<float>(v)); }));
    EXPECT_FALSE(cpu::gemm_prefers_packed_b(bf16, w_is_bt, 1024, N, K));
    return;
  }
  ASSERT_TRUE(cpu::gemm_packed<T>(M, a.data(), K, l, packed.data(), bias ? b.data() : nullptr, got.data(), N));
  cpu::gemm_bias<T>(false, w_is_bt, M, N, K, a.data(), K, w.data(), ld, bias ? b.data() : nullptr, plain.data(), N);
  cpu::ref::gemm<T>(false, w_is_bt, M, N, K, 1.0, a.data(), K, w.data(), ld, 0.0, ref.data(), N);
  double worst = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      const double r = static_cast<double>(static_cast<float>(ref[i * N + j])) + (bias ? static_cast<float>(b[j]) : 0.0f);
      worst = std::max(worst, std::abs(static_cast<float>(got[i * N + j]) - r) / (1.0 + std::abs(r)));
    }
  EXPECT_LT(worst, bf16 ? 2e-2 : 1e-4) << M << "x" << N << "x" << K;
  EXPECT_EQ(std::memcmp(got.data(), plain.data(), got.size() * sizeof(T)), 0) << "packed and plain B differ, " << M << "x" << N << "x" << K;
}

// Where oneDNN reads the packed layout (f32 on AVX-512; bf16 with AVX512_BF16 or AMX), the
// packed GEMM gives the plain one's bits; elsewhere it declines (check_gemm_packed).
TEST(WeightPacking, GemmOnPackedWeightsMatchesPlainGemmBitForBit) {
  note_isa("oneDNN " + cpu::onednn_isa_name() + ": packed f32 B " + (cpu::gemm_packed_supported(false) ? "read" : "not read") +
           ", packed bf16 B " + (cpu::gemm_packed_supported(true) ? "read" : "not read"));
  for (bool bt : {true, false}) {
    check_gemm_packed<float>(128, 1024, 784, bt, bt);
    check_gemm_packed<float>(37, 130, 100, bt, bt);
    check_gemm_packed<bfloat16>(128, 1024, 784, bt, bt);
    check_gemm_packed<bfloat16>(37, 130, 99, bt, bt);
  }
}

}  // namespace athanor
