// Packed weight copies (src/ops/packed_weights.h) in training and evaluation: training
// with them gives the results of training without them (f32 at a GPT-sized batch, bf16
// autocast with the optimizer's low-precision copies), and the packed path was really
// taken (hits); a weight changed in place is never multiplied through a stale copy; frozen
// weights get packed by the op on second sight; copies nobody uses any more are dropped at
// the next optimizer step, and their memory is reported under packed_weights; the
// optimizer's refresh writes every element of a copy whatever the thread count.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/allocator.h"
#include "athanor/ops.h"
#include "athanor/ops/autocast.h"
#include "athanor/ops/gelu_linear.h"
#include "athanor/ops/linear_relu.h"
#include "athanor/optim/optimizer.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/weight_packing.h"
#include "ops/packed_weights.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
using namespace athanor::optim;

namespace {

constexpr int64_t kRows = 300;  // above the f32 threshold for packed weights (gemm.cpp)

struct Model {
  Tensor w1, b1, w2, b2, w3, b3;
  explicit Model(uint64_t seed) {
    w1 = random_leaf({96, 64}, seed), b1 = random_leaf({96}, seed + 1);
    w2 = random_leaf({80, 96}, seed + 2), b2 = random_leaf({80}, seed + 3);
    w3 = random_leaf({48, 80}, seed + 4), b3 = random_leaf({48}, seed + 5);
  }
  NamedTensors named() const { return {{"w1", w1}, {"b1", b1}, {"w2", w2}, {"b2", b2}, {"w3", w3}, {"b3", b3}}; }
  // The three linear-shaped ops, each with its own backward GEMMs.
  Tensor forward(const Tensor& x) const { return linear(gelu_linear(linear_relu(x, w1, b1), w2, b2), w3, b3); }
};

// `steps` Adam steps on a fixed batch; precision bf16 runs the forward under autocast with
// the optimizer's bf16 copies. Returns the final parameters.
std::vector<Tensor> train(bool packed, DType precision, int steps) {
  detail::set_packed_weights_enabled(packed);
  Model m(11);
  auto opt = make_adamw({ParamGroup{"all", m.named(), 1e-2, 1e-2, 0.0}});
  if (precision != DType::f32) opt->enable_low_precision_copies(precision);
  const Tensor x = random_leaf({kRows, 64}, 5).detach();
  for (int s = 0; s < steps; ++s) {
    opt->zero_grad();
    Tensor loss;
    {
      autocast ac(DType::bf16, precision != DType::f32);
      loss = mean(square(m.forward(x)));
    }
    loss.backward();
    opt->step();
  }
  std::vector<Tensor> out;
  for (const auto& [name, p] : m.named()) out.push_back(p.detach().clone());
  detail::set_packed_weights_enabled(true);
  return out;
}

double max_rel_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]) / (1e-3 + std::abs(y[i])));
  return worst;
}

}  // namespace

// The mechanism's tests need oneDNN to read f32 packed copies: at the AVX2 level it does
// not, no copy is made (TrainingWithPackedCopiesMatchesTrainingWithout checks that), and
// these run at the levels that pack.
#define SKIP_WHERE_NOTHING_IS_PACKED()                                                       \
  if (!cpu::gemm_packed_supported(/*bf16=*/false))                                           \
  GTEST_SKIP() << "oneDNN reads no packed f32 layout at ISA level " << cpu::isa_name(cpu::active_isa())

TEST(PackedWeights, TrainingWithPackedCopiesMatchesTrainingWithout) {
  for (DType precision : {DType::f32, DType::bf16}) {
    const std::vector<Tensor> plain = train(false, precision, 5);
    const detail::PackedWeightStats before = detail::packed_weight_stats();
    const std::vector<Tensor> packed = train(true, precision, 5);
    const detail::PackedWeightStats after = detail::packed_weight_stats();
    if (cpu::gemm_packed_supported(precision == DType::bf16)) {
      // Steps 2-5 run each forward GEMM and each input-gradient GEMM (but the first layer's)
      // on copies written by the previous step's update.
      EXPECT_GE(after.hits - before.hits, 4u * 5u) << dtype_name(precision);
      EXPECT_GE(after.packs_in_refresh - before.packs_in_refresh, 4u * 5u) << dtype_name(precision);
    } else {
      // oneDNN reads no packed layout at this ISA level: no copy is written or used.
      EXPECT_EQ(after.hits - before.hits, 0u) << dtype_name(precision);
      EXPECT_EQ(after.packs_in_refresh - before.packs_in_refresh, 0u) << dtype_name(precision);
    }
    for (size_t i = 0; i < plain.size(); ++i)
      EXPECT_LT(max_rel_diff(packed[i], plain[i]), precision == DType::f32 ? 1e-6 : 1e-3)
          << dtype_name(precision) << " parameter " << i;
  }
}

TEST(PackedWeights, AWeightChangedInPlaceIsNeverMultipliedThroughAStaleCopy) {
  SKIP_WHERE_NOTHING_IS_PACKED();
  detail::set_packed_weights_enabled(true);
  Model m(3);
  auto opt = make_sgd({ParamGroup{"all", m.named(), 0.1, 0.1, 0.0}});
  const Tensor x = random_leaf({kRows, 64}, 6).detach();
  for (int s = 0; s < 2; ++s) {  // the second step's forward runs on packed copies
    opt->zero_grad();
    mean(square(m.forward(x))).backward();
    opt->step();
  }
  NoGradGuard ng;
  const uint64_t hits = detail::packed_weight_stats().hits;
  const Tensor y_before = linear(x, m.w1, m.b1);
  ASSERT_GT(detail::packed_weight_stats().hits, hits) << "the forward did not take the packed path";
  const Tensor w_before = m.w1.clone();
  m.w1.copy_(mul(m.w1, -2.0));  // in place: bumps the version
  const Tensor y_after = linear(x, m.w1, m.b1);
  detail::set_packed_weights_enabled(false);
  const Tensor y_plain_before = linear(x, w_before, m.b1), y_plain_after = linear(x, m.w1, m.b1);
  detail::set_packed_weights_enabled(true);
  EXPECT_LT(max_rel_diff(y_before, y_plain_before), 1e-6);  // the copy the optimizer wrote
  EXPECT_LT(max_rel_diff(y_after, y_plain_after), 1e-6);    // no stale copy after the change
  EXPECT_GT(max_rel_diff(y_after, y_before), 0.5);
}

