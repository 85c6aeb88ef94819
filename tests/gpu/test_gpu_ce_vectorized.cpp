// The vectorized cross-entropy kernels (src/backend/cuda/cross_entropy_vec.h, a candidate)
// against the established ones (kernels.h) on the device: the row max bit for bit, log-sum-exp
// and the loss within a few f32 roundings (another summation order), the backward bit for bit
// from the same row statistics (in place and not), NaN and -inf logits, ignored rows; then the
// cross_entropy op with the candidate on against it off; the support rule host-side.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "athanor/ops/loss.h"
#include "backend/cuda/candidates.h"
#include "backend/cuda/cross_entropy_vec.h"
#include "backend/cuda/kernels.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

namespace {

constexpr int64_t kIgnore = -100;

std::vector<float> host_f32(const Tensor& t) {
  const std::vector<double> v = t.cpu().to(DType::f32).to_vector();
  return std::vector<float>(v.begin(), v.end());
}

// Raw bits of a device tensor (any dtype), for bit-for-bit comparisons.
std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> b(static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype()));
  ATH_CUDA(cudaMemcpyAsync(b.data(), t.device_data(), b.size(), cudaMemcpyDeviceToHost, stream()));
  ATH_CUDA(cudaStreamSynchronize(stream()));
  return b;
}

struct Rows {
  Tensor logits, targets;  // on cuda: [N, C] in the dtype, [N] i64
};

// N rows of N(0, 3) logits; row 1 ignored; row 2 has every third logit masked (-inf); row 3 (when
// present) one NaN when `nan` is set (alone in its thread's share of the row for the established
// kernel at C 64: the case that kernel dropped before it added a NaN-only thread's sum).
Rows make_rows(int64_t N, int64_t C, DType dt, unsigned seed, bool nan) {
  std::mt19937 g(seed);
  std::normal_distribution<double> d(0.0, 3.0);
  std::vector<double> x(static_cast<std::size_t>(N * C));
  for (auto& v : x) v = d(g);
  if (N > 2)
    for (int64_t c = 0; c < C; c += 3) x[static_cast<std::size_t>(2 * C + c)] = -std::numeric_limits<double>::infinity();
  if (nan && N > 3) x[static_cast<std::size_t>(3 * C + C / 2)] = std::numeric_limits<double>::quiet_NaN();
  std::vector<int64_t> t(static_cast<std::size_t>(N));
  std::uniform_int_distribution<int64_t> pick(0, C - 1);
  for (int64_t n = 0; n < N; ++n) t[static_cast<std::size_t>(n)] = n == 1 ? kIgnore : pick(g);
  if (N > 2 && t[2] % 3 == 0) t[2] = t[2] + 1 < C ? t[2] + 1 : t[2] - 1;  // the masked row's target is not masked
  Rows r;
  r.logits = from_vector(x, {N, C}, TensorOptions(DType::f64)).to(dt).cuda();
  r.targets = from_vector(t, {N}).cuda();
  return r;
}

Tensor f32_on_gpu(const Shape& s) { return empty(s, TensorOptions(DType::f32).with_device(Device::cuda(0))); }

struct Forward {
  Tensor stats, loss;
};
Forward run_forward(const Rows& r, double smoothing, bool vectorized) {
  const int64_t N = r.logits.size(0), C = r.logits.size(1);
  Forward f{f32_on_gpu({N, 2}), f32_on_gpu({N})};
  const auto* t = static_cast<const int64_t*>(r.targets.device_data());
  auto* st = static_cast<float*>(f.stats.device_data());
  auto* lo = static_cast<float*>(f.loss.device_data());
  if (vectorized)
    cuda::cross_entropy_forward_vectorized(r.logits.device_data(), r.logits.dtype(), t, st, lo, N, C, kIgnore, smoothing, stream());
  else
    cuda::cross_entropy_forward(r.logits.device_data(), r.logits.dtype(), t, st, lo, N, C, kIgnore, smoothing, stream());
  return f;
}

// dlogits from the given statistics, into a new buffer or over a copy of the logits.
Tensor run_backward(const Rows& r, const Tensor& stats, double smoothing, bool vectorized, bool in_place) {
  const int64_t N = r.logits.size(0), C = r.logits.size(1);
  const Tensor factor = from_vector(std::vector<float>{0.37f}, {1}).cuda();
  Tensor src = in_place ? r.logits.clone() : r.logits;
  Tensor d = in_place ? src : empty(r.logits.sizes(), TensorOptions(r.logits.dtype()).with_device(Device::cuda(0)));
  const auto* t = static_cast<const int64_t*>(r.targets.device_data());
  const auto* st = static_cast<const float*>(stats.device_data());
  const auto* fa = static_cast<const float*>(factor.device_data());
  const auto run = vectorized ? cuda::cross_entropy_backward_vectorized : cuda::cross_entropy_backward;
  run(src.device_data(), r.logits.dtype(), t, st, fa, 0, d.device_data(), N, C, kIgnore, smoothing, stream());
  return d;
}

}  // namespace

