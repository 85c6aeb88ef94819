// The host-side checks of the f64 CUDA paths, which run without a GPU (they fail before any
// launch and before the device is touched):
//  - cuBLASLt GEMMs in f64 take no epilogue: gemm() says so, try_gemm() declines (the caller's
//    unfused path), TF32 with f64 operands and c_f32 with f64 operands are errors;
//  - the f64 attention kernel's dims check (attention_f64.h).
#include <string>

#include "athanor/core/error.h"
#include "backend/cuda/attention_f64.h"
#include "backend/cuda/gemm.h"
#include "gpu_test.h"
#include "test_util.h"

using namespace athanor;
using athanor::testing::error_message;

namespace {

cuda::GemmArgs f64_gemm(cuda::GemmEpilogue epi) {
  cuda::GemmArgs g;
  g.dtype = DType::f64;
  g.m = g.n = g.k = 8;
  g.epilogue = epi;
  static double bias[8];
  g.bias = bias;  // never read: the checks come first
  return g;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(GpuF64Checks, F64GemmsTakeNoEpilogueBeforeAnyLaunch) {
  for (cuda::GemmEpilogue epi : {cuda::GemmEpilogue::bias, cuda::GemmEpilogue::relu, cuda::GemmEpilogue::bias_gelu,
                                 cuda::GemmEpilogue::dgelu, cuda::GemmEpilogue::bias_grad}) {
    SCOPED_TRACE(static_cast<int>(epi));
    const std::string m = error_message([&] { cuda::gemm(f64_gemm(epi), 0, nullptr); });
    EXPECT_TRUE(contains(m, "f64 GEMMs take no epilogue")) << m;
    EXPECT_TRUE(contains(m, "hint:")) << m;
    EXPECT_FALSE(cuda::try_gemm(f64_gemm(epi), 0, nullptr));  // declined: nothing launched, no device touched
  }
  cuda::GemmArgs tf32 = f64_gemm(cuda::GemmEpilogue::none);
  tf32.allow_tf32 = true;
  EXPECT_TRUE(contains(error_message([&] { cuda::gemm(tf32, 0, nullptr); }), "allow_tf32 with f64 operands"));
  cuda::GemmArgs c32 = f64_gemm(cuda::GemmEpilogue::none);
  c32.c_f32 = true;
  EXPECT_TRUE(contains(error_message([&] { cuda::gemm(c32, 0, nullptr); }), "c_f32 is for 16-bit operands"));
}

TEST(GpuF64Checks, F64AttentionRejectsBadDims) {
  const cuda::AttentionDims ok{.B = 2, .H = 4, .Tq = 5, .Tk = 7, .D = 3, .Dv = 6, .Hkv = 2};
  EXPECT_NO_THROW(cuda::attention_f64_check(ok, "test"));
  cuda::AttentionDims d = ok;
  d.Hkv = 3;  // does not divide H = 4
  EXPECT_TRUE(contains(error_message([&] { cuda::attention_f64_check(d, "test"); }), "Hkv must divide H"));
  d = ok;
  d.Dv = 0;
  EXPECT_TRUE(contains(error_message([&] { cuda::attention_f64_check(d, "test"); }), "bad attention dims"));
  d = ok;
  d.H = 70000, d.Hkv = 70000;
  EXPECT_TRUE(contains(error_message([&] { cuda::attention_f64_check(d, "test"); }), "at most 65535 heads"));
}
