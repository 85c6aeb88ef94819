// The fused multi-tensor Adam/AdamW pass (all f32 parameters in one parallel region,
// cut into chunks): many parameters of mixed sizes in two groups, some without a
// gradient, must follow the per-tensor f64 path (which matches torch.optim fixtures)
// step by step, and each parameter's own step count must drive its bias correction.
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