TEST(PackedWeights, FrozenWeightsArePackedOnSecondSight) {
  SKIP_WHERE_NOTHING_IS_PACKED();
  detail::set_packed_weights_enabled(true);
  NoGradGuard ng;
  const Tensor x = random_leaf({kRows, 64}, 7).detach(), w = random_leaf({96, 64}, 8).detach();
  const detail::PackedWeightStats s0 = detail::packed_weight_stats();
  const Tensor y1 = linear(x, w);  // first sight: plain GEMM, request noted
  const detail::PackedWeightStats s1 = detail::packed_weight_stats();
  const Tensor y2 = linear(x, w);  // same version again: packed here
  const detail::PackedWeightStats s2 = detail::packed_weight_stats();
  const Tensor y3 = linear(x, w);  // current copy
  const detail::PackedWeightStats s3 = detail::packed_weight_stats();
  EXPECT_EQ(s1.misses - s0.misses, 1u);
  EXPECT_EQ(s1.hits, s0.hits);
  EXPECT_EQ(s2.packs_in_ops - s1.packs_in_ops, 1u);
  EXPECT_EQ(s2.hits - s1.hits, 1u);
  EXPECT_EQ(s3.packs_in_ops, s2.packs_in_ops);
  EXPECT_EQ(s3.hits - s2.hits, 1u);
  EXPECT_LT(max_rel_diff(y2, y1), 1e-6);
  EXPECT_LT(max_rel_diff(y3, y1), 1e-6);
}

TEST(PackedWeights, CopiesNobodyUsesAreDroppedAndTheirMemoryIsReported) {
  SKIP_WHERE_NOTHING_IS_PACKED();
  detail::set_packed_weights_enabled(true);
  Model m(9);
  auto opt = make_sgd({ParamGroup{"all", m.named(), 0.05, 0.05, 0.0}});
  const Tensor x = random_leaf({kRows, 64}, 10).detach();
  auto step = [&](bool whole_model) {
    opt->zero_grad();
    mean(square(whole_model ? m.forward(x) : linear_relu(x, m.w1, m.b1))).backward();
    opt->step();
  };
  // The copies the model's weights hold (their storages own them: there is no global list).
  auto held = [&] {
    std::size_t n = 0;
    for (const auto& [name, p] : m.named()) n += detail::packed_weight_count(p);
    return n;
  };
  step(true);
  const std::size_t all = held();
  EXPECT_GE(all, 5u);  // three forward copies, two input-gradient ones (the first layer's dx is not needed)
  EXPECT_GT(Allocator::cpu().stats().of(MemTag::packed_weights), 0u);
  step(false);  // the second and third layers are not used: their copies go at this step's refresh
  step(false);
  EXPECT_EQ(held(), 1u);  // w1's forward copy
  EXPECT_EQ(detail::packed_weight_count(m.w1), 1u);
  opt.reset();  // the optimizer that kept it current goes: so does the copy
  EXPECT_EQ(held(), 0u);
  EXPECT_EQ(Allocator::cpu().stats().of(MemTag::packed_weights), 0u);
  detail::set_packed_weights_enabled(true);
}

TEST(PackedWeights, TheRefreshWritesEveryRowOnAnyThreadCount) {
  SKIP_WHERE_NOTHING_IS_PACKED();
  // W spans several of the refresh's 64-row blocks, its thread shares do not end on one,
  // and both copies are asked for (W's input gradient feeds the first layer).
  const int prev = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(threads);
    omp_set_num_threads(threads);
    detail::set_packed_weights_enabled(true);
    const Tensor w0 = random_leaf({200, 64}, 21), w = random_leaf({336, 200}, 22);
    auto opt = make_sgd({ParamGroup{"all", {{"w0", w0}, {"w", w}}, 0.1, 0.1, 0.0}});
    const Tensor x = random_leaf({kRows, 64}, 23).detach();
    for (int s = 0; s < 2; ++s) {  // step 1 notes the requests, its refresh packs; step 2 repacks
      opt->zero_grad();
      mean(square(linear(linear(x, w0), w))).backward();
      opt->step();
    }
    for (detail::WeightUse use : {detail::WeightUse::forward, detail::WeightUse::input_grad}) {
      const detail::PackedWeight pw = detail::packed_weight(w, use);
      ASSERT_TRUE(pw) << "no current copy for use " << static_cast<int>(use);
      const bool w_is_bt = use == detail::WeightUse::forward;
      std::vector<float> expect(pw.layout.elements(), 0.0f);
      cpu::detail::pack_weight_rows_scalar(pw.layout, w_is_bt, w.data_ptr<float>(), 200, 0, 336, expect.data());
      EXPECT_EQ(std::memcmp(expect.data(), pw.data, expect.size() * sizeof(float)), 0) << "use " << static_cast<int>(use);
    }
  }
  omp_set_num_threads(prev);
}

}  // namespace athanor
