#pragma once
// What the planner reasons about, as plain values: the model and its training
// settings (filled by apps/ from a training config, or by a test), and one
// parallel layout of it. No training machinery is reachable from here (the plan
// layer sits below train), so a plan can be made for a model no machine here holds.
#include <cstdint>
#include <string>

namespace athanor::plan {

enum class Precision { f32, bf16, f16 };
const char* precision_name(Precision p);
Precision parse_precision(const std::string& s);  // "f32" | "bf16" | "f16"; an Error otherwise

// A GPT (athanor's nn::GPT: pre-LayerNorm blocks, fused qkv, GELU MLP of width 4h,
// tied embedding, learned positions).
struct ModelSpec {
  std::string name = "gpt";
  int64_t n_layer = 0, n_head = 0, n_embd = 0;
  int64_t seq = 0;    // tokens per sample (model.block_size)
  int64_t vocab = 0;  // before tensor-parallel padding
  bool bias = true;
  double dropout = 0.0;
  // Parameters of one transformer block, of the embeddings (wte + wpe) and of the final LayerNorm.
  int64_t block_params() const;
  int64_t embedding_params() const;
  int64_t final_norm_params() const;
  int64_t total_params() const;  // the tied head counted once
};

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
// Checks the model itself (positive sizes, heads divide the width): an Error naming the key.
void check_model(const ModelSpec& m);

}  // namespace athanor::plan
