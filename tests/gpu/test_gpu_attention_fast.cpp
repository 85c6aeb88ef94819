// The fast CUDA flash attention (src/backend/cuda/attention_fast.h, taken by attention_forward
// and attention_backward under ATHANOR_CUDA_ATTENTION=fast) against the CPU kernel
// (cpu::attention_forward/backward on the same rounded inputs) and against the reference CUDA
// kernels (attention.cu): O and lse of the fast forward, dQ, dK, dV of the fast backward, and
// the two mixed pairs (fast forward + reference backward, reference forward + fast backward:
// the implementations must be interchangeable, same lse). bf16 and f16, D 64 and 128,
// causal and not, T not a multiple of the 64-row tiles, Tq != Tk (non-causal and causal), packed
// and contiguous layouts, grouped-query attention (H 8, Hkv 2), a grid that fills the GPU.
// Every output buffer starts filled with a sentinel that must survive outside the operands.
// GpuAttentionFast runs every case in the default tile configuration; GpuAttentionFastTiles runs
// the same cases in every other one (ATHANOR_CUDA_ATTENTION_TILES, attention_fast.h): each
// forward and each backward configuration against the reference kernels and the CPU, in both
// mixed pairs, and bit-identical across runs (configurations may sum in other orders, so only
// the tolerances hold between them).
// Then the host logic (no GPU needed): the switches' parsing and the fast path's preconditions.
//
// Tolerances are the GpuAttention tests' (test_gpu_attention.cpp), max |got - want| / max |want|:
//   f16: O 3e-3, grads 5e-3;  bf16: O 1e-2, grads 2e-2;  lse (f32): 5e-5 absolute.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "athanor/core/error.h"
#include "athanor/core/half.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/attention_fast.h"
#include "backend/cuda/candidates.h"
#include "attention_test_case.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;
using namespace athanor::gpu_test::attention_case;

