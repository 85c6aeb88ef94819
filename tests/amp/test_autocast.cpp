// autocast: op categories (lower_precision → autocast dtype, f32 → f32, promote
// → widest), nesting, the per-region weight-cast cache, gradients reaching f32
// parameters in f32, a small GPT under bf16 autocast against f32, and the
// optimizer's persistent low-precision copies (bit-identical to casting; missed
// after any other in-place change).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "athanor/ops/autocast.h"
#include "athanor/nn/gpt.h"
#include "athanor/optim/optimizer.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
double rel_err(const Tensor& a, const Tensor& b) {  // ||a - b|| / ||b||
  const auto va = a.to_vector(), vb = b.to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < va.size(); ++i) num += (va[i] - vb[i]) * (va[i] - vb[i]), den += vb[i] * vb[i];
  return std::sqrt(num / std::max(den, 1e-30));
}
}  // namespace

TEST(Autocast, OpCategories) {
  Generator g(1);
  Tensor x = randn({4, 8}, {}, g), w = random_leaf({6, 8}, 2), b = random_leaf({6}, 3);
  {
    autocast ac(DType::bf16);
    EXPECT_TRUE(autocast_enabled());
    EXPECT_EQ(autocast_dtype(), DType::bf16);
    Tensor y = linear(x, w, b);
    EXPECT_EQ(y.dtype(), DType::bf16);                            // lower_precision
    EXPECT_EQ(matmul(x, w.t()).dtype(), DType::bf16);             // lower_precision
    EXPECT_EQ(softmax(y, -1).dtype(), DType::f32);                // f32
    EXPECT_EQ(log_softmax(y, -1).dtype(), DType::f32);            // f32
    EXPECT_EQ(layer_norm(y, {6}, Tensor(), Tensor(), 1e-5).dtype(), DType::f32);
    EXPECT_EQ(sum(y, {1}, false).dtype(), DType::f32);            // f32 reduction
    EXPECT_EQ(mean(y, {0}, false).dtype(), DType::f32);
    EXPECT_EQ(add(y, full({4, 6}, 1.0)).dtype(), DType::f32);     // promote: bf16 + f32 -> f32
    EXPECT_EQ(add(y, y).dtype(), DType::bf16);                    // promote: bf16 + bf16 stays bf16
    EXPECT_EQ(rms_norm(y, {6}).dtype(), DType::f32);
    EXPECT_EQ(cross_entropy(y, from_vector(std::vector<int64_t>{0, 1, 2, 3}, {4})).dtype(), DType::f32);
    Tensor q = randn({1, 2, 4, 8}, {}, g);
    EXPECT_EQ(scaled_dot_product_attention(q, q, q, true).dtype(), DType::bf16);
    Tensor img = randn({1, 2, 5, 5}, {}, g), k = random_leaf({3, 2, 3, 3}, 12);
    EXPECT_EQ(autocast_target("conv2d", DType::f32), DType::bf16);
    EXPECT_TRUE(conv2d(img, k).dtype() == DType::bf16);
    Tensor x64 = randn({2, 3}, DType::f64, g);
    EXPECT_EQ(matmul(x64, x64.t()).dtype(), DType::f64);          // f64 is never touched
  }
  EXPECT_FALSE(autocast_enabled());
  EXPECT_EQ(linear(x, w, b).dtype(), DType::f32);  // outside the region: as given
}

TEST(Autocast, MatchesF32WithinBf16Rounding) {
  Generator g(4);
  Tensor x = randn({16, 64}, {}, g), w = random_leaf({32, 64}, 5);
  Tensor ref = linear(x, w, Tensor());
  Tensor y;
  {
    autocast ac(DType::bf16);
    y = linear(x, w, Tensor());
  }
  // Inputs rounded to bf16 (relative 2^-9 each) over K = 64 terms, output rounded once: ~1e-2 of sqrt(K) * |x||w|.
  EXPECT_CLOSE(y.to(DType::f32), ref, 5e-2, 2e-2);
}

