#pragma once
// What a training run reports, step by step: the records every sink (terminal,
// metrics.jsonl, TensorBoard, report.html, the doctor) reads.
//
// metrics.jsonl holds one JSON object per line, written by the Trainer:
//   step lines:   {"step", "loss", "lr", "grad_norm", "grad_norm_clipped", "skipped",
//                  "skipped_total", "loss_scale" (only with the f16 scaler), "targets",
//                  "throughput", "step_s", "data_s", "forward_s", "backward_s",
//                  "optimizer_s", "comm_s", "mfu" (fraction of the hardware's peak, omitted
//                  when unknown), "gemm_efficiency" (fraction of a measured GEMM's rate),
//                  "mem": {"<tag>": {"cur": bytes, "peak": bytes}, …},
//                  "nonfinite_params": [names] (only when non-empty),
//                  "layers": {"<param name>": {"grad": norm, "param": norm, "update": ||ΔW||/||W||,
//                             "dim": rank}, …} (on layer-statistics steps: observe.layer_stats),
//                  "acts": {"<module path>:<op>": {"mean", "std", "absmax", "zero", "dead", "sat",
//                           "units"}, …} (same steps; "dead"/"sat" only where they apply),
//                  "input": {"mean", "std", "absmax", "samples", "max_id", "max_absmax",
//                            "median_absmax", "nonfinite_ids": [..]} (floating inputs),
//                  "elapsed_s": wall seconds since fit() started (evaluations, checkpoints included),
//                  "totals": {"steps", "step_s", "data_s", "forward_s", "backward_s", "optimizer_s",
//                             "comm_s"} summed over every step of this process so far, logged or not,
//                  "ranks": {"compute_s": [per rank]} (data parallel: each rank's summed time
//                           outside the gradient wait, over every step so far),
//                  "comm": {"<mesh dimension>": {"ops": n, "bytes": b, "wire_bytes": w, "s": seconds}, …}
//                          (distributed runs: the step's collectives, dist/comm_ledger.h),
//                  "pipeline": {"schedule", "stages", "virtual_stages", "micro_batches", "bubble",
//                               "theory", "recv_wait_s", "schedule_s"} (pipeline-parallel runs)}
//   eval lines:   {"step", "val_loss", "val_accuracy" (classifiers)}
// health.jsonl (same directory) holds one HealthEvent per line:
//   {"step", "kind", "severity", "message", "suggestions": [..], "details": {k: v},
//    "fix": {"<config key>": "<value>"} (only when the event names one)}
// run.json (same directory): facts of the run the doctor needs, written at the start:
//   {"world_size", "global_batch", "parameters", "label_entropy" (nats, integer targets),
//    "label_classes", "precision"}
// Non-finite numbers are written as null (JSON has no inf/nan).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace athanor::observe {

struct TagMemory {
  std::string tag;       // "parameter", "gradient", "optimizer_state", "activation", "workspace", "other"
  int64_t current = 0;   // bytes at the end of the step
  int64_t peak = 0;      // high-water mark during the step
};

struct LayerNorms {
  std::string name;      // parameter name, e.g. "transformer.h.3.attn.c_attn.weight"
  double grad_norm = 0;  // L2 norm of its (unscaled, pre-clip) gradient
  double param_norm = 0; // L2 norm of the parameter before the update
  double update_ratio = -1;  // ||W_after - W_before|| / ||W_before|| of this step (-1 = not measured)
  int ndim = 0;          // the parameter's rank (per-layer checks read weight matrices, ndim >= 2)
};

// A layer's forward output on a layer-statistics step (its first micro-batch).
struct ActivationStats {
  std::string name;            // "<module path>:<op>", e.g. "layers.0:linear_relu"
  double mean = 0, std = 0, absmax = 0;
  double zero_frac = 0;        // elements exactly 0
  double dead_frac = -1;       // ReLU family: units (features, or channels of NCHW) that are 0 for
                               // every sample of the batch; -1 = not a ReLU
  double saturated_frac = -1;  // sigmoid/tanh: elements within 1% of the bounds; -1 = not applicable
  int64_t units = 0;
};

// The step's floating inputs (all micro-batches); integer inputs (tokens) leave it empty.
struct InputStats {
  bool present = false;
  double mean = 0, std = 0, absmax = 0;
  int64_t samples = 0;
  std::vector<int64_t> nonfinite_ids;  // dataset ids of the samples whose input holds NaN/Inf
  int64_t max_id = -1;                 // the sample with the largest finite |x|, and that |x|
  double max_absmax = 0;
  double median_absmax = 0;            // median over the step's samples of their largest |x|
};

// Sums over every step so far (logged or not): what report.html's summary shows.
struct PhaseTotals {
  int64_t steps = 0;
  double step_s = 0, data_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0, comm_s = 0;
};

// A histogram in TensorBoard's HistogramProto form: bucket[i] counts values in
// (bucket_limit[i-1], bucket_limit[i]] (the first bucket starts at min).
struct Histogram {
  std::string tag;  // "weights/<name>" or "grads/<name>"
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> bucket_limit, bucket;
};

