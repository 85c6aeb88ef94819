// The warp-per-row norm kernels (src/backend/cuda/norm_rows_vec.h, candidate norm_vectorized)
// against kernels.h's block-per-row ones on the device (kernels.h's entry points with the
// candidate pinned off: they route to the warp-per-row kernels when it is on): y, mean and rstd
// within a few f32 roundings (the row sums are added in another order), the low-precision copy
// equal to the host's rounding of y bit for bit; the backward's dx, dw, db from one pass against
// the block kernels' dx and two-pass column sums, the same bits on a second run; RMSNorm alike;
// the support rule host-side.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "athanor/core/half.h"
#include "backend/cuda/candidates.h"
#include "backend/cuda/norm_kernels.h"
#include "backend/cuda/norm_rows_vec.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

namespace {

std::vector<float> randn(std::size_t n, unsigned seed, float mean = 0.0f, float sd = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

struct Case {
  int64_t rows, cols;
  bool affine;  // w and b given (else null)
};

const Case kCases[] = {{1, 4, true}, {7, 8, false}, {9, 36, true}, {100, 768, true}, {17, 1024, false}, {5, 4100, true}};

std::string name(const Case& c) {
  return "rows " + std::to_string(c.rows) + " cols " + std::to_string(c.cols) + (c.affine ? " affine" : " plain");
}

}  // namespace

TEST(GpuNormVectorized, LayerNormForwardMatchesTheBlockKernel) {
  ATH_REQUIRE_GPU();
  cuda::CandidateOverride established(cuda::Candidate::norm_vectorized, false);
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    const std::size_t n = static_cast<std::size_t>(c.rows * c.cols), cols = static_cast<std::size_t>(c.cols);
    DeviceBuffer<float> x(randn(n, 1, 3.0f, 2.0f)), w(randn(cols, 3, 1.0f, 0.2f)), b(randn(cols, 4));
    const float* wp = c.affine ? w.ptr : nullptr;
    const float* bp = c.affine ? b.ptr : nullptr;
    DeviceBuffer<float> y0(n), y1(n), m0(c.rows), m1(c.rows), r0(c.rows), r1(c.rows);
    DeviceBuffer<uint16_t> low(n);
    ASSERT_TRUE(cuda::norm_rows_vectorized_supported(c.cols, x.ptr, wp, bp, y1.ptr, nullptr, low.ptr));
    cuda::layer_norm_forward(x.ptr, wp, bp, y0.ptr, m0.ptr, r0.ptr, c.rows, c.cols, 1e-5, stream());
    cuda::layer_norm_forward_vectorized(x.ptr, wp, bp, y1.ptr, m1.ptr, r1.ptr, c.rows, c.cols, 1e-5, stream(), low.ptr,
                                        DType::bf16);
    EXPECT_TRUE(all_close(y1.host(), y0.host(), 2e-6, 2e-6)) << "y";
    EXPECT_TRUE(all_close(m1.host(), m0.host(), 2e-6, 2e-6)) << "mean";
    EXPECT_TRUE(all_close(r1.host(), r0.host(), 0, 2e-6)) << "rstd";
    const std::vector<float> yh = y1.host();
    const std::vector<uint16_t> lh = low.host();
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(lh[i], float_to_bf16_bits(yh[i])) << "bf16 copy, element " << i;
  }
}

TEST(GpuNormVectorized, RmsNormForwardMatchesTheBlockKernel) {
  ATH_REQUIRE_GPU();
  cuda::CandidateOverride established(cuda::Candidate::norm_vectorized, false);
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    const std::size_t n = static_cast<std::size_t>(c.rows * c.cols), cols = static_cast<std::size_t>(c.cols);
    DeviceBuffer<float> x(randn(n, 5, 0.5f, 2.0f)), w(randn(cols, 7, 1.0f, 0.2f));
    const float* wp = c.affine ? w.ptr : nullptr;
    DeviceBuffer<float> y0(n), y1(n), r0(c.rows), r1(c.rows);
    DeviceBuffer<uint16_t> low(n);
    cuda::rms_norm_forward(x.ptr, wp, y0.ptr, r0.ptr, c.rows, c.cols, 1e-6, stream());
    cuda::rms_norm_forward_vectorized(x.ptr, wp, y1.ptr, r1.ptr, c.rows, c.cols, 1e-6, stream(), low.ptr, DType::f16);
    EXPECT_TRUE(all_close(y1.host(), y0.host(), 2e-6, 2e-6)) << "y";
    EXPECT_TRUE(all_close(r1.host(), r0.host(), 0, 2e-6)) << "rstd";
    const std::vector<float> yh = y1.host();
    const std::vector<uint16_t> lh = low.host();
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(lh[i], float_to_f16_bits(yh[i])) << "f16 copy, element " << i;
  }
}

