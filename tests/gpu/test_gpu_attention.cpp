// The CUDA flash attention (src/backend/cuda/attention.h) against the CPU kernel
// (cpu::attention_forward/backward) on the same rounded inputs: forward (O and lse) and
// backward (dQ, dK, dV), causal and not, T not a multiple of the tiles, Tq != Tk, head dims 64
// and 128 and the padded ones (8, 16, 20, 48, 80, 96, 160, 256: run at 32, 64, 128 or 256 with
// zero columns; 20 in bf16 also takes the scalar loads), f32/bf16/f16, the contiguous,
// packed-qkv and gapped (row stride not a multiple of 16 bytes: the scalar load path)
// layouts, grouped-query attention (the CPU runs it on K and V repeated per query head, and
// dK/dV are summed over each group), a grid that fills the GPU; then bit-identical reruns,
// the bad-input errors and the padded head dim choice (these run without a GPU too).
//
// Every case also checks bounds: each output buffer starts filled with a sentinel and every
// element outside the operand's rows (guards around the buffer, the gaps between rows, the
// other operands' columns of a packed buffer) must still hold it afterwards.
//
// Tolerances, as max |gpu - cpu| / max |cpu| over the tensor (both f32 accumulation; bf16/f16
// differ by the rounding of O, P and dS as product operands in other orders):
//   f32: O 2e-5, grads 5e-5;  f16: O 3e-3, grads 5e-3;  bf16: O 1e-2, grads 2e-2;
//   lse (f32 everywhere): 5e-5 absolute.
// (A CPU emulation of these kernels against a double-precision reference measured, on this
// file's shapes: f32 7e-7, f16 4.5e-4, bf16 3.9e-3; the CPU kernel has errors of its own.)
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "athanor/core/error.h"
#include "athanor/core/half.h"
#include "attention_test_case.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/attention_fast.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;
using namespace athanor::gpu_test::attention_case;

namespace {

// One GPU run of a case (forward, then backward on its O and lse), bounds checked. These are
// the tests of attention.cu's kernels: pinned to them, whatever the process's default (the
// fast bf16/f16 kernels have their own, test_gpu_attention_fast.cpp).
template <class H> GpuResult<H> run_gpu(const Case& c, const Inputs<H>& x) {
  struct PinReference {
    cuda::AttentionImpl was = cuda::attention_impl();
    PinReference() { cuda::set_attention_impl(cuda::AttentionImpl::reference); }
    ~PinReference() { cuda::set_attention_impl(was); }
  } pin;
  GpuRun<H> run(c, x);
  run.forward();
  run.backward();
  return run.result();
}

template <class H> void check_case(const Case& c, unsigned seed = 1) {
  SCOPED_TRACE(describe(c));
  const Inputs<H> x = inputs<H>(c, seed);
  const CpuResult<H> cpu = cpu_reference(c, x);
  const GpuResult<H> g = run_gpu<H>(c, x);
  expect_close_to(g, cpu, tol_for<H>());
}

}  // namespace

// ---- f32 (the FMA path) -----------------------------------------------------------------
TEST(GpuAttention, F32CausalD64TNotTileMultiple) {
  ATH_REQUIRE_GPU();
  check_case<float>({2, 3, 3, 77, 77, 64, true, Lay::contiguous});
}
TEST(GpuAttention, F32NonCausalTqNeTkD128) {
  ATH_REQUIRE_GPU();
  check_case<float>({2, 2, 2, 50, 131, 128, false, Lay::contiguous});
}
// Keys past the last query (Tk > Tq, causal): their dK/dV blocks see no query and write zeros.
TEST(GpuAttention, F32CausalTkLongerGqa4to2) {
  ATH_REQUIRE_GPU();
  check_case<float>({1, 4, 2, 40, 150, 64, true, Lay::contiguous});
}
TEST(GpuAttention, F32CausalTqLongerGapped) {
  ATH_REQUIRE_GPU();
  check_case<float>({1, 2, 2, 90, 40, 64, true, Lay::gapped});
}
TEST(GpuAttention, F32PackedGqa4to1D128) {
  ATH_REQUIRE_GPU();
  check_case<float>({2, 4, 1, 70, 70, 128, true, Lay::packed});
}

