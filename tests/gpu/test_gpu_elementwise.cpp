// Elementwise kernels, casts and the embedding (src/backend/cuda/elementwise.h) against the
// CPU: casts bit for bit against core/half.h's rounding, the rest against double loops.
#include <cmath>
#include <cstring>
#include <limits>

#include "athanor/core/error.h"
#include "athanor/core/half.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/device_error.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

TEST(GpuElementwise, CastsRoundAsTheCpu) {
  ATH_REQUIRE_GPU();
  // Values across the ranges: normal, bf16/f16 denormals, halfway cases, overflow to inf.
  auto x = random_vector(20000, 11, -70000.0f, 70000.0f);
  for (int i = 0; i < 2000; ++i) x[i] = std::ldexp(static_cast<float>(i + 1), -140 + i % 40);  // tiny values
  for (int i = 2000; i < 2100; ++i) x[i] = 1.0f + (2 * (i - 2000) + 1) * std::ldexp(1.0f, -9);  // bf16 ties
  x[2100] = std::numeric_limits<float>::infinity();
  x[2101] = -0.0f;
  DeviceBuffer<float> dX(x);
  DeviceBuffer<uint16_t> dB(x.size()), dH(x.size());
  DeviceBuffer<float> dBack(x.size());
  cuda::cast(dX.ptr, DType::f32, dB.ptr, DType::bf16, x.size(), stream());
  cuda::cast(dX.ptr, DType::f32, dH.ptr, DType::f16, x.size(), stream());
  const auto b = dB.host(), h = dH.host();
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(b[i], float_to_bf16_bits(x[i])) << "bf16 of " << x[i] << " (element " << i << ")";
    ASSERT_EQ(h[i], float_to_f16_bits(x[i])) << "f16 of " << x[i] << " (element " << i << ")";
  }
  cuda::cast(dH.ptr, DType::f16, dBack.ptr, DType::f32, x.size(), stream());
  const auto back = dBack.host();
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(back[i], f16_bits_to_float(h[i])) << i;
  EXPECT_THROW(cuda::cast(dX.ptr, DType::f32, dB.ptr, DType::i32, 1, stream()), Error);
}

TEST(GpuElementwise, BinaryScaleGelu) {
  ATH_REQUIRE_GPU();
  const int64_t n = 100001;
  auto a = random_vector(n, 12, -4, 4), b = random_vector(n, 13, -4, 4);
  DeviceBuffer<float> dA(a), dB(b), dY(n);
  cuda::add(dA.ptr, dB.ptr, dY.ptr, n, stream());
  auto y = dY.host();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] + b[i]) << i;
  cuda::mul(dA.ptr, dB.ptr, dY.ptr, n, stream());
  y = dY.host();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] * b[i]) << i;
  cuda::scale(dA.ptr, 0.3f, dY.ptr, n, stream());
  y = dY.host();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], 0.3f * a[i]) << i;
  cuda::gelu_tanh_forward(dA.ptr, dY.ptr, n, stream());
  std::vector<double> want(n), dwant(n);
  for (int64_t i = 0; i < n; ++i) {
    const double x = a[i], u = 0.7978845608028654 * (x + 0.044715 * x * x * x), t = std::tanh(u);
    want[i] = 0.5 * x * (1 + t);
    dwant[i] = b[i] * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x));
  }
  EXPECT_TRUE(all_close(dY.host(), want, 1e-6, 1e-5));
  cuda::gelu_tanh_backward(dB.ptr, dA.ptr, dY.ptr, n, stream());
  EXPECT_TRUE(all_close(dY.host(), dwant, 1e-5, 1e-5));
}

TEST(GpuElementwise, EmbeddingForwardAndDeterministicBackward) {
  ATH_REQUIRE_GPU();
  const int64_t V = 300, D = 96, N = 4000;  // many repeats per row: the sums have long chains
  auto w = random_vector(V * D, 14), dy = random_vector(N * D, 15);
  std::vector<int64_t> idx(N);
  for (int64_t n = 0; n < N; ++n) idx[n] = (n * 37 + n / 7) % V;
  const int64_t padding = 5;
  std::vector<float> out(N * D), dw(V * D, 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    std::memcpy(&out[n * D], &w[idx[n] * D], D * sizeof(float));
    if (idx[n] == padding) continue;
    for (int64_t c = 0; c < D; ++c) dw[idx[n] * D + c] += dy[n * D + c];  // token order, in f32
  }
  DeviceBuffer<float> dW(w), dOut(N * D), dDY(dy), dDW(std::vector<float>(V * D, 0.0f));
  DeviceBuffer<int64_t> dIdx(idx);
  cuda::embedding_forward(dW.ptr, DType::f32, dIdx.ptr, dOut.ptr, N, V, D, cuda::device_error_record(0), stream());
  EXPECT_EQ(std::memcmp(dOut.host().data(), out.data(), out.size() * 4), 0);
  cuda::embedding_backward(dDY.ptr, DType::f32, dIdx.ptr, dDW.ptr, N, V, D, padding, stream());
  const auto got = dDW.host();
  EXPECT_EQ(std::memcmp(got.data(), dw.data(), dw.size() * 4), 0) << "not the token-order sums";
  for (int64_t c = 0; c < D; ++c) EXPECT_EQ(got[padding * D + c], 0.0f);
}
