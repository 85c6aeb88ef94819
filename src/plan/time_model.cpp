// The α-β step-time model (plan/time_model.h).
#include "athanor/plan/time_model.h"

#include <algorithm>
#include <cmath>

namespace athanor::plan {

namespace {

// The head's GEMM per token of a step (forward 2 flops per weight, backward twice that).
double head_flops(const ModelSpec& m) { return 6.0 * static_cast<double>(m.vocab) * static_cast<double>(m.n_embd); }

// A ring collective over n ranks: `factor` × bytes on the wire per rank, `hops` latencies of α.
double ring(double bytes, int n, double factor, double hops, const Link& link, double alpha) {
  if (n <= 1) return 0;
  return hops * alpha + factor * bytes / link.bytes_per_s;
}

}  // namespace

double model_flops_per_token(const ModelSpec& m) {
  // The Llama's is nn's own definition (nn::Llama::flops_per_token), not a copy of it.
  if (m.llama()) return nn::llama_flops_per_token(llama_config(m), m.seq);
  // GPT: the GEMM weights (blocks' Linears and the tied head) and attention, per token: forward 2
  // flops per weight and 4·h·s per layer for QKᵀ and PV (causal: counted whole, as PaLM does);
  // backward twice the forward.
  const double h = static_cast<double>(m.n_embd);
  const double matmul = static_cast<double>(m.n_layer) * 12 * h * h + static_cast<double>(m.vocab) * h;
  return 6 * matmul + 12.0 * static_cast<double>(m.n_layer * m.n_embd * m.seq);
}

StepTime step_time(const TrainSpec& spec, const Layout& l, const Cluster& c) {
  const ModelSpec& m = spec.model;
  StepTime t;
  const double h = static_cast<double>(m.n_embd), s = static_cast<double>(m.seq);
  const double tokens_mb = static_cast<double>(l.micro_batch) * s;
  const double layers_stage = static_cast<double>(m.n_layer) / l.pp;
  const double lp = spec.precision == Precision::f32 ? 4.0 : 2.0;

  // Compute of one micro-batch on one rank of the busiest stage (the last holds the head too): the
  // model's FLOPs per token split into the head's GEMM and equal layers, a third of each forward.
  const double per_layer = (model_flops_per_token(m) - head_flops(m)) / static_cast<double>(m.n_layer);
  const double fwd_layer = per_layer / 3 * tokens_mb / l.tp;
  const double fwd_head = head_flops(m) / 3 * tokens_mb / l.tp;
  const double fwd = layers_stage * fwd_layer + fwd_head;
  const double flops_mb = 3 * fwd + (l.recompute || l.zero == 3 ? layers_stage * fwd_layer : 0);  // ZeRO-3 recomputes its blocks
  const int ranks_on_node = std::min(l.world(), c.devices_per_node);
  // Shared cores: one thread per rank, so a rank gets one core's share of the peak, or less when
  // the ranks outnumber the cores; by the measured slowdown of concurrent ranks when the probe ran.
  const double rate = c.shared_compute ? c.peak(spec.precision) / c.cores * c.efficiency_for(spec.precision) / c.rank_slowdown(ranks_on_node)
                                       : c.peak(spec.precision) * c.efficiency_for(spec.precision);
  const double t_mb = flops_mb / rate;
  const double m_count = static_cast<double>(l.accum);
  t.compute = m_count * t_mb;
  if (l.pp > 1) {
    double bubble = (l.pp - 1) * t_mb;
    if (l.schedule == Schedule::interleaved) bubble /= l.virtual_stages;
    if (l.schedule == Schedule::zb_h1) bubble /= 3;
    t.bubble = bubble;
  }

  // Which link each group crosses (ranks: tp fastest, then dp, then pp).
  const int dpn = c.devices_per_node;
  const Link& tp_link = l.tp <= dpn ? c.intra : c.inter;
  const Link& dp_link = l.tp * l.dp <= dpn ? c.intra : c.inter;
  const Link& pp_link = l.world() <= dpn ? c.intra : c.inter;

  // α of a group: the link's, or the oversubscribed one when the node's ranks outnumber its
  // cores (a collective waits for peers the scheduler has descheduled).
  const bool oversubscribed = c.shared_compute && ranks_on_node > c.cores && c.latency_oversubscribed_s >= 0;
  auto alpha = [&](const Link& link) { return oversubscribed ? c.latency_oversubscribed_s : link.latency_s; };

  // Data parallel: the stage's f32 gradients once per step, in DDP's buckets (each its own
  // all-reduce, so its own latencies).
  const double psi = (static_cast<double>(m.n_layer) / l.pp * static_cast<double>(m.block_params()) +
                     static_cast<double>(m.vocab) * h * (m.tie_embeddings ? 1 : 2)) / l.tp;
  const double bucket_bytes = (spec.bucket_mb > 0 ? spec.bucket_mb : 25.0) * 1048576.0;
  const double buckets = std::max(1.0, std::ceil(4 * psi / bucket_bytes));
  double dp = ring(4 * psi, l.dp, 2.0 * (l.dp - 1) / l.dp, buckets * 2.0 * (l.dp - 1), dp_link, alpha(dp_link));
  if (l.zero == 3) dp *= 1.5;
  // Overlapped with the last micro-batch's backward (2/3 of its compute), except ZeRO-3's gathers.
  const double hidden = l.zero == 3 ? 0 : (2.0 / 3.0) * t_mb;
  t.dp_comm = std::max(0.0, dp - hidden);

  // Tensor parallel: 4 all-reduces (6 with recompute) of the micro-batch's activations per layer.
  const double per_ar = ring(tokens_mb * h * lp, l.tp, 2.0 * (l.tp - 1) / l.tp, 2.0 * (l.tp - 1), tp_link, alpha(tp_link));
  t.tp_comm = m_count * layers_stage * (l.recompute ? 6 : 4) * per_ar;

  // Pipeline: each micro-batch's boundary activation forward and its gradient back, plus the
  // fill and drain of the pipe.
  if (l.pp > 1) {
    const double bytes = tokens_mb * h * lp / (l.sequence_parallel ? l.tp : 1);
    const double one = alpha(pp_link) + bytes / pp_link.bytes_per_s;
    t.pp_comm = 2 * (m_count + l.pp - 1) * one;
  }

  // The trainer's own small collectives per step (src/train: the found-inf vote over the world,
  // the targets and the loss summed over dp, the gradient norm over tp, the loss broadcast from
  // the last stage): latency-bound, one each, none overlapped.
  const Link& world_link = l.world() <= dpn ? c.intra : c.inter;
  t.sync = ring(8, l.world(), 0, 2.0 * (l.world() - 1), world_link, alpha(world_link)) +
           2 * ring(8, l.dp, 0, l.dp - 1.0, dp_link, alpha(dp_link)) +
           ring(8, l.tp, 0, 2.0 * (l.tp - 1), tp_link, alpha(tp_link)) + ring(8, l.pp, 0, l.pp - 1.0, pp_link, alpha(pp_link));
  t.total = t.compute + t.bubble + t.dp_comm + t.tp_comm + t.pp_comm + t.sync;
  const double tokens_step = static_cast<double>(l.global_batch()) * s;
  t.tokens_per_s = tokens_step / t.total;
  t.model_flops = model_flops_per_token(m) * tokens_step;
  const double peak_all = c.shared_compute ? c.peak(spec.precision) * std::max(1, l.world() / dpn)
                                           : c.peak(spec.precision) * l.world();
  t.mfu = t.model_flops / t.total / peak_all;
  return t;
}

}  // namespace athanor::plan