// dx, dw, db from one pass (layer_norm_backward_vectorized) against the block kernels' dx and
// their two-pass column sums; RMSNorm's dx and dw alike; the same bits on a second run.
TEST(GpuNormVectorized, FusedBackwardMatchesTheBlockKernels) {
  ATH_REQUIRE_GPU();
  cuda::CandidateOverride established(cuda::Candidate::norm_vectorized, false);
  for (const Case& c : kCases) {
    if (c.cols > cuda::kNormFusedMaxCols) continue;
    for (bool rms : {false, true}) {
      SCOPED_TRACE(name(c) + (rms ? " rms_norm" : " layer_norm"));
      const std::size_t n = static_cast<std::size_t>(c.rows * c.cols), cols = static_cast<std::size_t>(c.cols);
      DeviceBuffer<float> x(randn(n, 8, 1.0f, 2.0f)), dy(randn(n, 9)), w(randn(cols, 10, 1.0f, 0.2f));
      const float* wp = c.affine ? w.ptr : nullptr;
      DeviceBuffer<float> y(n), m(c.rows), r(c.rows), dx0(n), dx1(n), dw0(cols), dw1(cols), db0(cols), db1(cols);
      DeviceBuffer<char> ws0(static_cast<std::size_t>(cuda::norm_backward_workspace_bytes(c.rows, c.cols)) + 16);
      DeviceBuffer<char> ws1(static_cast<std::size_t>(cuda::norm_rows_workspace_bytes(c.rows, c.cols)) + 16);
      if (rms) {
        cuda::rms_norm_forward(x.ptr, wp, y.ptr, r.ptr, c.rows, c.cols, 1e-6, stream());
        cuda::rms_norm_backward(dy.ptr, x.ptr, wp, r.ptr, dx0.ptr, dw0.ptr, c.rows, c.cols, ws0.ptr, stream());
        cuda::rms_norm_backward_vectorized(dy.ptr, x.ptr, wp, r.ptr, dx1.ptr, dw1.ptr, c.rows, c.cols, ws1.ptr, stream());
      } else {
        cuda::layer_norm_forward(x.ptr, wp, nullptr, y.ptr, m.ptr, r.ptr, c.rows, c.cols, 1e-5, stream());
        cuda::layer_norm_backward(dy.ptr, x.ptr, wp, m.ptr, r.ptr, dx0.ptr, dw0.ptr, db0.ptr, c.rows, c.cols, ws0.ptr,
                                  stream());
        cuda::layer_norm_backward_vectorized(dy.ptr, x.ptr, wp, m.ptr, r.ptr, dx1.ptr, dw1.ptr, db1.ptr, c.rows, c.cols,
                                             ws1.ptr, stream());
        EXPECT_TRUE(all_close(db1.host(), db0.host(), 1e-5, 1e-5)) << "db";
      }
      EXPECT_TRUE(all_close(dx1.host(), dx0.host(), 2e-5, 2e-5)) << "dx";
      const std::vector<float> dw = dw1.host();
      EXPECT_TRUE(all_close(dw, dw0.host(), 1e-5 * std::sqrt(static_cast<double>(c.rows)), 1e-5)) << "dw";
      if (rms) cuda::rms_norm_backward_vectorized(dy.ptr, x.ptr, wp, r.ptr, dx1.ptr, dw1.ptr, c.rows, c.cols, ws1.ptr, stream());
      else
        cuda::layer_norm_backward_vectorized(dy.ptr, x.ptr, wp, m.ptr, r.ptr, dx1.ptr, dw1.ptr, db1.ptr, c.rows, c.cols,
                                             ws1.ptr, stream());
      EXPECT_EQ(dw1.host(), dw) << "a second run";
    }
  }
}

// Host logic: no GPU needed.
TEST(GpuNormVectorized, SupportRule) {
  alignas(16) static unsigned char buf[64];
  EXPECT_TRUE(cuda::norm_rows_vectorized_supported(768, buf, buf + 16, nullptr, buf + 32));
  EXPECT_TRUE(cuda::norm_rows_vectorized_supported(4, buf, nullptr, nullptr, nullptr, nullptr, buf + 8));
  EXPECT_FALSE(cuda::norm_rows_vectorized_supported(6, buf));                  // rows would start misaligned
  EXPECT_FALSE(cuda::norm_rows_vectorized_supported(0, buf));
  EXPECT_FALSE(cuda::norm_rows_vectorized_supported(768, buf + 4));            // x misaligned
  EXPECT_FALSE(cuda::norm_rows_vectorized_supported(768, buf, buf + 8));       // w misaligned
  EXPECT_FALSE(cuda::norm_rows_vectorized_supported(768, buf, nullptr, nullptr, nullptr, nullptr, buf + 4));  // copy
}
