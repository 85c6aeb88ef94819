// GPT with gradient_checkpointing: the same loss and parameter gradients as
// without it (from the same weights, batch and dropout seed), and a peak
// activation memory, measured by the allocator's per-tag accounting, that is
// at least 3x smaller for a 12-layer model.
#include <cstdio>

#include "athanor/core/allocator.h"
#include "athanor/core/rng.h"
#include "athanor/nn/gpt.h"
#include "athanor/ops/autocast.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {

Tensor random_tokens(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  Generator g(seed);
  return randint(0, vocab, {B, T}, g);
}

struct LossAndGrads {
  double loss = 0;
  std::vector<std::pair<std::string, Tensor>> grads;
  GeneratorState rng_after;
};

LossAndGrads loss_and_grads(nn::GPT& model, const Tensor& ids, const Tensor& targets, uint64_t dropout_seed) {
  model.zero_grad();
  manual_seed(dropout_seed);
  Tensor loss = model.loss(ids, targets);
  loss.backward();
  LossAndGrads r;
  r.loss = loss.item();
  for (auto& [name, p] : model.named_parameters()) r.grads.emplace_back(name, p.grad().defined() ? p.grad().clone() : Tensor());
  r.rng_after = default_generator().state();
  return r;
}

// Peak bytes of the activation tag above what was live before forward, for one forward+backward.
size_t peak_activation_bytes(nn::GPT& model, const Tensor& ids, const Tensor& targets) {
  model.zero_grad();
  Allocator& a = Allocator::cpu();
  const size_t live_before = a.stats().of(MemTag::activation);
  a.reset_peak();
  {
    MemTagScope tag(MemTag::activation);  // as the trainer tags forward and backward
    Tensor loss = model.loss(ids, targets);
    loss.backward();
  }
  const size_t peak = a.stats().peak_of(MemTag::activation);
  return peak > live_before ? peak - live_before : 0;
}

}  // namespace

TEST(GPTCheckpointing, LossAndAllGradientsEqualTheUncheckpointedModelWithDropout) {
  nn::GPTConfig c{.n_layer = 3, .n_head = 2, .n_embd = 32, .block_size = 16, .vocab_size = 37, .dropout = 0.1};
  manual_seed(5);
  nn::GPT plain(c);
  c.gradient_checkpointing = true;
  nn::GPT ckpt(c);
  ckpt.load_state_dict(plain.state_dict());  // the same initial weights
  Tensor ids = random_tokens(4, 16, c.vocab_size, 1), targets = random_tokens(4, 16, c.vocab_size, 2);

  const LossAndGrads a = loss_and_grads(plain, ids, targets, 777);
  const LossAndGrads b = loss_and_grads(ckpt, ids, targets, 777);
  // Dropout is really on: another seed gives another loss (so equal masks are being tested).
  const LossAndGrads other_seed = loss_and_grads(plain, ids, targets, 778);
  EXPECT_NE(a.loss, other_seed.loss);

  // Tolerance for f32: atol 1e-6, rtol 1e-5 (the same kernels run on the same
  // values in the same order, so in practice the results are bit-identical).
  EXPECT_NEAR(b.loss, a.loss, 1e-6);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_EQ(a.grads[i].first, b.grads[i].first);
    ASSERT_TRUE(a.grads[i].second.defined()) << a.grads[i].first;
    ASSERT_TRUE(b.grads[i].second.defined()) << b.grads[i].first << " got no gradient with checkpointing";
    EXPECT_CLOSE(b.grads[i].second, a.grads[i].second, 1e-6, 1e-5) << a.grads[i].first;
  }
  EXPECT_EQ(b.rng_after, a.rng_after);  // the generator ends where the uncheckpointed run leaves it
}

TEST(GPTCheckpointing, UnderAutocastBf16GradientsEqualTheUncheckpointedAutocastRun) {
  nn::GPTConfig c{.n_layer = 2, .n_head = 2, .n_embd = 32, .block_size = 16, .vocab_size = 37, .dropout = 0.1};
  manual_seed(6);
  nn::GPT plain(c);
  c.gradient_checkpointing = true;
  nn::GPT ckpt(c);
  ckpt.load_state_dict(plain.state_dict());
  Tensor ids = random_tokens(2, 16, c.vocab_size, 7), targets = random_tokens(2, 16, c.vocab_size, 8);
  auto run = [&](nn::GPT& m) {
    m.zero_grad();
    manual_seed(55);
    Tensor loss;
    {
      autocast ac(DType::bf16);
      loss = m.loss(ids, targets);
    }
    loss.backward();
    return loss.item();
  };
  const double la = run(plain);
  const double lb = run(ckpt);
  EXPECT_NEAR(lb, la, 1e-6);
  auto pa = plain.named_parameters(), pb = ckpt.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(pb[i].second.grad().defined()) << pb[i].first;
    EXPECT_EQ(pb[i].second.grad().dtype(), DType::f32) << pb[i].first;  // master weights get f32 gradients
    // bf16 GEMMs in both runs; a recompute outside autocast would differ at ~1e-2 relative.
    EXPECT_CLOSE(pb[i].second.grad(), pa[i].second.grad(), 1e-6, 1e-5) << pa[i].first;
  }
}

TEST(GPTCheckpointing, EvaluationUnderNoGradIsUnchanged) {
  nn::GPTConfig c{.n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 19};
  manual_seed(3);
  nn::GPT plain(c);
  c.gradient_checkpointing = true;
  nn::GPT ckpt(c);
  ckpt.load_state_dict(plain.state_dict());
  Tensor ids = random_tokens(2, 8, c.vocab_size, 4);
  NoGradGuard ng;
  EXPECT_CLOSE(ckpt.forward(ids), plain.forward(ids), 0, 0);
}

TEST(GPTCheckpointing, PeakActivationBytesOfA12LayerModelDropAtLeast3x) {
  nn::GPTConfig c{.n_layer = 12, .n_head = 4, .n_embd = 64, .block_size = 128, .vocab_size = 256};
  manual_seed(9);
  nn::GPT plain(c);
  c.gradient_checkpointing = true;
  nn::GPT ckpt(c);
  ckpt.load_state_dict(plain.state_dict());
  Tensor ids = random_tokens(4, 128, c.vocab_size, 5), targets = random_tokens(4, 128, c.vocab_size, 6);

  const size_t without = peak_activation_bytes(plain, ids, targets);
  const size_t with = peak_activation_bytes(ckpt, ids, targets);
  std::printf("12-layer GPT (n_embd 64, T 128, B 4): peak activation bytes without checkpointing %zu (%.1f MiB), "
              "with %zu (%.1f MiB), ratio %.2f\n",
              without, without / 1048576.0, with, with / 1048576.0, with ? static_cast<double>(without) / with : 0.0);
  ASSERT_GT(with, 0u);
  EXPECT_GE(static_cast<double>(without), 3.0 * static_cast<double>(with));
}

}  // namespace athanor