// ---- bf16 / f16 (tensor cores) ------------------------------------------------------------
TEST(GpuAttention, Bf16CausalPackedD64) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({2, 4, 4, 200, 200, 64, true, Lay::packed});
}
TEST(GpuAttention, Bf16NonCausalTqNeTkD128) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 3, 3, 33, 100, 128, false, Lay::contiguous});
}
TEST(GpuAttention, Bf16CausalPackedGqa4to1) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({2, 4, 1, 96, 96, 64, true, Lay::packed});
}
TEST(GpuAttention, Bf16CausalGappedGqa4to2D128) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 4, 2, 70, 70, 128, true, Lay::gapped});
}
TEST(GpuAttention, F16CausalGqa4to2D128) {
  ATH_REQUIRE_GPU();
  check_case<float16>({1, 4, 2, 130, 130, 128, true, Lay::contiguous});
}
TEST(GpuAttention, F16NonCausalPackedD64) {
  ATH_REQUIRE_GPU();
  check_case<float16>({2, 2, 2, 64, 64, 64, false, Lay::packed});
}
TEST(GpuAttention, F16NonCausalTqNeTkGappedD64) {
  ATH_REQUIRE_GPU();
  check_case<float16>({1, 2, 2, 100, 37, 64, false, Lay::gapped});
}
// Grids larger than the GPU's 132 SMs (forward 512 blocks, dK/dV 512, dQ 512).
TEST(GpuAttention, Bf16FillsTheGpuGpt2Like) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({4, 16, 16, 512, 512, 64, true, Lay::packed});
}
TEST(GpuAttention, F16FillsTheGpuLlamaLike) {
  ATH_REQUIRE_GPU();
  check_case<float16>({2, 32, 8, 256, 256, 128, true, Lay::contiguous});
}

// ---- padded head dims (the kernels run at 32, 64, 128, 256; columns past D are zero) ------
// GPT-char's 48, the tiny test GPTs' 16, 80/96 of other models, 160 and 256 above 128, 8 and
// 20 at the small end (20: D * 2 bytes is not a multiple of 16, so bf16 loads are scalar).
// The bound checks of run_gpu also see that nothing past column D of a row is written (the
// gapped layout's 3 elements after each row, the neighbouring head's columns when packed).
TEST(GpuAttention, F32CausalD16Contiguous) {
  ATH_REQUIRE_GPU();
  check_case<float>({2, 3, 3, 45, 45, 16, true, Lay::contiguous});
}
TEST(GpuAttention, F32NonCausalD48Packed) {
  ATH_REQUIRE_GPU();
  check_case<float>({2, 4, 4, 70, 70, 48, false, Lay::packed});
}
TEST(GpuAttention, F32CausalD80GappedGqa4to2) {
  ATH_REQUIRE_GPU();
  check_case<float>({1, 4, 2, 60, 60, 80, true, Lay::gapped});
}
TEST(GpuAttention, F32NonCausalTqNeTkD80Contiguous) {
  ATH_REQUIRE_GPU();
  check_case<float>({1, 2, 2, 40, 75, 80, false, Lay::contiguous});
}
TEST(GpuAttention, F32CausalD160Gqa2to1) {
  ATH_REQUIRE_GPU();
  check_case<float>({1, 2, 1, 50, 50, 160, true, Lay::contiguous});
}
TEST(GpuAttention, F32NonCausalD256Packed) {
  ATH_REQUIRE_GPU();
  check_case<float>({1, 2, 2, 40, 40, 256, false, Lay::packed});
}
TEST(GpuAttention, F32CausalD20Contiguous) {
  ATH_REQUIRE_GPU();
  check_case<float>({1, 2, 2, 33, 33, 20, true, Lay::contiguous});
}
TEST(GpuAttention, Bf16CausalD48PackedGptChar) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({2, 4, 4, 100, 100, 48, true, Lay::packed});
}
TEST(GpuAttention, Bf16NonCausalTqNeTkD48Contiguous) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 3, 3, 33, 70, 48, false, Lay::contiguous});
}
TEST(GpuAttention, Bf16CausalD16Packed) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({2, 2, 2, 80, 80, 16, true, Lay::packed});
}
TEST(GpuAttention, Bf16NonCausalD16Contiguous) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 2, 2, 50, 50, 16, false, Lay::contiguous});
}
TEST(GpuAttention, Bf16CausalD80Gqa4to2) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 4, 2, 90, 90, 80, true, Lay::contiguous});
}
TEST(GpuAttention, Bf16NonCausalD80Packed) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({2, 2, 2, 50, 50, 80, false, Lay::packed});
}
TEST(GpuAttention, Bf16CausalD256PackedGqa4to2) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 4, 2, 70, 70, 256, true, Lay::packed});
}
TEST(GpuAttention, Bf16NonCausalTqNeTkD160) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 2, 2, 30, 65, 160, false, Lay::contiguous});
}
TEST(GpuAttention, Bf16CausalD20ScalarLoads) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 2, 2, 40, 40, 20, true, Lay::contiguous});
}
TEST(GpuAttention, F16CausalD96GappedAndD8) {
  ATH_REQUIRE_GPU();
  check_case<float16>({1, 2, 2, 70, 70, 96, true, Lay::gapped});
  check_case<float16>({1, 2, 2, 40, 40, 8, false, Lay::contiguous});
}

