#pragma once
// The step time of a layout: compute from FLOPs, communication from an α-β model per
// collective and group, the pipeline bubble of the schedule. The assumptions, stated:
//
//  - compute = FLOPs ÷ (peak × efficiency); FLOPs are PaLM's 6N per token plus 12·L·h·s for
//    attention (the Llama's: nn::llama_flops_per_token, its one definition), split into the
//    head's GEMM and equal layers, + one more forward of the layers under recompute. On a node whose devices share
//    the cores (this CPU), a rank's rate is the node's over the ranks on it;
//  - a ring collective over n ranks moves 2(n−1)/n of the buffer per rank (all-reduce) or
//    (n−1)/n (reduce-scatter, all-gather), with 2(n−1) (resp. n−1) latencies;
//  - data parallel: f32 gradients reduced once per step (athanor reduces the f32 .grad); ZeRO-1/2
//    reduce-scatter the gradients and all-gather the updated weights (the same bytes as an
//    all-reduce); ZeRO-3 also all-gathers each block's weights for the backward: 1.5×. The
//    reduction overlaps the backward of the step's last micro-batch; ZeRO-3's gathers do not;
//  - tensor parallel: 4 all-reduces of the micro-batch's activations per layer (2 forward, 2
//    backward; 6 under recompute), with sequence parallelism as reduce-scatter + all-gather pairs
//    of the same volume; none overlapped;
//  - pipeline: a send and a receive of one micro-batch's boundary activation per micro-batch
//    and direction, on the critical path; the bubble is (pp−1)/m of the compute for GPipe and
//    1F1B, (pp−1)/(v·m) interleaved, a third of 1F1B's for ZB-H1;
//  - DDP reduces in buckets of dist.bucket_mb, each an all-reduce with its own latencies; the
//    trainer adds a few latency-bound collectives per step (found-inf vote, loss and targets
//    over dp, gradient norm over tp, loss broadcast over pp);
//  - α is the link's, or on a node whose ranks outnumber its cores the oversubscribed α (the
//    CPU preset measures both under mpirun: plan-probe);
//  - a group is on the intra-node link when all its ranks share a node (ranks: tp fastest, then
//    dp, then pp), else on the inter-node link.
#include <string>

#include "athanor/plan/cluster.h"
#include "athanor/plan/spec.h"

namespace athanor::plan {

struct StepTime {
  double compute = 0, bubble = 0, dp_comm = 0, tp_comm = 0, pp_comm = 0, sync = 0;
  double total = 0;
  double tokens_per_s = 0, mfu = 0;
  double model_flops = 0;  // per step, whole model, without recompute (MFU's numerator)
};

double model_flops_per_token(const ModelSpec& m);  // 6N + 12·L·h·s (PaLM appendix B); a Llama's from nn
StepTime step_time(const TrainSpec& spec, const Layout& l, const Cluster& c);

}  // namespace athanor::plan