namespace {

// Restores the process's implementation choice at scope end.
struct ImplGuard {
  cuda::AttentionImpl saved = cuda::attention_impl();
  explicit ImplGuard(cuda::AttentionImpl impl) { cuda::set_attention_impl(impl); }
  ~ImplGuard() { cuda::set_attention_impl(saved); }
};

// Restores the process's tile configurations at scope end.
struct TilesGuard {
  cuda::AttentionTiles saved = cuda::attention_tiles();
  explicit TilesGuard(cuda::AttentionTiles tiles) { cuda::set_attention_tiles(tiles); }
  ~TilesGuard() { cuda::set_attention_tiles(saved); }
};

using Tiles = std::vector<cuda::AttentionTiles>;
// The configurations GpuAttentionFastTiles runs every case in: each non-default forward and each
// non-default backward configuration at least once (forward and backward are independent
// kernels; the mixed pairs below check each against the reference's other half). The first
// entry of each list is the default (attention_fast.h).
Tiles variant_tiles() {
  Tiles out;
  const std::size_t nf = std::size(cuda::kFwdTilesAll), nb = std::size(cuda::kBwdTilesAll);
  for (std::size_t i = 1; i < std::max(nf, nb); ++i)
    out.push_back({cuda::kFwdTilesAll[std::min(i, nf - 1)], cuda::kBwdTilesAll[std::min(i, nb - 1)]});
  return out;
}
std::string tiles_name(const cuda::AttentionTiles& t) {
  return std::string("tiles ") + cuda::fwd_tiles_name(t.fwd) + "," + cuda::bwd_tiles_name(t.bwd);
}

// attention_forward under `fwd`, then attention_backward under `bwd` on its O and lse, in the
// tile configuration `tiles`.
using Impl = cuda::AttentionImpl;
template <class H>
GpuResult<H> run_gpu(const Case& c, Impl fwd, Impl bwd, const Inputs<H>& x,
                     cuda::AttentionTiles tiles = cuda::AttentionTiles{}) {
  const TilesGuard tiles_guard(tiles);
  const ImplGuard guard(fwd);
  // cuDNN's candidate off: with ATHANOR_CUDA_CANDIDATES=all (gpu_check.sh's candidates
  // pass) attention_forward/backward would hand these calls to cuDNN before the fast kernels, and
  // every case here would test cuDNN (test_gpu_attention_cudnn.cpp's job) instead of ours.
  const cuda::CandidateOverride no_cudnn(cuda::Candidate::attention_cudnn, false);
  GpuRun<H> run(c, x);
  // The fast cases must take the fast kernels, not fall back (or this test checks nothing new).
  EXPECT_TRUE(cuda::attention_fast_backward_supported(run.q(), run.k(), run.v(), run.o(), run.dout(), run.dq(),
                                                      run.dk(), run.dv(), run.dims(), run.layout(), dtype_of<H>));
  run.forward();
  cuda::set_attention_impl(bwd);
  run.backward();
  return run.result();
}

// The fast kernels in each configuration of `tiles` against the reference CUDA kernels (O, lse,
// dQ, dK, dV; both mixed pairs) and the CPU kernel; `with_cpu` false skips the CPU (large grids).
template <class H> void check_case(const Case& c, const Tiles& tiles_list, bool with_cpu = true, unsigned seed = 1) {
  SCOPED_TRACE(describe(c));
  const Inputs<H> x = inputs<H>(c, seed);
  const Tol t = tol_for<H>();
  const GpuResult<H> ref = run_gpu<H>(c, Impl::reference, Impl::reference, x);
  std::vector<CpuResult<H>> cpu;
  if (with_cpu) cpu.push_back(cpu_reference(c, x));
  for (const cuda::AttentionTiles& tiles : tiles_list) {
    SCOPED_TRACE(tiles_name(tiles));
    const GpuResult<H> fast = run_gpu<H>(c, Impl::fast, Impl::fast, x, tiles);
    expect_close_to(fast, ref, t, " vs the reference kernel");
    // The mixed pairs: each backward on the other forward's O and lse.
    for (const auto& [fwd, bwd, what] : {std::tuple{Impl::fast, Impl::reference, "fast fwd + reference bwd"},
                                         std::tuple{Impl::reference, Impl::fast, "reference fwd + fast bwd"}}) {
      SCOPED_TRACE(what);
      const GpuResult<H> mixed = run_gpu<H>(c, fwd, bwd, x, tiles);
      EXPECT_TRUE(close_rel_max(mixed.dq, ref.dq, t.grad, "dq vs the reference kernels"));
      EXPECT_TRUE(close_rel_max(mixed.dk, ref.dk, t.grad, "dk vs the reference kernels"));
      EXPECT_TRUE(close_rel_max(mixed.dv, ref.dv, t.grad, "dv vs the reference kernels"));
    }
    if (with_cpu) expect_close_to(fast, cpu.front(), t, " vs the CPU");
  }
}

}  // namespace

// Each case group runs twice: in GpuAttentionFast in the default configuration (the kernels that
// passed on the H200), and in GpuAttentionFastTiles in every other one. Two suites, so that
// gpu_check.sh's one process per suite keeps a fault in a variant from taking the default's
// results with it. `tiles` is the group's list of configurations.
#define FAST_CASES(name)                                                                    \
  static void name##_cases(const Tiles& tiles);                                            \
  TEST(GpuAttentionFast, name) {                                                            \
    ATH_REQUIRE_GPU();                                                                      \
    name##_cases({cuda::AttentionTiles{}});                                                 \
  }                                                                                         \
  TEST(GpuAttentionFastTiles, name) {                                                       \
    ATH_REQUIRE_GPU();                                                                      \
    name##_cases(variant_tiles());                                                          \
  }                                                                                         \
  static void name##_cases(const Tiles& tiles)

