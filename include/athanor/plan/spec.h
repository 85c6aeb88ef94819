#pragma once
// What the planner reasons about, as plain values: the model and its training
// settings (filled by apps/ from a training config, or by a test), and one
// parallel layout of it. No training machinery is reachable from here (the plan
// layer sits below train), so a plan can be made for a model no machine here holds.
#include <cstdint>
#include <string>
#include <vector>

#include "athanor/nn/llama.h"

namespace athanor::plan {

enum class Precision { f32, bf16, f16 };
const char* precision_name(Precision p);
Precision parse_precision(const std::string& s);  // "f32" | "bf16" | "f16"; an Error otherwise

enum class Family { gpt, llama };
const char* family_name(Family f);

// One Linear of a transformer block, as a tensor-parallel rank holds it: [out, in] (nn::Linear's
// layout), and whether it is column-parallel (out split over tp) or row-parallel (in split).
struct BlockLinear {
  const char* name;
  double out, in;  // this rank's
  bool column;
};

// The model, of one of two families:
//  - gpt: athanor's nn::GPT (pre-LayerNorm blocks, fused qkv, GELU MLP of width 4h, tied
//    embedding, learned positions);
//  - llama: nn::Llama (pre-RMSNorm blocks without biases, RoPE, separate q/k/v projections with
//    n_kv_head key/value heads (GQA), a SwiGLU MLP of width `intermediate`, lm_head tied to
//    embed_tokens or not). Tensor parallelism splits it by key/value-head group (tp divides
//    n_kv_head: each rank holds n_kv_head / tp of them and their query heads).
struct ModelSpec {
  std::string name = "gpt";
  int64_t n_layer = 0, n_head = 0, n_embd = 0;
  int64_t seq = 0;    // tokens per sample (model.block_size)
  int64_t vocab = 0;  // before tensor-parallel padding
  bool bias = true;   // gpt only (the Llama has none)
  double dropout = 0.0;
  Family family = Family::gpt;
  int64_t n_kv_head = 0;     // llama: key/value heads (0 = n_head)
  int64_t intermediate = 0;  // llama: SwiGLU width
  bool tie_embeddings = true;  // gpt: always; llama: model.tie_embeddings
  double rope_theta = 10000.0, rms_norm_eps = 1e-5;  // llama: carried into its nn::LlamaConfig

  bool llama() const { return family == Family::llama; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_dim() const { return n_embd / n_head; }
  // The heads tensor parallelism splits: n_head (a Llama's key/value heads follow their groups).
  int64_t tp_heads() const { return n_head; }
  // A Llama's key/value width on one of tp ranks: n_kv_head / tp heads, or one replicated head
  // when tp is a multiple of n_kv_head (dist::TensorParallelLlama, Megatron's rule for MQA).
  double kv_width_per_rank(int tp) const {
    return kv_heads() % tp == 0 ? static_cast<double>(kv_heads() / tp * head_dim()) : static_cast<double>(head_dim());
  }
  // The block's Linears on one of tp ranks (the head excluded).
  std::vector<BlockLinear> block_linears(int tp) const;
  // Parameters of one transformer block, of the embeddings (GPT: wte + wpe; Llama: embed_tokens),
  // of the final norm and of an untied head (Llama's lm_head; 0 when tied).
  int64_t block_params() const;
  int64_t embedding_params() const;
  int64_t final_norm_params() const;
  int64_t head_params() const;
  int64_t total_params() const;  // a tied head counted once
};

// The Llama of an nn::LlamaConfig (seq = its block_size), and back (for nn's definitions).
ModelSpec llama_model(const nn::LlamaConfig& c, const std::string& name);
nn::LlamaConfig llama_config(const ModelSpec& m);

struct TrainSpec {
  ModelSpec model;
  Precision precision = Precision::f32;  // autocast dtype; master weights, gradients and optimizer states stay f32
  std::string optimizer = "adamw";       // adam/adamw/lamb: 2 states; sgd with momentum / rmsprop: 1; sgd: 0
  double momentum = 0.0;                 // sgd only
  bool packed_weights = true;            // optimizer.packed_weights on a CPU cluster: GEMM-layout copies of the weights
  int64_t vocab_pad_multiple = 128;      // dist.vocab_pad_multiple (tensor parallel only)
  double bucket_mb = 25.0;               // dist.bucket_mb
  // The config's own batch: micro-batch, accumulation; the global batch is micro × accum × dp.
  int64_t micro_batch = 1, accum = 1;
  int optimizer_states() const;  // f32 tensors of the parameter's size per parameter
};

enum class Schedule { gpipe, one_f_one_b, interleaved, zb_h1 };
const char* schedule_name(Schedule s);  // athanor's dist.pp_schedule spelling
Schedule parse_schedule(const std::string& s);

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  int virtual_stages = 1;  // interleaved schedule only
  Schedule schedule = Schedule::one_f_one_b;
  int zero = 0;            // 0 (DDP) | 1 | 2 | 3, on the dp dimension
  int64_t micro_batch = 1; // samples per micro-batch per dp rank
  int64_t accum = 1;       // micro-batches per step (the pipeline's micro-batches under pp)
  bool recompute = false;  // model.gradient_checkpointing: keep each block's input only
  bool sequence_parallel = false;
  int world() const { return dp * tp * pp; }
  int64_t global_batch() const { return micro_batch * accum * dp; }
  std::string str() const;  // "dp 8 tp 8 pp 16 (1f1b, m 12) zero 1 mb 1 recompute"
};

// Checks that the model divides by the layout (heads and vocab by tp, layers by pp × virtual
// stages, the sequence by tp under sequence parallelism, micro-batches by pp for the
// interleaved schedule) and that athanor supports the combination. Returns "" when it does,
// else the reason in one line.
std::string layout_problem(const TrainSpec& spec, const Layout& l);
// The same, as an athanor::Error with a hint (for a layout the user named).
void check_layout(const TrainSpec& spec, const Layout& l);
// Checks the model itself (positive sizes, heads divide the width; a Llama also by nn's own
// rules): an Error naming the key.
void check_model(const ModelSpec& m);

}  // namespace athanor::plan