TEST(GpuCrossEntropyVectorized, KernelsMatchTheEstablishedOnes) {
  ATH_REQUIRE_GPU();
  struct Shape2 {
    int64_t N, C;
  };
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (const Shape2 s : {Shape2{6, 8}, Shape2{5, 64}, Shape2{7, 1000}, Shape2{4, 50304}})
      for (double eps : {0.0, 0.1}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " N " + std::to_string(s.N) + " C " + std::to_string(s.C) +
                     " smoothing " + std::to_string(eps));
        const Rows r = make_rows(s.N, s.C, dt, 11 + static_cast<unsigned>(s.C), false);
        ASSERT_TRUE(cuda::cross_entropy_vectorized_supported(r.logits.device_data(), dt, s.C, nullptr));
        const Forward a = run_forward(r, eps, false), b = run_forward(r, eps, true);
        const std::vector<float> sa = host_f32(a.stats), sb = host_f32(b.stats);
        for (int64_t n = 0; n < s.N; ++n) {
          EXPECT_EQ(sa[2 * n], sb[2 * n]) << "row max, row " << n;  // a max does not depend on the order
          EXPECT_NEAR(sa[2 * n + 1], sb[2 * n + 1], 2e-5 + 2e-6 * std::abs(sa[2 * n + 1])) << "log-sum-exp, row " << n;
        }
        const std::vector<float> la = host_f32(a.loss), lb = host_f32(b.loss);
        for (int64_t n = 0; n < s.N; ++n) {
          if (std::isinf(la[n])) EXPECT_EQ(lb[n], la[n]) << "loss, row " << n;  // smoothing over masked (-inf) logits
          else EXPECT_NEAR(lb[n], la[n], 2e-5 + 2e-6 * std::abs(la[n])) << "loss, row " << n;
        }
        EXPECT_EQ(lb[1], 0.0f) << "the ignored row";
        // The backward from the established statistics: the same bits, in place or not.
        const Tensor da = run_backward(r, a.stats, eps, false, false);
        EXPECT_EQ(bytes_of(run_backward(r, a.stats, eps, true, false)), bytes_of(da)) << "dlogits";
        EXPECT_EQ(bytes_of(run_backward(r, a.stats, eps, true, true)), bytes_of(da)) << "dlogits in place";
      }
}

TEST(GpuCrossEntropyVectorized, ANanLogitMakesItsRowNan) {
  ATH_REQUIRE_GPU();
  for (DType dt : {DType::f32, DType::bf16}) {
    const Rows r = make_rows(5, 64, dt, 5, true);
    const std::vector<float> la = host_f32(run_forward(r, 0.0, false).loss), lb = host_f32(run_forward(r, 0.0, true).loss);
    EXPECT_TRUE(std::isnan(la[3])) << dtype_name(dt);
    EXPECT_TRUE(std::isnan(lb[3])) << dtype_name(dt);
    for (int n : {0, 2, 4}) EXPECT_TRUE(std::isfinite(lb[n])) << dtype_name(dt) << " row " << n;
  }
}

TEST(GpuCrossEntropyVectorized, TheOpWithTheCandidateOnMatchesItOff) {
  ATH_REQUIRE_GPU();
  // f32 logits: the loss comes out in the logits' dtype (a bf16 loss would hide the difference
  // in its rounding); the bf16 and f16 kernels are compared above. Row by row (Reduction::none):
  // row 2's masked (-inf) logits make its smoothed loss +inf, so the mean is +inf either way
  // (and EXPECT_NEAR(inf, inf) fails: inf - inf is NaN).
  const Rows r = make_rows(33, 4096, DType::f32, 21, false);
  auto run = [&](bool on) {
    cuda::CandidateOverride cand(cuda::Candidate::cross_entropy_vectorized, on);
    Tensor x = r.logits.detach().clone().requires_grad_(true);
    Tensor loss = cross_entropy(x, r.targets, kIgnore, 0.05);
    loss.backward();
    const Tensor rows = cross_entropy(r.logits, r.targets, kIgnore, 0.05, Reduction::none);
    return std::make_pair(host_f32(rows), host_f32(x.grad()));
  };
  const auto off = run(false), on = run(true);
  ASSERT_EQ(on.first.size(), off.first.size());
  for (std::size_t n = 0; n < off.first.size(); ++n) {
    if (std::isinf(off.first[n])) EXPECT_EQ(on.first[n], off.first[n]) << "loss, row " << n;
    else EXPECT_NEAR(on.first[n], off.first[n], 2e-5 + 2e-6 * std::abs(off.first[n])) << "loss, row " << n;
  }
  EXPECT_TRUE(std::isinf(off.first[2])) << "row 2 (masked logits, smoothing)";
  EXPECT_TRUE(all_close(on.second, off.second, 1e-9, 1e-5));  // log-sum-exp differs in its last bits
}

// Host logic: no GPU needed.
TEST(GpuCrossEntropyVectorized, SupportRule) {
  alignas(16) static unsigned char buf[64];
  EXPECT_TRUE(cuda::cross_entropy_vectorized_supported(buf, DType::f32, 12, nullptr));
  EXPECT_TRUE(cuda::cross_entropy_vectorized_supported(buf, DType::bf16, 16, buf + 16));
  EXPECT_TRUE(cuda::cross_entropy_vectorized_supported(buf, DType::f16, 50304, buf));
  EXPECT_FALSE(cuda::cross_entropy_vectorized_supported(buf, DType::f32, 10, nullptr));  // rows not all aligned
  EXPECT_FALSE(cuda::cross_entropy_vectorized_supported(buf, DType::bf16, 12, nullptr));
  EXPECT_FALSE(cuda::cross_entropy_vectorized_supported(buf + 2, DType::bf16, 16, nullptr));  // misaligned logits
  EXPECT_FALSE(cuda::cross_entropy_vectorized_supported(buf, DType::bf16, 16, buf + 8));      // misaligned gradient
  EXPECT_FALSE(cuda::cross_entropy_vectorized_supported(buf, DType::f64, 16, nullptr));
  EXPECT_FALSE(cuda::cross_entropy_vectorized_supported(buf, DType::bf16, 0, nullptr));
}