// ---- bf16 ------------------------------------------------------------------------------------
FAST_CASES(Bf16CausalPackedD64T200) { check_case<bfloat16>({2, 4, 4, 200, 200, 64, true, Lay::packed}, tiles); }
FAST_CASES(Bf16NonCausalTqNeTkD128) {
  check_case<bfloat16>({1, 3, 3, 77, 200, 128, false, Lay::contiguous}, tiles);
  check_case<bfloat16>({1, 2, 2, 130, 33, 64, false, Lay::contiguous}, tiles);
}
FAST_CASES(Bf16CausalGqa8to2D128T77) { check_case<bfloat16>({1, 8, 2, 77, 77, 128, true, Lay::contiguous}, tiles); }
// Causal with Tq != Tk (top-left aligned): rows past Tk see every key; keys past Tq none.
FAST_CASES(Bf16CausalTqNeTk) {
  check_case<bfloat16>({1, 2, 2, 90, 40, 64, true, Lay::contiguous}, tiles);
  check_case<bfloat16>({1, 4, 2, 40, 150, 128, true, Lay::contiguous}, tiles);
}
FAST_CASES(Bf16PackedGqa8to2D64) { check_case<bfloat16>({2, 8, 2, 129, 129, 64, true, Lay::packed}, tiles); }
// B * H * query tiles well over an H100's 132 SMs (4 * 32 * 4 = 512 blocks), at GPT-2's head
// dim; against the reference kernel only (the CPU would take long).
FAST_CASES(Bf16FillsTheGpu) {
  check_case<bfloat16>({4, 32, 32, 256, 256, 64, true, Lay::packed}, tiles, /*with_cpu=*/false);
  check_case<bfloat16>({2, 32, 8, 192, 192, 128, false, Lay::contiguous}, tiles, /*with_cpu=*/false);
}
// GPT-2 124M's attention (H 12, T 1024, D 64, causal, packed qkv) at batch 2, against the
// reference kernels (the CPU would take long).
FAST_CASES(Bf16Gpt2Shape) { check_case<bfloat16>({2, 12, 12, 1024, 1024, 64, true, Lay::packed}, tiles, false); }

// ---- f16 -------------------------------------------------------------------------------------
FAST_CASES(F16CausalGqa8to2D128) { check_case<float16>({1, 8, 2, 130, 130, 128, true, Lay::contiguous}, tiles); }
FAST_CASES(F16NonCausalPackedD64) {
  check_case<float16>({2, 2, 2, 64, 64, 64, false, Lay::packed}, tiles);
  check_case<float16>({2, 4, 4, 77, 77, 64, false, Lay::packed}, tiles);
}
FAST_CASES(F16CausalD64T200AndTqNeTk) {
  check_case<float16>({2, 3, 3, 200, 200, 64, true, Lay::contiguous}, tiles);
  check_case<float16>({1, 2, 2, 50, 131, 128, false, Lay::contiguous}, tiles);
}

// The fast kernels' results depend on nothing but the inputs (no atomics): D 128 with GQA and
// T 300 (not a multiple of any tile), and GPT-2's D 64 packed (the D-64-only variants).
FAST_CASES(BitIdenticalAcrossRuns) {
  for (const Case& c : {Case{2, 8, 2, 300, 300, 128, true, Lay::contiguous}, Case{2, 12, 12, 300, 300, 64, true, Lay::packed}}) {
    SCOPED_TRACE(describe(c));
    const auto x = inputs<bfloat16>(c, 7);  // seeds 7, 8, 9, 10
    for (const cuda::AttentionTiles& t : tiles) {
      SCOPED_TRACE(tiles_name(t));
      const auto a = run_gpu<bfloat16>(c, Impl::fast, Impl::fast, x, t);
      expect_same_bits(a, run_gpu<bfloat16>(c, Impl::fast, Impl::fast, x, t));
    }
  }
}

