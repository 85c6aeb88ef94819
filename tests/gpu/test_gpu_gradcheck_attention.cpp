// The f64 attention kernel (src/backend/cuda/attention_f64.h), directly, at the shapes the op
// harness's small cases do not reach: query and key tiles of more than one 64-row block, a
// partial last block, grouped-query heads, Tq != Tk, D != Dv, causal and not, the packed qkv
// layout of causal_self_attention.
//  - against the CPU's f64 attention (the op on the CPU, forward and autograd backward):
//    |gpu - cpu| <= 1e-12 + 1e-10 |cpu| for O, dq, dk, dv;
//  - lse against a naive f64 log-sum-exp computed here from the same q, k;
//  - the f64 gradcheck of the CUDA backward against central differences of the CUDA forward
//    (tests/support/test_util.h) at a shape that crosses a block boundary.
#include <cmath>
#include <optional>
#include <vector>

#include "athanor/autograd/engine.h"
#include "athanor/core/error.h"
#include "athanor/ops/attention.h"
#include "backend/cuda/attention_f64.h"
#include "gpu_test.h"
#include "test_util.h"

using namespace athanor;

namespace {

constexpr double kAtol = 1e-12, kRtol = 1e-10;

Tensor leaf64(const Shape& s, uint64_t seed) { return athanor::testing::randn64(s, seed, true); }
Tensor device_leaf(const Tensor& t) {
  Tensor d = t.detach().cuda();
  d.requires_grad_(true);
  return d;
}

struct SdpaCase {
  int64_t B, H, Hkv, Tq, Tk, D, Dv;
  bool causal;
};

void check_sdpa_against_cpu(const SdpaCase& k) {
  SCOPED_TRACE("B " + std::to_string(k.B) + " H " + std::to_string(k.H) + " Hkv " + std::to_string(k.Hkv) + " Tq " +
               std::to_string(k.Tq) + " Tk " + std::to_string(k.Tk) + " D " + std::to_string(k.D) + " Dv " +
               std::to_string(k.Dv) + (k.causal ? " causal" : ""));
  const Tensor q = leaf64({k.B, k.H, k.Tq, k.D}, 1), kk = leaf64({k.B, k.Hkv, k.Tk, k.D}, 2),
               v = leaf64({k.B, k.Hkv, k.Tk, k.Dv}, 3);
  const Tensor dq = device_leaf(q), dk = device_leaf(kk), dv = device_leaf(v);
  const bool gqa = k.H != k.Hkv;
  const Tensor oc = scaled_dot_product_attention(q, kk, v, k.causal, std::nullopt, gqa);
  const Tensor og = scaled_dot_product_attention(dq, dk, dv, k.causal, std::nullopt, gqa);
  ASSERT_EQ(og.device(), Device::cuda(0));
  ASSERT_EQ(og.dtype(), DType::f64);
  EXPECT_TRUE(athanor::testing::all_close(og.cpu(), oc, kAtol, kRtol)) << "O";
  Generator wg(99);
  const Tensor seed = randn(oc.sizes(), TensorOptions(DType::f64), wg);
  backward({oc}, {seed});
  backward({og}, {seed.cuda()});
  EXPECT_TRUE(athanor::testing::all_close(dq.grad().cpu(), q.grad(), kAtol, kRtol)) << "dq";
  EXPECT_TRUE(athanor::testing::all_close(dk.grad().cpu(), kk.grad(), kAtol, kRtol)) << "dk";
  EXPECT_TRUE(athanor::testing::all_close(dv.grad().cpu(), v.grad(), kAtol, kRtol)) << "dv";
}

}  // namespace

TEST(GpuAttentionF64, MatchesTheCpuAttentionForwardAndBackward) {
  ATH_REQUIRE_GPU();
  check_sdpa_against_cpu({.B = 2, .H = 2, .Hkv = 2, .Tq = 70, .Tk = 70, .D = 8, .Dv = 8, .causal = true});
  check_sdpa_against_cpu({.B = 1, .H = 4, .Hkv = 2, .Tq = 130, .Tk = 130, .D = 5, .Dv = 5, .causal = true});
  check_sdpa_against_cpu({.B = 1, .H = 3, .Hkv = 1, .Tq = 7, .Tk = 67, .D = 3, .Dv = 6, .causal = false});
  check_sdpa_against_cpu({.B = 2, .H = 2, .Hkv = 2, .Tq = 66, .Tk = 9, .D = 16, .Dv = 4, .causal = true});
}

