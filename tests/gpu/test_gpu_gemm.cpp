// cuBLASLt GEMM (src/backend/cuda/gemm.h) against a naive row-major product in double on
// the same (rounded) inputs. Tolerances: f32 without TF32 1e-5 relative to the row's
// magnitude; TF32 and bf16/f16 inputs (f32 accumulation) by their input rounding.
#include <cmath>

#include "athanor/core/error.h"
#include "athanor/core/half.h"
#include "backend/cuda/gemm.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

namespace {
double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

// C[b] = op(A[b]) op(B[b]) + bias, then GELU; A, B as given (already rounded to the dtype).
std::vector<double> reference(const std::vector<float>& A, const std::vector<float>& B, const std::vector<float>& bias,
                              bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t batch, bool gelu) {
  std::vector<double> C(batch * M * N);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = bias.empty() ? 0.0 : bias[j];
        for (int64_t k = 0; k < K; ++k) {
          const double a = A[b * M * K + (ta ? k * M + i : i * K + k)];
          const double bb = B[b * K * N + (tb ? j * K + k : k * N + j)];
          s += a * bb;
        }
        C[(b * M + i) * N + j] = gelu ? gelu_tanh(s) : s;
      }
  return C;
}

template <class H>
std::vector<H> narrow(const std::vector<float>& v) {
  std::vector<H> r;
  for (float x : v) r.emplace_back(x);
  return r;
}
template <class H>
std::vector<float> widen(const std::vector<H>& v) {
  std::vector<float> r;
  for (H x : v) r.push_back(static_cast<float>(x));
  return r;
}

struct Case {
  bool ta, tb;
  int64_t M, N, K, batch;
  cuda::GemmEpilogue epi;
};
const Case kCases[] = {
    {false, false, 64, 96, 128, 1, cuda::GemmEpilogue::none},
    {false, true, 33, 48, 72, 1, cuda::GemmEpilogue::bias},       // x W^T + b: nn.Linear's forward
    {true, false, 40, 24, 56, 1, cuda::GemmEpilogue::none},       // dW = dY^T X
    {false, true, 16, 64, 32, 1, cuda::GemmEpilogue::bias_gelu},  // the MLP's c_fc
    {false, false, 24, 32, 40, 3, cuda::GemmEpilogue::gelu},      // batched
};

template <class H>
void run_cases(DType dt, bool tf32, double rtol) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(dtype_name(dt)) + (tf32 ? " tf32" : "") + " ta=" + std::to_string(c.ta) +
                 " tb=" + std::to_string(c.tb) + " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) +
                 " K=" + std::to_string(c.K) + " batch=" + std::to_string(c.batch));
    auto A = random_vector(c.batch * c.M * c.K, 1), B = random_vector(c.batch * c.K * c.N, 2);
    const bool has_bias = c.epi == cuda::GemmEpilogue::bias || c.epi == cuda::GemmEpilogue::bias_gelu;
    auto bias = has_bias ? random_vector(c.N, 3) : std::vector<float>{};
    cuda::GemmArgs g;
    g.dtype = dt;
    g.trans_a = c.ta;
    g.trans_b = c.tb;
    g.m = c.M;
    g.n = c.N;
    g.k = c.K;
    g.epilogue = c.epi;
    g.batch = c.batch;
    g.stride_a = c.M * c.K;
    g.stride_b = c.K * c.N;
    g.stride_c = c.M * c.N;
    g.allow_tf32 = tf32;
    std::vector<float> got;
    if constexpr (std::is_same_v<H, float>) {
      DeviceBuffer<float> dA(A), dB(B), dBias(bias.empty() ? std::vector<float>{0.0f} : bias), dC(c.batch * c.M * c.N);
      g.a = dA.ptr;
      g.b = dB.ptr;
      g.c = dC.ptr;
      g.bias = has_bias ? dBias.ptr : nullptr;
      cuda::gemm(g, 0, stream());
      got = dC.host();
    } else {
      auto hA = narrow<H>(A), hB = narrow<H>(B), hBias = narrow<H>(bias.empty() ? std::vector<float>{0.0f} : bias);
      A = widen(hA);
      B = widen(hB);
      if (has_bias) bias = widen(hBias);
      DeviceBuffer<H> dA(hA), dB(hB), dBias(hBias), dC(c.batch * c.M * c.N);
      g.a = dA.ptr;
      g.b = dB.ptr;
      g.c = dC.ptr;
      g.bias = has_bias ? dBias.ptr : nullptr;
      cuda::gemm(g, 0, stream());
      got = widen(dC.host());
    }
    const auto want = reference(A, B, bias, c.ta, c.tb, c.M, c.N, c.K, c.batch,
                                c.epi == cuda::GemmEpilogue::gelu || c.epi == cuda::GemmEpilogue::bias_gelu);
    // Products of inputs in [-1, 1]: errors scale with sqrt(K), so atol as well as rtol.
    EXPECT_TRUE(all_close(got, want, rtol * std::sqrt(static_cast<double>(c.K)), rtol));
  }
}
}  // namespace

TEST(GpuGemm, F32WithoutTf32) {
  ATH_REQUIRE_GPU();
  run_cases<float>(DType::f32, false, 2e-6);
}
TEST(GpuGemm, F32WithTf32) {
  ATH_REQUIRE_GPU();
  run_cases<float>(DType::f32, true, 2e-3);  // 10-bit mantissa inputs
}
TEST(GpuGemm, Bf16F32Accumulation) {
  ATH_REQUIRE_GPU();
  run_cases<bfloat16>(DType::bf16, false, 8e-3);  // the output rounded to bf16 (2^-8)
}
TEST(GpuGemm, F16F32Accumulation) {
  ATH_REQUIRE_GPU();
  run_cases<float16>(DType::f16, false, 2e-3);  // the output rounded to f16 (2^-11)
}
TEST(GpuGemm, HeuristicsAreCachedPerShape) {
  ATH_REQUIRE_GPU();
  DeviceBuffer<float> a(64 * 64), b(64 * 64), c(64 * 64);
  cuda::GemmArgs g;
  g.m = g.n = g.k = 64;
  g.a = a.ptr;
  g.b = b.ptr;
  g.c = c.ptr;
  cuda::gemm(g, 0, stream());
  const auto plans = cuda::gemm_cached_plans(0);
  cuda::gemm(g, 0, stream());
  EXPECT_EQ(cuda::gemm_cached_plans(0), plans);
  g.k = 32;
  cuda::gemm(g, 0, stream());
  EXPECT_EQ(cuda::gemm_cached_plans(0), plans + 1);
}
TEST(GpuGemm, BadArgumentsAreErrors) {
  ATH_REQUIRE_GPU();
  cuda::GemmArgs g;
  g.dtype = DType::i32;
  g.m = g.n = g.k = 4;
  EXPECT_THROW(cuda::gemm(g, 0, stream()), Error);
  g.dtype = DType::f32;
  g.epilogue = cuda::GemmEpilogue::bias;  // no bias pointer
  EXPECT_THROW(cuda::gemm(g, 0, stream()), Error);
}