TEST(Autocast, NestingRestoresState) {
  {
    autocast outer(DType::bf16);
    {
      autocast inner(DType::f16);
      EXPECT_EQ(autocast_dtype(), DType::f16);
      {
        autocast off(DType::bf16, false);
        EXPECT_FALSE(autocast_enabled());
        Generator g(6);
        Tensor x = randn({2, 3}, {}, g);
        EXPECT_EQ(matmul(x, x.t()).dtype(), DType::f32);
      }
      EXPECT_TRUE(autocast_enabled());
    }
    EXPECT_EQ(autocast_dtype(), DType::bf16);
    EXPECT_TRUE(autocast_enabled());
  }
  EXPECT_FALSE(autocast_enabled());
  EXPECT_FALSE(error_message([] { autocast bad(DType::f32); }).empty());
}

TEST(Autocast, WeightCastIsCachedPerRegion) {
  Generator g(7);
  Tensor x = randn({3, 8}, {}, g), w = random_leaf({5, 8}, 8);
  {
    autocast ac(DType::bf16);
    const Tensor c1 = autocast_input(w, "linear"), c2 = autocast_input(w, "linear");
    EXPECT_EQ(c1.dtype(), DType::bf16);
    EXPECT_TRUE(c1.is_same(c2));  // the same cast tensor object, not a second cast
    linear(x, w, Tensor());
    linear(x, w, Tensor());
    EXPECT_EQ(autocast_cache_size(), 1u);
    // Activations (non-leaves, or leaves without grad) are not cached.
    EXPECT_FALSE(autocast_input(x, "linear").is_same(autocast_input(x, "linear")));
    EXPECT_EQ(autocast_cache_size(), 1u);
    {
      autocast nested(DType::bf16);  // an inner region shares the outer cache
      EXPECT_TRUE(autocast_input(w, "linear").is_same(c1));
    }
    EXPECT_EQ(autocast_cache_size(), 1u);
    // An in-place update bumps the version: the stale cast is not reused.
    {
      NoGradGuard ng;
      w.bump_version();
    }
    EXPECT_FALSE(autocast_input(w, "linear").is_same(c1));
  }
  EXPECT_EQ(autocast_cache_size(), 0u);  // cleared when the outermost region ends
}

TEST(Autocast, GradientsReachF32ParametersInF32) {
  Generator g(9);
  Tensor x = randn({6, 8}, {}, g), w = random_leaf({8, 8}, 10), b = random_leaf({8}, 11);
  x.requires_grad_(true);
  auto run = [&](bool amp) {
    w.set_grad(Tensor()), b.set_grad(Tensor()), x.set_grad(Tensor());
    Tensor loss;
    {
      autocast ac(DType::bf16, amp);
      // w is used twice (one cached cast): both uses' gradients accumulate into w.grad.
      Tensor h = linear(gelu(linear(x, w, b)), w, Tensor());
      loss = mean(mul(h, h), {}, false);
    }
    EXPECT_EQ(loss.dtype(), DType::f32);
    loss.backward();
    return std::vector<Tensor>{w.grad().clone(), b.grad().clone(), x.grad().clone()};
  };
  const auto ref = run(false), got = run(true);
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(got[i].dtype(), DType::f32);
    EXPECT_LT(rel_err(got[i], ref[i]), 3e-2);  // bf16 forward + backward: a few bf16 ulps (2^-8) of relative error
  }
}

