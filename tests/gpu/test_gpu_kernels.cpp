// The fused CUDA kernels (src/backend/cuda/kernels.h) against the CPU's: the naive ref::
// kernels in double where they exist, else the CPU kernel itself. Tolerances are stated
// per test; the optimizer update and the dropout mask must match bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "athanor/core/rng.h"
#include "backend/cpu/cross_entropy.h"
#include "backend/cpu/dropout.h"
#include "backend/cpu/norm.h"
#include "backend/cpu/optimizer_update.h"
#include "backend/cpu/softmax.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/norm_kernels.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

namespace {
// Shapes with a row shorter than a warp, one not a multiple of the block, one longer than it.
struct Shape2 {
  int64_t rows, cols;
};
const Shape2 kShapes[] = {{3, 7}, {64, 768}, {5, 1031}, {2, 4096}};
// The norms' parameter gradients add chunks of rows then the chunks: one chunk, several with a
// short last one, and chunks longer than the 256-row minimum (over 1024 x 256 rows).
const Shape2 kNormShapes[] = {{3, 7}, {64, 768}, {5, 1031}, {2, 4096}, {3000, 768}, {270001, 5}};

// The parameter gradients' scratch (kernels.h), as the ops layer allocates it.
struct NormWorkspace {
  DeviceBuffer<float> buf;
  NormWorkspace(int64_t rows, int64_t cols)
      : buf(static_cast<std::size_t>(std::max<int64_t>(cuda::norm_backward_workspace_bytes(rows, cols) / 4, 1))) {}
};
}  // namespace