// Two runs, the same bits: no atomics, fixed reduction orders (GQA's dK/dV sums over the
// group included).
TEST(GpuAttention, BackwardBitIdenticalAcrossRuns) {
  ATH_REQUIRE_GPU();
  for (const Case c : {Case{2, 8, 2, 300, 300, 128, true, Lay::contiguous}, Case{2, 6, 6, 129, 129, 64, true, Lay::packed}}) {
    const auto x = inputs<bfloat16>(c, 7);  // seeds 7, 8, 9, 10
    expect_same_bits(run_gpu<bfloat16>(c, x), run_gpu<bfloat16>(c, x));
  }
  const Case c{1, 4, 2, 77, 77, 64, true, Lay::contiguous};
  const auto x = inputs<float>(c, 11);  // seeds 11, 12, 13, 14
  const auto a = run_gpu<float>(c, x), b = run_gpu<float>(c, x);
  EXPECT_TRUE(bits_equal(a.dq, b.dq) && bits_equal(a.dk, b.dk) && bits_equal(a.dv, b.dv));
}

// ---- bad input: errors before any work (no GPU needed) --------------------------------------
namespace {
std::string error_of(const cuda::AttentionDims& d, DType dt) {
  float dummy[4] = {};
  try {
    cuda::attention_forward(dummy, dummy, dummy, dummy, dummy, d, cuda::AttentionLayout::contiguous(d), true, 0.125, dt,
                            nullptr);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST(GpuAttention, BadInputIsAClearError) {
  const auto has = [](const std::string& s, const char* w) { return s.find(w) != std::string::npos; };
  std::string e = error_of({1, 2, 16, 16, 264, 264}, DType::bf16);
  EXPECT_TRUE(has(e, "head dim D=264") && has(e, "1 <= D <= 256")) << e;
  e = error_of({1, 2, 16, 16, 0, 0}, DType::f32);
  EXPECT_TRUE(has(e, "head dim D=0") && has(e, "1 <= D <= 256")) << e;
  e = error_of({1, 4, 16, 16, 64, 64, 3}, DType::bf16);
  EXPECT_TRUE(has(e, "Hkv=3") && has(e, "H=4")) << e;
  e = error_of({1, 2, 16, 16, 64, 64}, DType::f64);
  EXPECT_TRUE(has(e, "dtype f64")) << e;
  e = error_of({1, 2, 16, 16, 64, 128}, DType::f32);
  EXPECT_TRUE(has(e, "D=64") && has(e, "Dv=128")) << e;
  e = error_of({1, 2, 0, 16, 64, 64}, DType::f32);
  EXPECT_TRUE(has(e, "Tq=0")) << e;
  const cuda::AttentionDims ok{1, 2, 16, 16, 64, 64};
  try {
    cuda::attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, ok, cuda::AttentionLayout::contiguous(ok),
                            true, 0.125, DType::f32, nullptr);
    ADD_FAILURE() << "null pointers accepted";
  } catch (const Error& err) {
    EXPECT_TRUE(has(err.what(), "null operand")) << err.what();
  }
  try {
    cuda::AttentionLayout::packed_qkv({1, 2, 16, 17, 64, 64});
    ADD_FAILURE() << "packed_qkv with Tq != Tk accepted";
  } catch (const Error& err) {
    EXPECT_TRUE(has(err.what(), "Tq == Tk")) << err.what();
  }
}

// The padded head dim the kernels run at, and which head dims attention_check lets through
// (host logic: runs without a GPU).
TEST(GpuAttention, PaddedHeadDimChoice) {
  const std::vector<std::pair<int64_t, int64_t>> want = {{1, 32},    {8, 32},    {16, 32},   {20, 32},  {32, 32},
                                                         {33, 64},   {48, 64},   {64, 64},   {65, 128}, {80, 128},
                                                         {96, 128},  {112, 128}, {128, 128}, {129, 256}, {160, 256},
                                                         {256, 256}, {257, 0},   {512, 0},   {0, 0},    {-8, 0}};
  for (const auto& [D, Dp] : want) EXPECT_EQ(cuda::attention_padded_head_dim(D), Dp) << "D=" << D;
  EXPECT_EQ(cuda::kAttentionMaxHeadDim, 256);
  for (const int64_t D : {8, 16, 20, 48, 80, 96, 160, 256}) {
    const cuda::AttentionDims d{2, 4, 33, 33, D, D, 2};
    for (const DType dt : {DType::f32, DType::bf16, DType::f16}) {
      EXPECT_NO_THROW(cuda::attention_check(d, cuda::AttentionLayout::contiguous(d), dt, "test")) << "D=" << D;
      EXPECT_NO_THROW(cuda::attention_check(d, cuda::AttentionLayout::packed_qkv(d), dt, "test")) << "D=" << D;
    }
  }
  const cuda::AttentionDims big{1, 2, 16, 16, 257, 257};
  EXPECT_THROW(cuda::attention_check(big, cuda::AttentionLayout::contiguous(big), DType::f32, "test"), Error);
}