TEST(Autocast, SmallGptForwardBackwardCloseToF32) {
  nn::GPTConfig cfg;
  cfg.n_layer = 2, cfg.n_head = 2, cfg.n_embd = 32, cfg.block_size = 16, cfg.vocab_size = 64;
  default_generator().manual_seed(1234);
  auto model = std::make_shared<nn::GPT>(cfg);
  std::vector<double> ids_v, tgt_v;
  for (int i = 0; i < 2 * 16; ++i) ids_v.push_back((i * 7 + 3) % 64), tgt_v.push_back((i * 5 + 1) % 64);
  const Tensor ids = from_vector(ids_v, {2, 16}, DType::i64), targets = from_vector(tgt_v, {2, 16}, DType::i64);

  auto run = [&](bool amp, double& loss_out) {
    model->zero_grad();
    Tensor loss;
    {
      autocast ac(DType::bf16, amp);
      loss = model->loss(ids, targets);
    }
    EXPECT_EQ(loss.dtype(), DType::f32);
    loss.backward();
    loss_out = loss.item();
    std::vector<std::pair<std::string, Tensor>> grads;
    for (auto& [name, p] : model->named_parameters()) grads.emplace_back(name, p.grad().clone());
    return grads;
  };
  double loss32 = 0, loss16 = 0;
  const auto ref = run(false, loss32), got = run(true, loss16);
  // Loss: within 1e-3 relative (bf16 GEMMs, f32 softmax/LN/CE; measured ~1e-5).
  EXPECT_NEAR(loss16, loss32, 1e-3 * std::abs(loss32));
  EXPECT_NE(loss16, loss32);  // bf16 really ran
  if (std::getenv("ATHANOR_AMP_VERBOSE")) std::printf("loss f32 %.6f bf16 %.6f\n", loss32, loss16);
  // Gradients: every parameter's gradient is f32 and within 3% relative L2 error
  // of the f32 one (bf16 has 8 mantissa bits; errors compound over 2 blocks of
  // forward + backward; measured <= 0.7%).
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(got[i].first);
    EXPECT_EQ(got[i].second.dtype(), DType::f32);
    EXPECT_LT(rel_err(got[i].second, ref[i].second), 0.03);
    if (std::getenv("ATHANOR_AMP_VERBOSE")) std::printf("%s %.4g\n", got[i].first.c_str(), rel_err(got[i].second, ref[i].second));
  }
}

namespace {
// Bitwise equality of two tensors' bytes (same dtype and shape).
bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() && a.is_contiguous() && b.is_contiguous() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

std::shared_ptr<nn::GPT> tiny_gpt() {
  nn::GPTConfig cfg;
  cfg.n_layer = 1, cfg.n_head = 2, cfg.n_embd = 32, cfg.block_size = 8, cfg.vocab_size = 48;
  default_generator().manual_seed(99);
  return std::make_shared<nn::GPT>(cfg);
}
}  // namespace

