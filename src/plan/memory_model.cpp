// The per-rank memory model (plan/memory_model.h). Each term names where athanor
// allocates it, so a miss against a measured run points at the term that is wrong.
#include "athanor/plan/memory_model.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "athanor/dist/pipeline_schedule.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/weight_packing.h"

namespace athanor::plan {

double zero_model_state_bytes(double psi, int nd, int stage, StateBytes b) {
  const double n = std::max(1, nd);
  switch (stage) {
    case 0: return psi * (b.param + b.grad + b.k);
    case 1: return (b.param + b.grad) * psi + b.k * psi / n;
    case 2: return b.param * psi + (b.grad + b.k) * psi / n;
    default: return (b.param + b.grad + b.k) * psi / n;
  }
}

namespace {

double lowp_bytes(Precision p) { return p == Precision::f32 ? 4.0 : 2.0; }

// The vocabulary rows this rank holds: padded to a multiple of vocab_pad_multiple x tp under
// tensor parallelism (dist/tensor_parallel_gpt.cpp), split over tp.
double vocab_rows(const TrainSpec& s, int tp) {
  if (tp == 1) return static_cast<double>(s.model.vocab);
  const int64_t q = s.vocab_pad_multiple * tp;
  return static_cast<double>((s.model.vocab + q - 1) / q * q) / tp;
}

// One block's parameters on a tensor-parallel rank: the column-parallel Linears (GPT's c_attn
// and c_fc, the Llama's q/k/v, gate and up) and the row-parallel projections split their
// weights; the row-parallel biases and the norms are replicated.
double block_params_tp(const ModelSpec& m, int tp) {
  const double h = static_cast<double>(m.n_embd);
  double weights = 0;
  for (const BlockLinear& b : m.block_linears(tp)) weights += b.out * b.in;
  if (m.llama()) return weights + 2 * h;  // no biases; two RMSNorm weights
  const double biases = m.bias ? (3 * h + 4 * h) / tp + 2 * h : 0;
  const double norms = m.bias ? 4 * h : 2 * h;
  return weights + biases + norms;
}


// The GEMM-layout copy athanor's CPU linears keep of a weight [out, in] multiplied by M rows,
// for x·Wᵀ (forward) or dy·W, only where oneDNN's blocked kernels would run
// (cpu::gemm_prefers_packed_b, the test the ops make), in the padded blocked layout.
double packed_bytes(Precision p, double M, double out, double in, bool forward) {
  if (p == Precision::f16) return 0;  // f16 GEMMs run in f32 on the CPU, unpacked
  const bool bf16 = p == Precision::bf16;
  const auto m = static_cast<int64_t>(M), o = static_cast<int64_t>(out), i = static_cast<int64_t>(in);
  if (forward) return cpu::gemm_prefers_packed_b(bf16, true, m, o, i) ? static_cast<double>(cpu::packed_layout(bf16, i, o).bytes()) : 0;
  return cpu::gemm_prefers_packed_b(bf16, false, m, i, o) ? static_cast<double>(cpu::packed_layout(bf16, o, i).bytes()) : 0;
}

// What nn::Llama's decoder layer saves (rms_norm: its input and rstd; each Linear and swiglu its
// input; rope nothing; scaled_dot_product_attention q, k, v as it reads them (the transposed
// views in place), its output (o_proj's input: the transpose back is a view) and the log-sum-exp;
// swiglu also its two GEMMs' outputs g and u). Under autocast q_proj, k_proj and v_proj each cast
// the f32 RMSNorm output themselves (rms_norm offers no low-precision copy, unlike layer_norm), so
// three 16-bit copies of it are kept; swiglu casts its input once.
std::vector<SavedTensor> llama_activation_tensors(const TrainSpec& spec, const Layout& l, bool recompute) {
  const ModelSpec& m = spec.model;
  const double h = static_cast<double>(m.n_embd), t = l.tp, lp = lowp_bytes(spec.precision);
  const double kv = m.kv_width_per_rank(l.tp), I = static_cast<double>(m.intermediate);
  const bool autocast = spec.precision != Precision::f32;
  std::vector<SavedTensor> v;
  auto add = [&](const std::string& what, double elements, double bytes_per) { v.push_back({what, elements, elements * bytes_per}); };
  add("layer input (residual stream, f32; input_layernorm's input)", h, 4);
  if (recompute) return v;  // checkpoint(): everything else is recomputed in backward
  add("input_layernorm rstd (f32)", 1, 4);
  if (autocast) add("input_layernorm output, cast by q_proj, k_proj and v_proj each", 3 * h, lp);
  else add("input_layernorm output (q/k/v_proj's input)", h, lp);
  add("q after RoPE (attention's input)", h / t, lp);
  add("k after RoPE (attention's input)", kv, lp);
  add("v (v_proj's output; attention's input)", kv, lp);
  add("attention output (o_proj's input)", h / t, lp);
  add("attention log-sum-exp (f32, per query head)", static_cast<double>(m.n_head) / t, 4);
  add("residual after attention (f32; post_attention_layernorm's input)", h, 4);
  add("post_attention_layernorm rstd (f32)", 1, 4);
  add("post_attention_layernorm output (swiglu's input)", h, lp);
  add("gate and up (swiglu's x W_gate^T, x W_up^T)", 2 * I / t, lp);
  add("swiglu output (down_proj's input)", I / t, lp);
  return v;
}

}  // namespace

std::vector<SavedTensor> activation_tensors(const TrainSpec& spec, const Layout& l) {
  const ModelSpec& m = spec.model;
  // ZeRO-3 runs each block under checkpoint() (dist/zero3.cpp): its gathered weights can go as
  // soon as the forward is done, because nothing of the block is saved.
  const bool recompute = l.recompute || l.zero == 3;
  const double h = static_cast<double>(m.n_embd), t = l.tp;
  const double lp = lowp_bytes(spec.precision);
  // Tokens this rank holds outside the tensor-parallel region: all of them, or 1/tp of
  // them with sequence parallelism.
  const double seq_share = l.sequence_parallel ? 1.0 / t : 1.0;
  std::vector<SavedTensor> v;
  auto add = [&](const std::string& what, double elements, double bytes_per) { v.push_back({what, elements, elements * bytes_per}); };
  if (m.llama()) return llama_activation_tensors(spec, l, recompute);
  // The block's input: the f32 residual stream, saved by ln_1 (for block 0 the embeddings' sum).
  add("block input (residual stream, f32; ln_1's input)", h * seq_share, 4);
  if (recompute) return v;  // checkpoint(): everything else is recomputed in backward
  add("ln_1 mean and rstd (f32)", 2 * seq_share, 4);
  // c_attn saves its input: the LayerNorm output, cast to the autocast dtype. Under sequence
  // parallelism the gathered input is regathered in backward (dist.sequence_parallel_regather),
  // so only this rank's part is kept.
  add("ln_1 output (c_attn's input)", h * seq_share, lp);
  add("qkv (c_attn's output; attention's input)", 3 * h / t, lp);
  add("attention output (c_proj's input)", h / t, lp);
  add("attention log-sum-exp (f32, per head)", static_cast<double>(m.n_head) / t, 4);
  add("residual after attention (f32; ln_2's input)", h * seq_share, 4);
  add("ln_2 mean and rstd (f32)", 2 * seq_share, 4);
  add("ln_2 output (c_fc's input)", h * seq_share, lp);
  add("c_fc output (gelu_linear's input; gelu recomputed in backward)", 4 * h / t, lp);
  // Dropout keeps no mask: it is regenerated from the saved Philox (seed, offset).
  return v;
}

double activation_bytes_per_layer(const TrainSpec& spec, const Layout& l) {
  double per_token = 0;
  for (const auto& s : activation_tensors(spec, l)) per_token += s.bytes;
  return per_token * static_cast<double>(l.micro_batch * spec.model.seq);
}

Korthikanti korthikanti_bytes_per_layer(const ModelSpec& m, int64_t micro_batch, int tp) {
  const double s = static_cast<double>(m.seq), b = static_cast<double>(micro_batch), h = static_cast<double>(m.n_embd),
               a = static_cast<double>(m.n_head), t = tp;
  Korthikanti k;
  k.none = s * b * h * (34 + 5 * a * s / h);
  k.tp = s * b * h * (10 + 24 / t + 5 * a * s / (h * t));
  k.tp_sp = s * b * h / t * (34 + 5 * a * s / h);
  k.recompute = 2 * s * b * h;
  return k;
}

double in_flight(const Layout& l, int stage) {
  const double m = static_cast<double>(l.accum), p = l.pp;
  if (l.pp == 1) return 1;
  switch (l.schedule) {
    case Schedule::gpipe: return m;
    case Schedule::one_f_one_b: return std::min(m, p - stage);
    // athanor's ZB-H1 defers each weight-gradient pass, and a micro-batch's saved tensors live
    // until it: every stage holds up to pp (dist/pipeline_schedule.cpp, checked in tests/plan).
    case Schedule::zb_h1: return std::min(m, p);
    case Schedule::interleaved: {
      // Megatron's warm-up count, in chunk micro-batches; one chunk holds 1/v of the stage's blocks.
      const double v = l.virtual_stages;
      const double chunks = std::min(m * v, (p - stage - 1) * 2 + (v - 1) * p + 1);
      return chunks / v;
    }
  }
  return 1;
}

StageMemory stage_memory(const TrainSpec& spec, const Layout& l, int stage) {
  const ModelSpec& m = spec.model;
  const double h = static_cast<double>(m.n_embd), lp = lowp_bytes(spec.precision);
  const bool autocast = spec.precision != Precision::f32;
  const bool first = stage == 0, last = stage == l.pp - 1;
  const int dp = l.dp;
  StageMemory r;
  r.stage = stage;
  r.layers = m.n_layer / l.pp;
  const double tokens = static_cast<double>(l.micro_batch * m.seq);
  const double seq_share = l.sequence_parallel ? 1.0 / l.tp : 1.0;

  // Parameters this rank holds: its blocks, the embeddings on the first stage (wte split by
  // vocabulary under tp, wpe whole), ln_f and the tied head's wte on the last.
  const double blocks = static_cast<double>(r.layers) * block_params_tp(m, l.tp);
  const double vrows = vocab_rows(spec, l.tp);
  double rest = 0;
  // The Llama has no position embedding; an untied lm_head is its own weight on the last stage,
  // a tied one a copy of the embedding there when the stages differ.
  if (first) rest += (vrows + (m.llama() ? 0.0 : static_cast<double>(m.seq))) * h;
  if (last) rest += m.final_norm_params() + (first && m.tie_embeddings ? 0 : vrows * h);
  r.params_count = blocks + rest;

  // ZeRO-3 shards only the blocks; a block is gathered whole around its forward and backward.
  // Gathering a block allocates the whole block and this rank's segment (dist/zero3.cpp).
  const double held = l.zero == 3 ? blocks / dp + rest + block_params_tp(m, l.tp) * (1 + 1.0 / dp) : blocks + rest;
  r.params = 4 * held;
  // Under autocast every weight has a 16-bit copy, tagged parameter: the optimizer writes one
  // per weight it updates (optimizer.low_precision_copies), autocast casts the others and the
  // GEMMs save them for backward (ops/autocast.cpp).
  if (autocast) r.params += lp * held;
  // Packed GEMM-layout copies (ops/packed_weights.h; CPU only), one per weight and use (x·Wᵀ,
  // dy·W). A copy stays current only while its weight keeps the version it was packed at:
  //  - the optimizer repacks the weights it updates, so with ZeRO-1/2 over dp > 1 only the
  //    owned 1/dp keep theirs in f32, and none in bf16 (the weights' all-gather makes the 16-bit
  //    copies stale, and autocast's fresh casts are never seen twice);
  //  - an op packs a weight itself when it sees it twice at one version: ZeRO-3's recompute
  //    runs each gathered block's forward twice, so f32 blocks keep their x·Wᵀ copies.
  if (spec.packed_weights) {
    const double M = tokens;
    const Precision p = spec.precision;
    double block_fwd = 0, block = 0;
    for (const BlockLinear& b : m.block_linears(l.tp)) {
      block_fwd += packed_bytes(p, M, b.out, b.in, true);
      block += packed_bytes(p, M, b.out, b.in, true) + packed_bytes(p, M, b.out, b.in, false);
    }
    const double head = last ? packed_bytes(p, M, vrows, h, true) + packed_bytes(p, M, vrows, h, false) : 0;
    const double layers = static_cast<double>(r.layers);
    const bool sharded = l.zero >= 1 && dp > 1;
    double packed = layers * block + head;
    if (sharded && p != Precision::f32) packed = 0;
    else if (l.zero == 3 && dp > 1) packed = layers * block_fwd + head / dp;
    else if (sharded && l.accum == 1) packed /= dp;
    r.derived = packed;
  }

  // Optimizer states: f32, one or two per parameter, on the owner only from ZeRO-1 on.
  const double states = spec.optimizer_states() * 4.0;
  r.optimizer = states * (l.zero >= 1 ? (blocks + rest) / dp : blocks + rest);

  // Gradients (f32): each parameter's .grad, allocated in backward (zero_grad frees them), in
  // full while micro-batches accumulate (the reduction waits for the last). DDP (ZeRO-0/1)
  // reduces them through flat buckets of the same total size (dist/ddp.cpp), kept for the run.
  // ZeRO-2/3 launch a bucket's reduce-scatter when its gradients are ready: its .grads, a packed
  // copy and the received segment are alive together, then only the owned shard stays.
  const double psi = blocks + rest;
  const double grads_full = 4 * psi;
  const double shard = 4 * psi / dp;
  double comm = 0;
  // Flat buckets (tagged gradient) in every distributed run: the trainer wraps a tensor- or
  // pipeline-parallel stage in DataParallel too, even at dp 1 (its grad sync over tp).
  if (l.world() > 1 && l.zero <= 1) comm = 4 * psi;
  // ZeRO-3 reduces each block's gradients as one bucket (dist/zero.cpp), the rest by bucket_mb.
  const double bucket = l.zero == 3 ? std::max(4 * block_params_tp(m, l.tp), std::min(spec.bucket_mb * 1048576, 4 * rest))
                                    : std::min(spec.bucket_mb * 1024 * 1024, grads_full);
  // Buckets launch as their gradients become ready, at most two reducing at once (dist/zero.h
  // kMaxInFlight): at the last launch, the owned shard, that bucket's .grads, packed copy and
  // received segment, and the previous bucket's packed copy and segment if there is one.
  const double grads_at_reduce =
      l.zero >= 2 && dp > 1 ? shard + bucket * (2 + 1.0 / dp) + (grads_full > bucket ? bucket * (1 + 1.0 / dp) : 0) : 0;
  const double grads_at_update = l.zero >= 2 && dp > 1 ? shard : grads_full;
  // ZeRO-1/2/3 all-gather the updated weights after the step into a workspace of the whole
  // (non-block, at stage 3) parameters plus this rank's segment (DataParallel::all_gather_parameters).
  const double gathered = l.zero == 3 ? rest : psi;
  const double gather_ws = l.zero >= 1 && dp > 1 ? 4 * gathered * (1 + 1.0 / dp) : 0;
  r.comm = comm;
  r.state_params = 4 * (l.zero == 3 ? blocks / dp + rest : blocks + rest);
  r.state_grads = l.zero >= 2 ? shard : grads_full;
  r.state_optimizer = r.optimizer;

  // Activations: each block's saved tensors for every micro-batch in flight; the first stage
  // keeps the embedding lookup's ids, the last ln_f's input and stats, the head's input and the
  // f32 logits cross-entropy saves.
  r.in_flight = static_cast<int>(std::ceil(in_flight(l, stage)));
  const double n = in_flight(l, stage);
  double per_mb = static_cast<double>(r.layers) * activation_bytes_per_layer(spec, l);
  if (first) per_mb += tokens * 8;  // ids (i64)
  // A stage's output is kept for its backward (dist/pipeline_executor.cpp); on the last stage it
  // is ln_f's input, counted below.
  if (!last) per_mb += tokens * h * seq_share * 4;
  // The last: the final norm's input and statistics (LayerNorm mean and rstd, RMSNorm rstd), the
  // head's input, and what cross-entropy (or its vocabulary-parallel twin) saves: the logits in
  // their own dtype (under autocast it reads the 16-bit logits directly) and f32 row statistics.
  const double head_acts = tokens * (h * seq_share * 4 + (m.llama() ? 4 : 8) + h * lp + vrows * lp + 8);
  if (last) per_mb += head_acts;
  r.activation_per_micro_batch = per_mb;
  r.activations = per_mb * n;

  // Workspace of a backward: the larger of the logits' gradient (last stage) and a block's
  // temporaries (GPT: c_fc's 4h-wide gradient and an h-wide one, f32), which come one after the
  // other; under recompute, plus the intermediates of the one block being recomputed.
  // The Llama's widest moment is swiglu's backward: the gradient of its output, its dg and du
  // (I/t each, in the dtype swiglu ran in: 16-bit under autocast) and the two h-wide input
  // gradients it sums.
  const double block_ws = m.llama() ? tokens * (3 * static_cast<double>(m.intermediate) / l.tp * lp + 2 * h * 4) : tokens * 5 * h / l.tp * 4;
  // The backward's first moment holds every saved tensor and the logits' gradient (in their
  // dtype); by the time it reaches the last block, the head's saved tensors are gone.
  double ws = last ? std::max(tokens * vrows * lp, block_ws - head_acts) : block_ws;
  if (l.recompute || l.zero == 3) {
    Layout full = l;
    full.recompute = false;
    full.zero = 0;
    ws += activation_bytes_per_layer(spec, full);
  }
  // ZB-H1 defers each weight-gradient pass: until it runs, the micro-batch keeps the output
  // gradients its Linears' weight gradients need (f32: c_attn 3h/t, c_proj h, c_fc 4h/t,
  // mlp.c_proj h per token and layer; the head's V/t on the last stage). The worst moment of
  // forwarded-and-not-done micro-batches and deferred ones comes from the schedule itself.
  if (l.pp > 1 && l.schedule == Schedule::zb_h1) {
    double outs = 0;  // per token and layer: every Linear's output width on this rank
    for (const BlockLinear& b : m.block_linears(l.tp)) outs += b.out;
    const double deferred = tokens * 4 * (static_cast<double>(r.layers) * outs + (last ? vrows : 0));
    const int mm = static_cast<int>(std::min<int64_t>(l.accum, 4 * l.pp));  // the pattern repeats past the warm-up
    int live = 0, pending = 0;
    double worst = -1, worst_live = 0, worst_pending = 0;
    for (const auto& a : dist::make_schedule(dist::ScheduleKind::zero_bubble, l.pp, stage, mm, 1)) {
      if (a.kind == dist::ActionKind::forward) ++live;
      if (a.kind == dist::ActionKind::backward_input) ++pending;
      const double v = live * per_mb + pending * deferred;
      if (v > worst) worst = v, worst_live = live, worst_pending = pending;
      if (a.kind == dist::ActionKind::backward_weight) --live, --pending;
    }
    r.in_flight = static_cast<int>(worst_live);
    r.activations = worst_live * per_mb;
    ws += worst_pending * deferred;
  }
  // A pipeline stage's backward of a later micro-batch (the .grads already exist) holds a
  // workspace of the stage's gradient size on top: measured on every 1F1B, GPipe and interleaved
  // run in bench/plan_check.sh (each weight's new gradient before it is added into .grad).
  // ZB-H1 computes the weight gradients in its separate W passes, and does not show it.
  if (l.pp > 1 && l.schedule != Schedule::zb_h1 && l.accum > 1) ws += 4 * (blocks + rest);
  r.workspace = ws;
  // The peak is the largest of three moments (static memory aside):
  //   forward: the in-flight activations and the backward's first workspace, plus the full
  //            gradients of earlier micro-batches (accumulation, or a pipeline's steady state);
  //   reduce:  ZeRO-2/3 at the last bucket's launch (the activations are gone by then);
  //   update:  the gradients the optimizer reads and the weights' all-gather workspace.
  const bool grads_during_forward = static_cast<double>(l.accum) > n;
  const double at_forward = r.activations + r.workspace + (grads_during_forward ? grads_full : 0);
  double at_reduce = grads_at_reduce;
  // ZeRO-3 keeps only block inputs, so its backward holds them, a recomputed block and its
  // temporaries while the owned shard and the previous block's reduce-scatter are alive too.
  if (l.zero == 3 && dp > 1) at_reduce = r.activations + r.workspace + shard + bucket * (1 + 1.0 / dp);
  const double at_update = grads_at_update + gather_ws;
  if (at_forward >= at_reduce && at_forward >= at_update) {
    r.grads = grads_during_forward ? grads_full : 0;
  } else if (at_reduce >= at_update) {
    if (l.zero == 3 && dp > 1) {
      r.grads = shard + bucket * (1 + 1.0 / dp);
    } else {
      r.grads = at_reduce;
      r.activations = r.workspace = 0;
    }
  } else {
    r.grads = grads_at_update;
    r.activations = 0;
    r.workspace = gather_ws;
  }
  return r;
}

std::vector<StageMemory> memory_per_stage(const TrainSpec& spec, const Layout& l) {
  std::vector<StageMemory> v;
  for (int s = 0; s < l.pp; ++s) v.push_back(stage_memory(spec, l, s));
  return v;
}

std::string StageMemory::largest() const {
  struct C {
    const char* name;
    double v;
  };
  const C cs[] = {{"parameters", params}, {"gradients", grads}, {"optimizer states", optimizer},
                  {"activations", activations}, {"workspace", workspace}, {"packed weights", derived},
                  {"communication buffers", comm}};
  const C* best = &cs[0];
  for (const auto& c : cs)
    if (c.v > best->v) best = &c;
  std::ostringstream o;
  o << best->name;
  if (best->v == activations && in_flight > 1) o << " of " << in_flight << " in-flight micro-batches";
  return o.str();
}

}  // namespace athanor::plan