// ---- host logic (no GPU needed) --------------------------------------------------------------
TEST(GpuAttentionFast, TilesParsing) {
  EXPECT_EQ(cuda::parse_attention_tiles(nullptr), cuda::AttentionTiles{});  // the default
  EXPECT_EQ(cuda::parse_attention_tiles(""), cuda::AttentionTiles{});
  // Every name round-trips, in every pairing.
  for (const cuda::FwdTiles f : cuda::kFwdTilesAll)
    for (const cuda::BwdTiles b : cuda::kBwdTilesAll) {
      const std::string v = std::string(cuda::fwd_tiles_name(f)) + "," + cuda::bwd_tiles_name(b);
      const cuda::AttentionTiles want{f, b};
      EXPECT_EQ(cuda::parse_attention_tiles(v.c_str()), want) << v;
    }
  EXPECT_EQ(cuda::parse_attention_tiles("f128x64w4,b128x16w4"),
            (cuda::AttentionTiles{cuda::FwdTiles::f128x64w4, cuda::BwdTiles::b128x16w4}));
  EXPECT_STREQ(cuda::fwd_tiles_name(cuda::FwdTiles::f128x64w8), "f128x64w8");
  EXPECT_STREQ(cuda::bwd_tiles_name(cuda::BwdTiles::b64x64w4), "b64x64w4");
  for (const char* bad : {"f64x64w4", "f64x64w4,", ",b64x64w4", "b64x64w4,f64x64w4", "f64x64w4,b64x64w4,",
                          "F64x64w4,b64x64w4", "f64x64w4 ,b64x64w4", "f32x64w4,b64x64w4", "fast"}) {
    try {
      cuda::parse_attention_tiles(bad);
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const Error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("ATHANOR_CUDA_ATTENTION_TILES"), std::string::npos) << w;
      EXPECT_NE(w.find(std::string("'") + bad + "'"), std::string::npos) << w;
      EXPECT_NE(w.find("forward: f64x64w4, f128x64w8, f128x64w4, f64x128w4"), std::string::npos) << w;
      EXPECT_NE(w.find("backward: b64x64w4, b128x64w8, b128x16w4"), std::string::npos) << w;
    }
  }
  {
    const TilesGuard g(cuda::AttentionTiles{});
    EXPECT_EQ(cuda::attention_tiles(), cuda::AttentionTiles{});
    const cuda::AttentionTiles other{cuda::FwdTiles::f128x64w4, cuda::BwdTiles::b128x64w8};
    cuda::set_attention_tiles(other);
    EXPECT_EQ(cuda::attention_tiles(), other);
  }
  // GpuAttentionFastTiles covers every configuration but the default, forward and backward.
  const Tiles variants = variant_tiles();
  for (const cuda::FwdTiles f : cuda::kFwdTilesAll)
    EXPECT_EQ(f != cuda::AttentionTiles{}.fwd,
              std::any_of(variants.begin(), variants.end(), [&](const auto& t) { return t.fwd == f; }))
        << cuda::fwd_tiles_name(f);
  for (const cuda::BwdTiles b : cuda::kBwdTilesAll)
    EXPECT_EQ(b != cuda::AttentionTiles{}.bwd,
              std::any_of(variants.begin(), variants.end(), [&](const auto& t) { return t.bwd == b; }))
        << cuda::bwd_tiles_name(b);
  // Two m-tiles per warp and 128-key forward tiles have kernels at D 64 only; the rest at both.
  EXPECT_TRUE(cuda::attention_tiles_instantiated(cuda::FwdTiles::f128x64w4, 64));
  EXPECT_FALSE(cuda::attention_tiles_instantiated(cuda::FwdTiles::f128x64w4, 128));
  EXPECT_TRUE(cuda::attention_tiles_instantiated(cuda::FwdTiles::f64x128w4, 64));
  EXPECT_FALSE(cuda::attention_tiles_instantiated(cuda::FwdTiles::f64x128w4, 128));
  EXPECT_TRUE(cuda::attention_tiles_instantiated(cuda::FwdTiles::f128x64w8, 128));
  EXPECT_TRUE(cuda::attention_tiles_instantiated(cuda::BwdTiles::b128x64w8, 128));
  EXPECT_TRUE(cuda::attention_tiles_instantiated(cuda::BwdTiles::b128x16w4, 64));
  EXPECT_FALSE(cuda::attention_tiles_instantiated(cuda::BwdTiles::b128x16w4, 128));
}