// Training with the optimizer's persistent copies must be the same computation as
// casting every step: same loss, gradients and weights, bit for bit, for SGD and
// AdamW (fused copies) and RMSprop (copy cast after the update), in bf16 and f16.
TEST(AutocastPersistentCopies, TrainingIsBitIdenticalToCastingEveryStep) {
  std::vector<double> ids_v, tgt_v;
  for (int i = 0; i < 2 * 8; ++i) ids_v.push_back((i * 7 + 3) % 48), tgt_v.push_back((i * 5 + 1) % 48);
  const Tensor ids = from_vector(ids_v, {2, 8}, DType::i64), targets = from_vector(tgt_v, {2, 8}, DType::i64);
  std::vector<Tensor> params;  // every model's parameters, kept past their optimizers
  for (const DType dt : {DType::bf16, DType::f16})
    for (const std::string opt : {"sgd", "adamw", "rmsprop"}) {
      SCOPED_TRACE(opt + " " + dtype_name(dt));
      auto ref = tiny_gpt(), got = tiny_gpt();
      auto make = [&](nn::GPT& m) {
        auto groups = optim::default_param_groups(m.named_parameters(), 1e-2, 0.1);
        if (opt == "sgd") return optim::make_sgd(groups, {0.9, 0.0, true});
        if (opt == "rmsprop") return optim::make_rmsprop(groups);
        return optim::make_adamw(groups);
      };
      for (const auto& [name, p] : got->named_parameters()) params.push_back(p);
      auto o_ref = make(*ref), o_got = make(*got);
      o_got->enable_low_precision_copies(dt);
      const Tensor wte = got->named_parameters().front().second;
      ASSERT_TRUE(autocast_persistent_cast(wte, dt).defined());  // made when enabled, before any step
      EXPECT_EQ(autocast_persistent_cast(wte, dt).storage()->tag(), MemTag::parameter);
      for (int step = 0; step < 3; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        Tensor l_ref, l_got;
        {
          autocast ac(dt);
          l_ref = ref->loss(ids, targets);
        }
        {
          autocast ac(dt);
          // The region really uses the optimizer's copy (no cast of wte).
          EXPECT_EQ(autocast_input(wte, "linear").storage(), autocast_persistent_cast(wte, dt).storage());
          l_got = got->loss(ids, targets);
        }
        ASSERT_TRUE(same_bits(l_got, l_ref)) << l_got.item() << " vs " << l_ref.item();
        l_ref.backward(), l_got.backward();
        const auto p_ref = ref->named_parameters(), p_got = got->named_parameters();
        for (size_t i = 0; i < p_ref.size(); ++i) {
          EXPECT_EQ(p_got[i].second.grad().dtype(), DType::f32) << p_got[i].first;  // the gradient reached f32
          EXPECT_TRUE(same_bits(p_got[i].second.grad(), p_ref[i].second.grad())) << "grad " << p_got[i].first;
        }
        o_ref->step(), o_got->step();
        o_ref->zero_grad(), o_got->zero_grad();
        for (size_t i = 0; i < p_ref.size(); ++i) {
          EXPECT_TRUE(same_bits(p_got[i].second, p_ref[i].second)) << "weight " << p_got[i].first;
          // The copy written in the update pass is exactly cast() of the new weight.
          const Tensor copy = autocast_persistent_cast(p_got[i].second, dt);
          ASSERT_TRUE(copy.defined()) << p_got[i].first;
          EXPECT_TRUE(same_bits(copy, cast(p_got[i].second.detach(), dt))) << "copy " << p_got[i].first;
        }
      }
    }
  // Every optimizer forgot its copies when destroyed (the parameters, still alive, hold none).
  ASSERT_FALSE(params.empty());
  for (const Tensor& p : params) EXPECT_EQ(autocast_persistent_cast_count(p), 0u);
}

TEST(AutocastPersistentCopies, AnyOtherInPlaceChangeMissesTheCopy) {
  Tensor w = random_leaf({4, 8}, 21), x = randn({3, 8}, {}, default_generator());
  auto opt = optim::make_sgd({optim::ParamGroup{"all", {{"w", w}}, 0.1, 0.1, 0.0}});
  opt->enable_low_precision_copies(DType::bf16);
  EXPECT_TRUE(autocast_persistent_cast(w, DType::bf16).defined());
  EXPECT_FALSE(autocast_persistent_cast(w, DType::f16).defined());  // only the dtype it was made in
  {
    NoGradGuard ng;
    w.fill_(0.5);  // not the optimizer: the version moves on, the copy is stale
  }
  EXPECT_FALSE(autocast_persistent_cast(w, DType::bf16).defined());
  {
    autocast ac(DType::bf16);
    const Tensor c = autocast_input(w, "linear");
    for (double v : c.to_vector()) EXPECT_EQ(v, 0.5);  // a fresh cast of the new values, not the stale copy
  }
  // The next optimizer step makes the copy current again.
  w.set_grad(ones({4, 8}));
  opt->step();
  const Tensor copy = autocast_persistent_cast(w, DType::bf16);
  ASSERT_TRUE(copy.defined());
  for (double v : copy.to_vector()) EXPECT_EQ(v, static_cast<double>(bfloat16(0.5f - 0.1f)));
  opt->disable_low_precision_copies();
  EXPECT_FALSE(autocast_persistent_cast(w, DType::bf16).defined());
  EXPECT_NE(error_message([&] { opt->enable_low_precision_copies(DType::f32); }).find("bf16 or f16"), std::string::npos);
}

}  // namespace athanor
