// The planner's Llama (model.type llama): its parameter count and FLOPs against a built
// nn::Llama and the released models' published sizes, its tensor-parallel rule (by key/value-head
// group) in the layout check and the search, and the bad inputs.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "athanor/core/error.h"
#include "athanor/nn/llama.h"
#include "athanor/plan/search.h"

namespace athanor::plan {
namespace {

nn::LlamaConfig small(int64_t n_head, int64_t n_kv_head, bool tie) {
  nn::LlamaConfig c;
  c.vocab_size = 97, c.n_layer = 3, c.n_head = n_head, c.n_kv_head = n_kv_head, c.n_embd = 48, c.intermediate_size = 80;
  c.block_size = 32, c.tie_embeddings = tie;
  return c;
}

// Sums the numel of a module's parameters whose names start with `prefix`.
int64_t numel_under(nn::Module& m, const std::string& prefix) {
  int64_t n = 0;
  for (auto& [name, p] : m.named_parameters())
    if (name.rfind(prefix, 0) == 0) n += p.numel();
  return n;
}

TEST(PlanLlama, ParameterCountEqualsTheBuiltLlamas) {
  // GQA and plain multi-head attention, tied and untied heads.
  for (auto [h, kv, tie] : {std::tuple{4, 2, false}, std::tuple{4, 4, true}, std::tuple{6, 1, false}, std::tuple{6, 3, true}}) {
    const nn::LlamaConfig c = small(h, kv, tie);
    nn::Llama real(c);
    const ModelSpec m = llama_model(c, "llama");
    const std::string what = "n_head " + std::to_string(h) + " n_kv_head " + std::to_string(kv) + (tie ? " tied" : " untied");
    EXPECT_EQ(m.total_params(), real.parameters_count()) << what;
    EXPECT_EQ(m.block_params(), numel_under(real, "model.layers.0.")) << what;
    EXPECT_EQ(m.embedding_params(), numel_under(real, "model.embed_tokens.")) << what;
    EXPECT_EQ(m.final_norm_params(), numel_under(real, "model.norm.")) << what;
    EXPECT_EQ(m.head_params(), numel_under(real, "lm_head.")) << what;
    // The memory model's stage-0 parameter count at tp = pp = 1 is the whole model.
    TrainSpec s;
    s.model = m;
    EXPECT_DOUBLE_EQ(stage_memory(s, Layout{}, 0).params_count, static_cast<double>(real.parameters_count())) << what;
  }
}

TEST(PlanLlama, ParameterCountOfReleasedLlamas) {
  // Published sizes (Hugging Face model cards / safetensors totals): Llama 2 7B 6,738,415,616;
  // Llama 3 8B 8,030,261,248; SmolLM-135M (tied) 134,515,008.
  auto spec = [](int64_t L, int64_t H, int64_t kv, int64_t d, int64_t I, int64_t V, bool tie) {
    nn::LlamaConfig c;
    c.n_layer = L, c.n_head = H, c.n_kv_head = kv, c.n_embd = d, c.intermediate_size = I, c.vocab_size = V;
    c.block_size = 4096, c.tie_embeddings = tie;
    return llama_model(c, "llama");
  };
  EXPECT_EQ(spec(32, 32, 32, 4096, 11008, 32000, false).total_params(), 6738415616);
  EXPECT_EQ(spec(32, 32, 8, 4096, 14336, 128256, false).total_params(), 8030261248);
  EXPECT_EQ(spec(30, 9, 3, 576, 1536, 49152, true).total_params(), 134515008);
}

TEST(PlanLlama, FlopsAreNnLlamasAndFollowTheBuiltParameters) {
  for (auto [h, kv, tie] : {std::tuple{4, 2, false}, std::tuple{4, 4, true}}) {
    const nn::LlamaConfig c = small(h, kv, tie);
    nn::Llama real(c);
    const ModelSpec m = llama_model(c, "llama");
    // The planner's FLOPs are the built model's own ...
    EXPECT_DOUBLE_EQ(model_flops_per_token(m), real.flops_per_token(c.block_size));
    // ... and that is 6 x the GEMM weights of the built model (every parameter but an untied
    // embed_tokens, a lookup) + 12 L H hd T, counted here from its parameters.
    const double gemm = static_cast<double>(real.parameters_count() - (tie ? 0 : numel_under(real, "model.embed_tokens.")));
    const double want = 6 * gemm + 12.0 * 3 * h * (48 / h) * 32;
    EXPECT_DOUBLE_EQ(model_flops_per_token(m), want);
  }
}

TrainSpec llama_spec(int64_t n_head, int64_t n_kv_head) {
  nn::LlamaConfig c;
  c.n_layer = 8, c.n_head = n_head, c.n_kv_head = n_kv_head, c.n_embd = 1536, c.intermediate_size = 4096;
  c.vocab_size = 32000, c.block_size = 2048;
  TrainSpec s;
  s.model = llama_model(c, "llama");
  s.precision = Precision::bf16;
  s.packed_weights = false;
  return s;
}

TEST(PlanLlama, TensorParallelismMustDivideTheKeyValueHeads) {
  const TrainSpec s = llama_spec(12, 2);
  Layout l;
  l.tp = 3;  // divides n_head 12; neither divides nor is a multiple of n_kv_head 2
  try {
    check_layout(s, l);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("n_kv_head 2 and tp 3 do not divide one another"), std::string::npos) << msg;
    EXPECT_NE(e.hint().find("model.n_kv_head"), std::string::npos) << e.hint();
  }
  // tp 4, a multiple of n_kv_head 2: each rank holds one replicated key/value head, as
  // dist::TensorParallelLlama does (Megatron's rule): k_proj/v_proj keep head_dim rows.
  l.tp = 4;
  EXPECT_NO_THROW(check_layout(s, l));
  EXPECT_DOUBLE_EQ(s.model.kv_width_per_rank(4), 128);
  EXPECT_DOUBLE_EQ(s.model.kv_width_per_rank(2), 128);
  EXPECT_DOUBLE_EQ(s.model.kv_width_per_rank(1), 256);
  l.tp = 2;
  EXPECT_NO_THROW(check_layout(s, l));
  l.sequence_parallel = true;
  EXPECT_NE(layout_problem(s, l).find("does not model the Llama's sequence parallelism"), std::string::npos) << layout_problem(s, l);
  // A tp rank holds its key/value-head group's q, k, v, gate and up columns and o, down rows.
  l.sequence_parallel = false;
  const double h = 1536, kv = 2 * 128, I = 4096;
  const StageMemory tp2 = stage_memory(s, l, 0), one = stage_memory(s, Layout{}, 0);
  const double blocks_tp2 = 8 * ((2 * h * h + 2 * h * kv + 3 * h * I) / 2 + 2 * h);
  // Half of the blocks' Linears and half of embed_tokens and of the untied lm_head (32000 rows
  // need no padding to a multiple of 128 x 2) leave each rank; the norms stay whole.
  EXPECT_DOUBLE_EQ(one.params_count - tp2.params_count, 8 * (2 * h * h + 2 * h * kv + 3 * h * I) / 2 + 2 * (32000 - 16000) * h);
  EXPECT_DOUBLE_EQ(tp2.params_count, blocks_tp2 + 2 * 16000 * h + h);
}

TEST(PlanLlama, TheSearchOffersOnlyTensorParallelismByKeyValueGroup) {
  // n_head 12 but 2 key/value heads on 8-device nodes: tp 1, 2 or 4 (one replicated key/value
  // head per rank), never 3 (neither divides the other) or 8 (does not divide n_head).
  TrainSpec s = llama_spec(12, 2);
  const Cluster c = load_cluster("h100-sxm-80gb", 1);
  SearchOptions o;
  o.global_batch = 64;
  o.top = 1000;
  o.prune_with_tree = false;
  const PlanResult r = search(s, c, o);
  ASSERT_FALSE(r.ranked.empty());
  std::set<int> tps;
  for (const auto* list : {&r.ranked, &r.rejected})
    for (const auto& cand : *list) tps.insert(cand.layout.tp);
  EXPECT_EQ(tps, (std::set<int>{1, 2, 4}));
}

TEST(PlanLlama, AnInconsistentLlamaIsRefusedByNnsRules) {
  TrainSpec s = llama_spec(12, 5);  // 5 key/value heads cannot serve 12 query heads
  try {
    check_model(s.model);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("n_kv_head (5) must divide n_head (12)"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace athanor::plan