TEST(GpuKernels, LayerNormForwardBackward) {
  ATH_REQUIRE_GPU();
  for (const auto [rows, cols] : kNormShapes) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    const std::size_t n = rows * cols;
    auto x = random_vector(n, 1, -2, 3), w = random_vector(cols, 2), b = random_vector(cols, 3), dy = random_vector(n, 4);
    for (auto& v : x) v += 10.0f;  // a common offset: the two-pass variance must not lose it
    std::vector<float> y(n), mean(rows), rstd(rows), dx(n), dw(cols), db(cols);
    cpu::ref::layer_norm_forward<float>(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, cols, 1e-5);
    cpu::ref::layer_norm_backward<float>(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(),
                                         db.data(), rows, cols);
    DeviceBuffer<float> dX(x), dW(w), dB(b), dDY(dy), dY(n), dM(rows), dR(rows), dDX(n), dDW(cols), dDB(cols);
    cuda::layer_norm_forward(dX.ptr, dW.ptr, dB.ptr, dY.ptr, dM.ptr, dR.ptr, rows, cols, 1e-5, stream());
    NormWorkspace ws(rows, cols);
    cuda::layer_norm_backward(dDY.ptr, dX.ptr, dW.ptr, dM.ptr, dR.ptr, dDX.ptr, dDW.ptr, dDB.ptr, rows, cols, ws.buf.ptr,
                              stream());
    EXPECT_TRUE(all_close(dY.host(), y, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(dM.host(), mean, 1e-5, 1e-6));
    EXPECT_TRUE(all_close(dR.host(), rstd, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(dDX.host(), dx, 1e-4, 1e-4));
    // dw and db are sums over the rows (f32 on the device, double in the reference): their
    // rounding grows as sqrt(rows).
    const double over_rows = std::sqrt(std::max(1.0, rows / 64.0));
    EXPECT_TRUE(all_close(dDW.host(), dw, 1e-4 * over_rows, 1e-4));
    EXPECT_TRUE(all_close(dDB.host(), db, 1e-4 * over_rows, 1e-5));
  }
}

TEST(GpuKernels, RmsNormForwardBackward) {
  ATH_REQUIRE_GPU();
  for (const auto [rows, cols] : kNormShapes) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    const std::size_t n = rows * cols;
    auto x = random_vector(n, 5), w = random_vector(cols, 6), dy = random_vector(n, 7);
    std::vector<float> y(n), rstd(rows), dx(n), dw(cols);
    cpu::ref::rms_norm_forward<float>(x.data(), w.data(), y.data(), rstd.data(), rows, cols, 1e-6);
    cpu::ref::rms_norm_backward<float>(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), rows, cols);
    DeviceBuffer<float> dX(x), dW(w), dDY(dy), dY(n), dR(rows), dDX(n), dDW(cols);
    cuda::rms_norm_forward(dX.ptr, dW.ptr, dY.ptr, dR.ptr, rows, cols, 1e-6, stream());
    NormWorkspace ws(rows, cols);
    cuda::rms_norm_backward(dDY.ptr, dX.ptr, dW.ptr, dR.ptr, dDX.ptr, dDW.ptr, rows, cols, ws.buf.ptr, stream());
    EXPECT_TRUE(all_close(dY.host(), y, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(dR.host(), rstd, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(dDX.host(), dx, 1e-4, 1e-4));
    EXPECT_TRUE(all_close(dDW.host(), dw, 1e-4 * std::sqrt(std::max(1.0, rows / 64.0)), 1e-4));
  }
}

TEST(GpuKernels, Softmax) {
  ATH_REQUIRE_GPU();
  for (const auto [rows, cols] : kShapes) {
    const std::size_t n = rows * cols;
    auto x = random_vector(n, 8, -20, 20);
    std::vector<float> y(n);
    cpu::ref::softmax_forward<float>(x.data(), y.data(), rows, cols, false);
    DeviceBuffer<float> dX(x), dY(n);
    cuda::softmax_forward(dX.ptr, dY.ptr, rows, cols, stream());
    EXPECT_TRUE(all_close(dY.host(), y, 1e-7, 1e-5)) << rows << "x" << cols;
  }
}

TEST(GpuKernels, SoftmaxBackward) {
  ATH_REQUIRE_GPU();
  for (const auto [rows, cols] : kShapes) {
    const std::size_t n = rows * cols;
    auto x = random_vector(n, 30, -5, 5), dy = random_vector(n, 31);
    std::vector<float> y(n), dx(n);
    cpu::ref::softmax_forward<float>(x.data(), y.data(), rows, cols, false);
    cpu::ref::softmax_backward<float>(dy.data(), y.data(), dx.data(), rows, cols, false);
    DeviceBuffer<float> dY(y), dDY(dy), dDX(n);
    cuda::softmax_backward(dDY.ptr, dY.ptr, dDX.ptr, rows, cols, stream());
    EXPECT_TRUE(all_close(dDX.host(), dx, 1e-7, 1e-4)) << rows << "x" << cols;
  }
}

TEST(GpuKernels, CrossEntropyIgnoreIndexLabelSmoothingInPlaceGradient) {
  ATH_REQUIRE_GPU();
  const int64_t N = 37, C = 50257 / 7;  // a vocabulary-sized row, not a multiple of the block
  for (const double smoothing : {0.0, 0.1}) {
    SCOPED_TRACE("label_smoothing " + std::to_string(smoothing));
    auto logits = random_vector(N * C, 9, -8, 8);
    std::vector<int64_t> target(N);
    for (int64_t i = 0; i < N; ++i) target[i] = i % 5 == 0 ? -100 : (i * 7919) % C;
    std::vector<float> stats(2 * N), dl(N * C);
    std::vector<double> loss(N);
    cpu::cross_entropy_forward<float>(logits.data(), target.data(), stats.data(), loss.data(), N, C, -100, smoothing);
    const double grad = 1.0 / N;
    cpu::cross_entropy_backward<float>(logits.data(), target.data(), stats.data(), &grad, 0, 1.0, dl.data(), N, C, -100,
                                       smoothing);
    DeviceBuffer<float> dL(logits), dS(2 * N), dLoss(N);
    DeviceBuffer<int64_t> dT(target);
    cuda::cross_entropy_forward(dL.ptr, DType::f32, dT.ptr, dS.ptr, dLoss.ptr, N, C, -100, smoothing, stream());
    EXPECT_TRUE(all_close(dLoss.host(), loss, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(dS.host(), stats, 1e-5, 1e-5));
    // The gradient written over the logits.
    DeviceBuffer<float> dF(std::vector<float>{static_cast<float>(grad)});  // the factor, one for every row
    cuda::cross_entropy_backward(dL.ptr, DType::f32, dT.ptr, dS.ptr, dF.ptr, 0, dL.ptr, N, C, -100, smoothing, stream());
    EXPECT_TRUE(all_close(dL.host(), dl, 1e-9, 1e-4));
  }
}

TEST(GpuKernels, DropoutMaskIsTheCpusPhiloxStream) {
  ATH_REQUIRE_GPU();
  const int64_t n = 100003;  // not a multiple of 4 or of the block
  auto x = random_vector(n, 10, 0.5f, 1.5f);  // nonzero, so a dropped element is exactly 0
  const uint64_t seed = 1234567, offset = 99;
  const double p = 0.1, scale = 1.0 / (1.0 - p);
  const uint32_t threshold = static_cast<uint32_t>(p * (1u << 24));
  std::vector<float> y(n);
  cpu::dropout_apply<float>(x.data(), y.data(), n, seed, offset, threshold, scale);
  DeviceBuffer<float> dX(x), dY(n);
  cuda::dropout_apply(dX.ptr, dY.ptr, n, seed, offset, threshold, scale, stream());
  const auto g = dY.host();
  int64_t dropped = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ((g[i] == 0.0f), (y[i] == 0.0f)) << "mask differs at " << i;
    dropped += g[i] == 0.0f;
  }
  EXPECT_EQ(std::memcmp(g.data(), y.data(), n * sizeof(float)), 0) << "kept values differ";
  EXPECT_NEAR(static_cast<double>(dropped) / n, p, 0.01);
}

TEST(GpuKernels, AdamMultiTensorIsBitIdenticalToTheCpu) {
  ATH_REQUIRE_GPU();
  const std::vector<int64_t> sizes = {1, 4095, 4096, 4097, 30000, 7};
  for (const bool l2 : {false, true}) {
    for (const double grad_scale : {1.0, 0.37}) {
      SCOPED_TRACE(std::string(l2 ? "adam" : "adamw") + " grad_scale " + std::to_string(grad_scale));
      cpu::AdamConsts k{0.9f, 0.95f, 1e-8f, 0.1f, 1e-3f, 1.0f / std::sqrt(1.0f - 0.95f * 0.95f), 1.0f - 1e-4f, l2,
                        grad_scale};
      cuda::AdamArgs a{k.beta1, k.beta2, k.eps, k.wd, k.step_size, k.inv_sqrt_bc2, k.decay, k.l2, k.grad_scale};
      std::vector<std::vector<float>> w, g, m, v;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        w.push_back(random_vector(sizes[i], 20 + i));
        g.push_back(random_vector(sizes[i], 40 + i, -1e-2f, 1e-2f));
        m.push_back(random_vector(sizes[i], 60 + i, -1e-3f, 1e-3f));
        v.push_back(random_vector(sizes[i], 80 + i, 0.0f, 1e-5f));
      }
      std::vector<std::unique_ptr<DeviceBuffer<float>>> dw, dg, dm, dv;
      std::vector<float*> pw, pm, pv;
      std::vector<const float*> pg;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        dw.emplace_back(new DeviceBuffer<float>(w[i]));
        dg.emplace_back(new DeviceBuffer<float>(g[i]));
        dm.emplace_back(new DeviceBuffer<float>(m[i]));
        dv.emplace_back(new DeviceBuffer<float>(v[i]));
        pw.push_back(dw[i]->ptr);
        pg.push_back(dg[i]->ptr);
        pm.push_back(dm[i]->ptr);
        pv.push_back(dv[i]->ptr);
        cpu::adam_f32(w[i].data(), g[i].data(), m[i].data(), v[i].data(), sizes[i], k, nullptr, DType::f32);
      }
      cuda::adam_multi_tensor(pw.data(), pg.data(), pm.data(), pv.data(), sizes.data(), static_cast<int>(sizes.size()), a,
                              stream());
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const auto gw = dw[i]->host(), gm = dm[i]->host(), gv = dv[i]->host();
        EXPECT_EQ(std::memcmp(gw.data(), w[i].data(), sizes[i] * 4), 0) << "weights of tensor " << i;
        EXPECT_EQ(std::memcmp(gm.data(), m[i].data(), sizes[i] * 4), 0) << "m of tensor " << i;
        EXPECT_EQ(std::memcmp(gv.data(), v[i].data(), sizes[i] * 4), 0) << "v of tensor " << i;
      }
    }
  }
}