TEST(GpuAttentionF64, CausalSelfAttentionOnThePackedQkvMatchesTheCpu) {
  ATH_REQUIRE_GPU();
  const int64_t B = 2, T = 69, H = 3, hd = 4;
  const Tensor qkv = leaf64({B, T, 3 * H * hd}, 5);
  const Tensor dqkv = device_leaf(qkv);
  const Tensor oc = causal_self_attention(qkv, H), og = causal_self_attention(dqkv, H);
  EXPECT_TRUE(athanor::testing::all_close(og.cpu(), oc, kAtol, kRtol)) << "O";
  Generator wg(7);
  const Tensor seed = randn(oc.sizes(), TensorOptions(DType::f64), wg);
  backward({oc}, {seed});
  backward({og}, {seed.cuda()});
  EXPECT_TRUE(athanor::testing::all_close(dqkv.grad().cpu(), qkv.grad(), kAtol, kRtol)) << "dqkv";
}

// lse_i = log Σ_{j seen} exp(scale q_i . k_j), computed here in f64 from the host values.
TEST(GpuAttentionF64, LogSumExpMatchesANaiveOne) {
  ATH_REQUIRE_GPU();
  const cuda::AttentionDims d{.B = 1, .H = 2, .Tq = 67, .Tk = 67, .D = 3, .Dv = 3, .Hkv = 1};
  const double scale = 0.37;
  const Tensor q = leaf64({d.B, d.H, d.Tq, d.D}, 11), k = leaf64({d.B, 1, d.Tk, d.D}, 12), v = leaf64({d.B, 1, d.Tk, d.Dv}, 13);
  const std::vector<double> qh = q.to_vector(), kh = k.to_vector();
  const Tensor qd = q.detach().cuda(), kd = k.detach().cuda(), vd = v.detach().cuda();
  Tensor o = empty({d.B, d.H, d.Tq, d.Dv}, TensorOptions(DType::f64).with_device(Device::cuda(0)));
  Tensor lse = empty({d.B, d.H, d.Tq}, TensorOptions(DType::f64).with_device(Device::cuda(0)));
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    cuda::attention_f64_forward(static_cast<const double*>(qd.device_data()), static_cast<const double*>(kd.device_data()),
                                static_cast<const double*>(vd.device_data()), static_cast<double*>(o.device_data()),
                                static_cast<double*>(lse.device_data()), d, cuda::AttentionLayout::contiguous(d), causal,
                                scale, gpu_test::stream());
    const std::vector<double> got = lse.to_vector();
    std::vector<double> want(got.size());
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < d.Tq; ++i) {
        const int64_t n = causal ? i + 1 : d.Tk;
        std::vector<double> s(static_cast<std::size_t>(n));
        double m = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d.D; ++c) dot += qh[(h * d.Tq + i) * d.D + c] * kh[j * d.D + c];
          s[j] = scale * dot;
          m = std::max(m, s[j]);
        }
        double l = 0;
        for (double x : s) l += std::exp(x - m);
        want[h * d.Tq + i] = m + std::log(l);
      }
    EXPECT_TRUE(gpu_test::all_close(got, want, kAtol, kRtol));
  }
}

// The CUDA backward against central differences of the CUDA forward, across the 64-row block
// boundary (Tq = Tk = 66), with grouped-query heads and causal masking.
TEST(GpuAttentionF64, GradcheckOnTheGpuAcrossABlockBoundary) {
  ATH_REQUIRE_GPU();
  const Tensor q = device_leaf(leaf64({1, 2, 66, 2}, 21)), k = device_leaf(leaf64({1, 1, 66, 2}, 22)),
               v = device_leaf(leaf64({1, 1, 66, 3}, 23));
  EXPECT_TRUE(athanor::testing::gradcheck(
      [](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], true, std::nullopt, true); },
      {q, k, v}));
}