TEST(GpuAttentionFast, SwitchParsing) {
  EXPECT_EQ(cuda::parse_attention_impl(nullptr), cuda::AttentionImpl::fast);  // the default
  EXPECT_EQ(cuda::parse_attention_impl(""), cuda::AttentionImpl::fast);
  EXPECT_EQ(cuda::parse_attention_impl("reference"), cuda::AttentionImpl::reference);
  EXPECT_EQ(cuda::parse_attention_impl("fast"), cuda::AttentionImpl::fast);
  EXPECT_EQ(cuda::parse_attention_impl("fast_fwd"), cuda::AttentionImpl::fast_fwd);
  for (const char* bad : {"FAST", "flash", "fast ", "1", "fast-fwd"}) {
    try {
      cuda::parse_attention_impl(bad);
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const Error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("ATHANOR_CUDA_ATTENTION"), std::string::npos) << w;
      EXPECT_NE(w.find(std::string("'") + bad + "'"), std::string::npos) << w;
      EXPECT_NE(w.find("'fast', 'fast_fwd'"), std::string::npos) << w;
    }
  }
  EXPECT_STREQ(cuda::attention_impl_name(cuda::AttentionImpl::fast), "fast");
  EXPECT_STREQ(cuda::attention_impl_name(cuda::AttentionImpl::reference), "reference");
  EXPECT_STREQ(cuda::attention_impl_name(cuda::AttentionImpl::fast_fwd), "fast_fwd");
  {
    const ImplGuard g(cuda::AttentionImpl::fast);
    EXPECT_EQ(cuda::attention_impl(), cuda::AttentionImpl::fast);
    cuda::set_attention_impl(cuda::AttentionImpl::reference);
    EXPECT_EQ(cuda::attention_impl(), cuda::AttentionImpl::reference);
  }
}

// Which calls the fast kernel takes; the rest fall back to attention.cu's kernels.
TEST(GpuAttentionFast, SupportedCalls) {
  alignas(16) static unsigned char buf[256];
  const void* a = buf;              // 16-byte aligned
  const void* odd = buf + 8;        // 8-byte aligned only
  const cuda::AttentionDims d64{2, 4, 100, 100, 64, 64, 2}, d128{1, 2, 77, 90, 128, 128};
  const auto L64 = cuda::AttentionLayout::contiguous(d64), P64 = cuda::AttentionLayout::packed_qkv(d64);
  const auto L128 = cuda::AttentionLayout::contiguous(d128);
  auto ok = [&](const cuda::AttentionDims& d, const cuda::AttentionLayout& L, DType dt, const void* q = nullptr) {
    return cuda::attention_fast_supported(q ? q : a, a, a, a, d, L, dt);
  };
  EXPECT_TRUE(ok(d64, L64, DType::bf16));
  EXPECT_TRUE(ok(d64, L64, DType::f16));
  EXPECT_TRUE(ok(d64, P64, DType::bf16));
  EXPECT_TRUE(ok(d128, L128, DType::bf16));
  EXPECT_FALSE(ok(d64, L64, DType::f32));  // f32 is always the reference
  EXPECT_FALSE(ok(d64, L64, DType::bf16, odd));
  for (const int64_t D : {32, 48, 80, 96, 256}) {
    const cuda::AttentionDims d{1, 2, 64, 64, D, D};
    EXPECT_FALSE(ok(d, cuda::AttentionLayout::contiguous(d), DType::bf16)) << "D=" << D;
  }
  const cuda::AttentionDims dv{1, 2, 64, 64, 64, 128};
  EXPECT_FALSE(ok(dv, cuda::AttentionLayout::contiguous(dv), DType::bf16));
  auto gapped = L64;
  gapped.k.t = 67;  // rows 134 bytes apart: not 16-byte aligned
  EXPECT_FALSE(ok(d64, gapped, DType::bf16));
  auto gapped_o = L64;
  gapped_o.o.h += 4;
  EXPECT_FALSE(ok(d64, gapped_o, DType::bf16));
  // The backward also needs dO and the gradients 16-byte aligned.
  EXPECT_TRUE(cuda::attention_fast_backward_supported(a, a, a, a, a, a, a, a, d64, L64, DType::bf16));
  for (int i = 0; i < 4; ++i) {
    const void* p[4] = {a, a, a, a};
    p[i] = odd;
    EXPECT_FALSE(cuda::attention_fast_backward_supported(a, a, a, a, p[0], p[1], p[2], p[3], d64, L64, DType::bf16))
        << "operand " << i;
  }
  EXPECT_FALSE(cuda::attention_fast_backward_supported(a, a, a, a, a, a, a, a, d64, L64, DType::f32));
}