TEST(GpuKernels, SgdMultiTensorIsBitIdenticalToTheCpu) {
  ATH_REQUIRE_GPU();
  const std::vector<int64_t> sizes = {5000, 3, 8192};
  for (const bool nesterov : {false, true}) {
    for (const bool first : {true, false}) {
      cpu::SgdConsts k{0.05f, 1e-4f, 0.9f, 1.0f, nesterov, first, 1.0};
      cuda::SgdArgs a{k.lr, k.wd, k.momentum, k.one_minus_dampening, k.nesterov, k.first, k.grad_scale};
      std::vector<std::unique_ptr<DeviceBuffer<float>>> dw, dg, db;
      std::vector<float*> pw, pb;
      std::vector<const float*> pg;
      std::vector<std::vector<float>> w, g, b;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        w.push_back(random_vector(sizes[i], 100 + i));
        g.push_back(random_vector(sizes[i], 200 + i));
        b.push_back(random_vector(sizes[i], 300 + i));
        dw.emplace_back(new DeviceBuffer<float>(w[i]));
        dg.emplace_back(new DeviceBuffer<float>(g[i]));
        db.emplace_back(new DeviceBuffer<float>(b[i]));
        pw.push_back(dw[i]->ptr);
        pg.push_back(dg[i]->ptr);
        pb.push_back(db[i]->ptr);
        cpu::sgd_f32(w[i].data(), g[i].data(), b[i].data(), sizes[i], k, nullptr, DType::f32);
      }
      cuda::sgd_multi_tensor(pw.data(), pg.data(), pb.data(), sizes.data(), static_cast<int>(sizes.size()), a, stream());
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const auto gw = dw[i]->host(), gb = db[i]->host();
        EXPECT_EQ(std::memcmp(gw.data(), w[i].data(), sizes[i] * 4), 0) << "weights " << i << " nesterov " << nesterov;
        EXPECT_EQ(std::memcmp(gb.data(), b[i].data(), sizes[i] * 4), 0) << "momentum " << i << " nesterov " << nesterov;
      }
    }
  }
}