// One mesh dimension's communication in a step (dist/comm_ledger.h): every collective and
// point-to-point transfer this rank completed during the step.
struct CommStats {
  std::string dimension;  // "dp", "tp", "pp", "world"
  int64_t ops = 0;
  double bytes = 0;       // the tensors' sizes
  double wire_bytes = 0;  // what a ring implementation moves per rank
  double seconds = 0;     // posting to completion, summed (overlap with compute included)
};

// A pipeline-parallel step (dist.pp > 1), from the pipeline executor's clocks.
struct PipelineStepStats {
  std::string schedule;           // "gpipe", "1f1b", "interleaved", "zb-h1"; empty: no pipeline
  int stages = 0, virtual_stages = 1, micro_batches = 0;
  double bubble = 0;              // measured: mean over the pp ranks of idle / step time
  double theory = 0;              // the schedule's: (p-1)/(m+p-1), (p-1)/(vm+p-1), ZB-H1 simulated
  double recv_wait_seconds = 0;   // this rank's time waiting for activations and gradients
  double step_seconds = 0;        // the schedule's time (the longest pp rank's)
};

struct StepMetrics {
  int64_t step = 0;               // optimizer steps completed, counting this one
  double loss = 0;                // token/sample-weighted mean over the step's micro-batches
  double lr = 0;                  // lr used by this step
  double grad_norm = 0;           // global L2 norm before clipping (unscaled)
  double grad_norm_clipped = 0;   // after clipping (= grad_norm when not clipped)
  bool skipped = false;           // update skipped (non-finite gradient or loss)
  int64_t skipped_total = 0;      // skipped steps so far in the run
  double loss_scale = 0;          // GradScaler scale used by this step (0 = no scaler)
  int64_t targets = 0;            // tokens (LM) or samples (classifier) in the step
  double throughput = 0;          // targets per second
  double step_seconds = 0;        // wall time of the whole step
  double data_seconds = 0;        // waiting for batches
  double forward_seconds = 0;
  double backward_seconds = 0;
  double optimizer_seconds = 0;   // unscale + clip + optimizer step + zero_grad
  double comm_seconds = 0;        // waiting for gradient reduction (distributed only)
  double flops = 0;               // model FLOPs of the step (forward + backward), 0 = unknown
  double mfu = -1;                // flops / step_seconds / the hardware's theoretical peak; -1 = unknown
  double gemm_efficiency = -1;    // flops / step_seconds / a GEMM probe's measured rate; -1 = unknown
  std::vector<TagMemory> memory;  // by allocator tag
  std::vector<std::string> nonfinite_params;  // parameters whose gradient was non-finite
  bool loss_nonfinite = false;
  std::vector<LayerNorms> layers; // on layer-statistics steps (observe.layer_stats, observe.layer_norms)
  std::vector<ActivationStats> activations;  // same steps
  InputStats input;
  double elapsed_seconds = -1;    // since fit() started; -1 = unknown
  PhaseTotals totals;
  std::vector<double> rank_compute_seconds;  // data parallel, logged steps: summed per rank (index = rank)
  std::vector<Histogram> histograms;         // TensorBoard only (observe.histograms_every); not in metrics.jsonl
  std::vector<CommStats> comm;    // by mesh dimension (distributed runs)
  PipelineStepStats pipeline;     // pipeline-parallel runs only
};

struct EvalMetrics {
  int64_t step = 0;
  double loss = 0;
  double accuracy = -1;  // classifiers only (-1 otherwise)
  int64_t count = 0;     // targets evaluated
};

// Something a person should know about the run, with what to do about it.
struct HealthEvent {
  int64_t step = 0;
  std::string kind;      // "loss_spike", "grad_spike", "loss_rise", "exploding_gradients",
                         // "vanishing_gradients", "dead_relus", "bad_sample", "inputs_not_normalized",
                         // "nonfinite", "nan_origin", "skipped_step", "scale_collapse", "rollback";
                         // the doctor's run-level findings add "lr_too_high", "lr_too_low",
                         // "early_loss_spike", "loss_at_chance", "overfitting", "data_starved",
                         // "straggler", "batch_lr_not_scaled" (observe/doctor.h)
  std::string severity;  // "info", "warning", "error"
  std::string message;   // a plain-language diagnosis
  std::vector<std::string> suggestions;  // concrete things to try, drawn from standard practice
  std::map<std::string, std::string> details;  // op, module, shapes, stats, sample ids, file saved …
  // The config change that fixes it, as key -> value fitted to the run's config
  // ("optimizer.lr" -> "0.002"); empty when the remedy is not a config key.
  std::map<std::string, std::string> fix;
};

// Where records go. The Trainer calls these on rank 0; every method may be left as is.
// The JSON encodings of the records, one line each (no trailing newline), fields as
// documented at the top of this file; non-finite numbers become null (src/observe/metrics.cpp).
std::string to_json(const StepMetrics& m);
std::string to_json(const EvalMetrics& e);
std::string to_json(const HealthEvent& e);

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  virtual void on_step(const StepMetrics&) {}
  virtual void on_eval(const EvalMetrics&) {}
  virtual void on_health(const HealthEvent&) {}
  virtual void on_end() {}
};

}  // namespace athanor::observe
