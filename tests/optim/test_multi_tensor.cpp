// The fused multi-tensor Adam/AdamW pass (all f32 parameters in one parallel region,
// cut into chunks): many parameters of mixed sizes in two groups, some without a
// gradient, must follow the per-tensor f64 path (which matches torch.optim fixtures)
// step by step, and each parameter's own step count must drive its bias correction.
#include <cmath>

#include "athanor/optim/clip.h"
#include "athanor/optim/optimizer.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
using namespace athanor::optim;

namespace {
struct Model {
  NamedTensors params;
  std::vector<ParamGroup> groups() const {
    // Two groups with different lr and decay; sizes straddle the chunk (8192) and the
    // parallel threshold, and include single elements.
    NamedTensors a(params.begin(), params.begin() + 3), b(params.begin() + 3, params.end());
    return {ParamGroup{"decay", a, 3e-3, 3e-3, 0.1}, ParamGroup{"no_decay", b, 1e-2, 1e-2, 0.0}};
  }
};
Model make_model(DType dt) {
  const std::vector<int64_t> sizes = {20000, 1, 8192, 8193, 37, 50000};
  Model m;
  for (size_t k = 0; k < sizes.size(); ++k) {
    Tensor p = randn64({sizes[k]}, 100 + k, false).to(dt);
    m.params.emplace_back("p" + std::to_string(k), p.requires_grad_(true));
  }
  return m;
}
}  // namespace

TEST(MultiTensorAdam, F32FusedPassFollowsTheF64PathForEveryParameter) {
  for (bool decoupled : {true, false}) {
    SCOPED_TRACE(decoupled ? "adamw" : "adam");
    Model m32 = make_model(DType::f32), m64 = make_model(DType::f64);
    const AdamOptions o{0.9, 0.99, 1e-8};
    auto a32 = decoupled ? make_adamw(m32.groups(), o) : make_adam(m32.groups(), o);
    auto a64 = decoupled ? make_adamw(m64.groups(), o) : make_adam(m64.groups(), o);
    for (int step = 0; step < 4; ++step) {
      for (size_t k = 0; k < m32.params.size(); ++k) {
        // Parameter 4 gets no gradient on odd steps: it is skipped and its step count lags.
        if (k == 4 && step % 2 == 1) {
          m32.params[k].second.set_grad(Tensor());
          m64.params[k].second.set_grad(Tensor());
          continue;
        }
        const Tensor g = randn64(m32.params[k].second.sizes(), 1000 * step + k, false);
        m32.params[k].second.set_grad(g.to(DType::f32));
        m64.params[k].second.set_grad(g);
      }
      a32->step();
      a64->step();
      for (size_t k = 0; k < m32.params.size(); ++k) {
        SCOPED_TRACE("step " + std::to_string(step) + " " + m32.params[k].first);
        EXPECT_CLOSE(m32.params[k].second, m64.params[k].second, 1e-6, 1e-5);
      }
    }
    const auto s32 = a32->state_tensors(), s64 = a64->state_tensors();
    ASSERT_EQ(s32.size(), s64.size());
    for (size_t i = 0; i < s32.size(); ++i) EXPECT_CLOSE(s32[i].second, s64[i].second, 1e-6, 1e-4) << s32[i].first;
  }
}

}  // namespace athanor

namespace athanor {
using namespace athanor::testing;
using namespace athanor::optim;

TEST(MultiTensorSgd, F32FusedPassFollowsTheF64Path) {
  for (const SgdOptions o : {SgdOptions{0.0, 0.0, false}, SgdOptions{0.9, 0.1, false}, SgdOptions{0.9, 0.0, true}}) {
    SCOPED_TRACE("momentum " + std::to_string(o.momentum) + (o.nesterov ? " nesterov" : ""));
    Model m32 = make_model(DType::f32), m64 = make_model(DType::f64);
    auto s32 = make_sgd(m32.groups(), o), s64 = make_sgd(m64.groups(), o);
    for (int step = 0; step < 3; ++step) {
      for (size_t k = 0; k < m32.params.size(); ++k) {
        const Tensor g = randn64(m32.params[k].second.sizes(), 2000 * step + k, false);
        m32.params[k].second.set_grad(g.to(DType::f32));
        m64.params[k].second.set_grad(g);
      }
      s32->step();
      s64->step();
      for (size_t k = 0; k < m32.params.size(); ++k)
        EXPECT_CLOSE(m32.params[k].second, m64.params[k].second, 1e-6, 1e-5) << "step " << step << " " << k;
    }
  }
}

}  // namespace athanor

namespace athanor {
using namespace athanor::testing;
using namespace athanor::optim;

// The multi-tensor norm (f64 chunk sums of the AVX-512 kernel) and the clip's scale
// pass against a naive per-element reference in double, over f32 gradients whose sizes
// straddle the chunk and vector-tail boundaries, one f64 and one bf16 gradient (the
// per-tensor path) and a parameter without a gradient.
TEST(MultiTensorClip, NormAndScaleFollowANaiveDoubleReference) {
  const std::vector<int64_t> sizes = {1, 15, 17, 16384, 16385, 40000};
  std::vector<Tensor> params;
  for (size_t k = 0; k < sizes.size(); ++k) {
    Tensor p = zeros({sizes[k]}).requires_grad_(true);
    p.set_grad(randn64({sizes[k]}, 300 + k, false).to(DType::f32));
    params.push_back(p);
  }
  Tensor p64 = zeros({33}, DType::f64).requires_grad_(true), p16 = zeros({20}).requires_grad_(true);
  p64.set_grad(randn64({33}, 400, false));
  p16.set_grad(randn64({20}, 401, false).to(DType::bf16));
  params.push_back(p64), params.push_back(p16), params.push_back(zeros({5}).requires_grad_(true));
  std::vector<std::vector<double>> before;
  double ref = 0;
  for (const Tensor& p : params) {
    before.push_back(p.grad().defined() ? p.grad().to_vector() : std::vector<double>{});
    for (double v : before.back()) ref += v * v;
  }
  ref = std::sqrt(ref);
  EXPECT_NEAR(grad_norm(params), ref, 1e-13 * ref);
  const double max_norm = 0.25 * ref, coef = max_norm / (ref + 1e-6);
  EXPECT_NEAR(clip_grad_norm(params, max_norm), ref, 1e-13 * ref);
  for (size_t k = 0; k + 1 < params.size(); ++k) {
    const Tensor g = params[k].grad();
    const auto after = g.to_vector();
    for (size_t i = 0; i < after.size(); ++i) {
      // Each element is its own f64 product rounded once to the gradient's dtype.
      const double want = g.dtype() == DType::f32   ? static_cast<double>(static_cast<float>(before[k][i] * coef))
                          : g.dtype() == DType::f64 ? before[k][i] * coef
                                                    : static_cast<double>(bfloat16(static_cast<float>(before[k][i] * coef)));
      ASSERT_NEAR(after[i], want, std::abs(want) * 1e-12) << "param " << k << " element " << i;
    }
  }
  EXPECT_NEAR(grad_norm(params), max_norm, 1e-5 * max_norm);
}

}  // namespace athanor