TEST(GpuKernels, GlobalSquaredNormIsDeterministic) {
  ATH_REQUIRE_GPU();
  std::vector<int64_t> sizes;
  for (int i = 0; i < 30; ++i) sizes.push_back(1 + (i * 7919) % 20000);  // more tensors than one launch takes
  std::vector<std::unique_ptr<DeviceBuffer<float>>> bufs;
  std::vector<const float*> ptrs;
  double want = 0;
  int64_t total = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    auto h = random_vector(sizes[i], 500 + i, -3, 3);
    want += cpu::sum_squares_f32(h.data(), sizes[i]);
    bufs.emplace_back(new DeviceBuffer<float>(h));
    ptrs.push_back(bufs.back()->ptr);
    total += sizes[i];
  }
  DeviceBuffer<double> scratch(cuda::sum_squares_scratch(total)), out(1);
  cuda::sum_squares_multi_tensor(ptrs.data(), sizes.data(), static_cast<int>(sizes.size()), scratch.ptr, out.ptr, stream());
  const double first = out.host()[0];
  EXPECT_NEAR(first, want, 1e-12 * want);
  for (int rep = 0; rep < 3; ++rep) {
    cuda::sum_squares_multi_tensor(ptrs.data(), sizes.data(), static_cast<int>(sizes.size()), scratch.ptr, out.ptr,
                                   stream());
    const double again = out.host()[0];
    EXPECT_EQ(std::memcmp(&again, &first, sizeof(double)), 0) << "run " << rep << " differs in its bits";
  }
}

TEST(GpuKernels, SumIsDeterministic) {
  ATH_REQUIRE_GPU();
  const int64_t n = 1000003;
  auto h = random_vector(n, 600, -1, 1);
  double want = 0;
  for (float v : h) want += v;
  DeviceBuffer<float> x(h);
  DeviceBuffer<double> scratch(cuda::sum_squares_scratch(n)), out(1);
  cuda::sum(x.ptr, n, scratch.ptr, out.ptr, stream());
  const double first = out.host()[0];
  EXPECT_NEAR(first, want, 1e-9 * n);
  cuda::sum(x.ptr, n, scratch.ptr, out.ptr, stream());
  const double again = out.host()[0];
  EXPECT_EQ(std::memcmp(&again, &first, sizeof(double)), 0);
}
