#pragma once
// Timing of full training steps (forward + backward + clip + optimizer) through
// the Trainer, as `athanor bench` and the PyTorch comparison measure them:
// W warm-up steps (caches, oneDNN primitives, allocator pools filled), then N
// timed steps. Besides time it records what issue 7 asks of a steady-state
// step: page faults (getrusage, whole process and the training thread) and
// calls that reached the system allocator (Allocator::cpu() counters), and the
// peak memory by allocator tag over the timed steps.
#include <cstdint>
#include <string>
#include <vector>

#include "athanor/core/allocator.h"
#include "athanor/train/trainer.h"

namespace athanor::train {

struct BenchOptions {
  int64_t warmup = 3;        // untimed steps first
  int64_t steps = 10;        // timed steps
  double peak_gflops = 0;    // MFU denominator; 0 = the hardware's peak for the precision (cpu::cpu_peak)
};

struct BenchResult {
  std::string name, model_type, precision;
  std::string device = "cpu";          // trainer.device: where it trained (memory below is that device's)
  std::string unit;                    // "tokens" (language models) or "samples"
  int64_t targets_per_step = 0;        // tokens or samples per optimizer step
  int64_t parameters = 0;
  int64_t warmup = 0;
  std::vector<double> step_seconds;    // one per timed step
  double min_ms = 0, median_ms = 0, max_ms = 0;
  double throughput = 0;               // targets per second at the median step time
  double throughput_mean = 0;          // targets over the summed time of the timed steps
  double flops_per_step = 0;           // model FLOPs, see training_flops_per_step
  double achieved_gflops = 0;          // flops_per_step / median step time
  double peak_gflops = 0;              // the hardware's theoretical peak (or the one given)
  std::string peak_source;             // how: cpu::CpuPeak::describe(), or "given"
  double gemm_gflops = 0;              // a GEMM probe's rate at the precision (measure_gemm_gflops)
  double mfu = 0;                      // achieved / peak
  double gemm_efficiency = 0;          // achieved / gemm_gflops
  double minor_faults_per_step = 0, major_faults_per_step = 0;   // whole process (loader threads too)
  double thread_minor_faults_per_step = 0;                        // the training thread only
  double system_allocs_per_step = 0, system_frees_per_step = 0;   // Allocator::cpu()
  MemoryStats memory;                  // peaks over the timed steps (reset after warm-up)
  double final_loss = 0;
  // Where a step's time goes, medians over the timed steps (the trainer's StepMetrics):
  // waiting for data, forward, backward, optimizer (norm, clip, update, zero_grad),
  // gradient communication, and "other": the rest of the step's wall time (the loss's
  // read-back, metrics, logging), step by step.
  double data_ms = 0, forward_ms = 0, backward_ms = 0, optimizer_ms = 0, comm_ms = 0, other_ms = 0;

  std::string json() const;   // one JSON object on one line
  std::string text() const;   // the human-readable report
};

// Runs opts.warmup + opts.steps optimizer steps of `trainer` (its max_steps must allow
// them) and measures the timed ones. Raises athanor::Error for steps < 1 or warmup < 0.
BenchResult run_bench(Trainer& trainer, const BenchOptions& opts);

// Model FLOPs of one training step (forward + backward = 3x forward, the usual MFU
// convention; no recomputation counted). GPT: 6 * N * tokens + 12 * n_layer * n_embd * T
// per token (attention scores and weighted sum, as in the PaLM paper's MFU), N = the
// parameters without the position embedding (the tied token embedding counts once:
// it is the lm_head's matmul). MLP: 6 * (weights + biases) * samples. Other models: 0.
double training_flops_per_step(Trainer& trainer);

// A short GEMM probe (768 x 3072 x 768 and 1024^3, best median of a few runs) at the
// precision's compute type: "f32" -> f32 GEMM, "bf16" -> bf16 GEMM with f32 accumulation,
// "f16" -> its f32 path. GFLOP/s of the faster shape. The denominator of GEMM efficiency
// (achieved model FLOP/s / this), which the trainer's log and `athanor bench` print beside
// MFU (achieved / the hardware's theoretical peak): MFU / GEMM efficiency = probe / peak.
double measure_gemm_gflops(const std::string& precision);

}  // namespace athanor::train
