#pragma once
// Per-rank memory of a parallel layout, by the allocator's categories, per pipeline stage,
// written for athanor's own layout (not a generic framework's):
//
//  - model states. athanor keeps f32 master weights (4 B/param), f32 gradients (4) and
//    f32 optimizer states (4 per state: AdamW's m and v = 8), whatever the autocast
//    precision; under bf16/f16 the GEMM weights also get a 16-bit copy (2 B, tagged
//    parameter). ZeRO shards on the dp dimension: stage 1 the states, stage 2 also the
//    gradients, stage 3 also the blocks' weights (embeddings and final norm stay whole);
//  - activations: what athanor's GPT block or Llama decoder layer saves for backward, tensor by tensor (see
//    activation_tensors), × the micro-batches the pipeline schedule keeps in flight;
//  - workspace: the backward's transient gradients of the largest block and of the logits;
//  - derived copies (the GEMM-layout packed weights) and communication buffers (DDP's
//    flat gradient buckets, ZeRO's reduce-scatter segments, ZeRO-3's gathered block);
//  - a fragmentation margin, stated, added only to the "needs" figure that is checked
//    against the device's memory (the allocator's counts are of requested bytes).
#include <string>
#include <vector>

#include "athanor/plan/spec.h"

namespace athanor::plan {

// Bytes per parameter of each model state, for the ZeRO paper's formulas.
struct StateBytes {
  double param = 4, grad = 4, k = 8;  // athanor: f32 weights, f32 gradients, K = 4 x optimizer states
};
// The ZeRO paper's mixed-precision Adam: 2 + 2 + 12 (fp16 weights and gradients; fp32 master, m, v).
inline constexpr StateBytes kZeroPaperBytes{2, 2, 12};
// Model-state bytes per rank of psi parameters at ZeRO stage 0..3 over nd data-parallel ranks:
// Ψ(p+g+K); (p+g)Ψ + KΨ/Nd; pΨ + (g+K)Ψ/Nd; (p+g+K)Ψ/Nd.
double zero_model_state_bytes(double psi, int nd, int stage, StateBytes b);

// One tensor a transformer block keeps for backward, per token of a micro-batch.
struct SavedTensor {
  std::string what;     // "qkv (c_attn output, saved by attention)"
  double elements;      // per token, of this rank
  double bytes;         // per token, of this rank
};
// The tensors athanor's GPT block saves (ops' save() calls: LayerNorm its input, mean and rstd;
// Linear its input; attention qkv, output and log-sum-exp; gelu_linear its input; dropout no
// mask), or the Llama's decoder layer (RMSNorm its input and rstd; q/k/v_proj their input, cast
// by each under autocast; attention q and k after RoPE, v, output and log-sum-exp; swiglu its
// input, gate and up; down_proj its input), for this rank under tp / sequence parallelism, at
// the layout's precision. Under recompute a block keeps only its input.
std::vector<SavedTensor> activation_tensors(const TrainSpec& spec, const Layout& l);
double activation_bytes_per_layer(const TrainSpec& spec, const Layout& l);  // one micro-batch, this rank
// Korthikanti et al. 2022, bytes per layer of one micro-batch in 16-bit training:
// sbh(34 + 5as/h) alone, sbh(10 + 24/t + 5as/(ht)) with tensor parallelism,
// sbh/t (34 + 5as/h) with sequence parallelism too, 2sbh (the input only) with full recompute.
struct Korthikanti {
  double none = 0, tp = 0, tp_sp = 0, recompute = 0;
};
Korthikanti korthikanti_bytes_per_layer(const ModelSpec& m, int64_t micro_batch, int tp);

struct StageMemory {
  int stage = 0;
  int64_t layers = 0;      // blocks on this stage (all chunks)
  double params_count = 0; // parameters this rank holds in full (before ZeRO-3 sharding)
  double params = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0, derived = 0, comm = 0;
  // The model states alone, as the ZeRO paper counts them (f32 weights, f32 gradients, optimizer
  // states; no 16-bit copies, gathered blocks, buckets in flight): what its formulas give.
  double state_params = 0, state_grads = 0, state_optimizer = 0;
  int in_flight = 1;       // micro-batches whose activations are held at once
  double activation_per_micro_batch = 0;
  double peak() const { return params + grads + optimizer + activations + workspace + derived + comm; }
  double needs(double margin) const { return peak() * (1 + margin); }
  std::string largest() const;  // the largest category and its share: "activations of 8 in-flight micro-batches"
};

// Fragmentation margin added to the peak when checking that a layout fits: the caching
// allocators (athanor's CPU size classes, a CUDA caching allocator) round blocks up and
// keep freed blocks; 10% is what PyTorch users are told to leave.
inline constexpr double kFragmentationMargin = 0.10;

// Micro-batches in flight on a stage for a schedule (GPipe: all m; 1F1B: min(m, pp - stage);
// ZB-H1: min(m, pp), its deferred weight passes keep them; interleaved: Megatron's (pp - stage - 1) * 2 + (v - 1) * pp + 1 chunk
// micro-batches, counted in chunks).
double in_flight(const Layout& l, int stage);
StageMemory stage_memory(const TrainSpec& spec, const Layout& l, int stage);
std::vector<StageMemory> memory_per_stage(const TrainSpec& spec, const Layout& l);

}  // namespace athanor::plan
