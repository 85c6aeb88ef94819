#pragma once
// `athanor doctor RUN_DIR [--baseline RUN_DIR] [--json]`: reads a run directory after the
// fact (finished, stopped or crashed) and says what went wrong and what to change.
//
// Reads config.yaml, metrics.jsonl (required; a truncated last line, as a crash leaves it,
// is tolerated), health.jsonl and run.json. Runs written before run.json existed get the
// step-level health checks recomputed from their logged steps. Then it looks at the run as
// a whole and names causes (DoctorReport::findings, most likely first):
//
//   bad_sample              a sample's input holds NaN/Inf or an outlier: its ids and step
//   scale_collapse          f16 overflows over and over: trainer.precision: bf16
//   inputs_not_normalized   floating inputs far from mean 0 / std 1: the statistics
//   dead_relus              ReLU layers whose units are 0 for the whole batch: the fractions
//   vanishing_gradients     weights whose gradients are 1/100 of the others': the layers
//   exploding_gradients     the gradient norm explodes without clipping: the layer, grad_clip
//   lr_too_high             non-finite values or a loss that rises and stays up: the first op
//                           and module (when recorded), and an lr of a tenth of the onset's
//   early_loss_spike        the loss climbs back early and recovers: a warm-up
//   loss_at_chance          the loss stays at the labels' entropy while the weights move:
//                           the model cannot learn from these inputs
//   lr_too_low              the loss barely moves and updates are < 1e-4 of the weights
//                           (~1e-3 is healthy): per-layer ratios and an lr
//   batch_lr_not_scaled     (with --baseline) a larger global batch at the same lr learns less
//                           per sample: optimizer.lr_scaling_base_batch
//   overfitting             validation loss rising while the training loss falls: the best step
//   data_starved            the step waits for data a large share of the time: workers, prefetch
//   straggler               one data-parallel rank computes much longer than the others
// plus any health event no cause explains (loss_spike, grad_spike, …). A finding's `fix`
// is the config change that fits this run's config (nothing already set is suggested).
#include <string>
#include <vector>

#include "athanor/observe/metrics.h"

namespace athanor::observe {

struct DoctorOptions {
  // A run of the same model and data to compare with (batch_lr_not_scaled); "" = none.
  std::string baseline_dir;
};

struct DoctorReport {
  std::string text;                  // what `athanor doctor` prints
  std::vector<HealthEvent> findings; // the diagnosis, most likely cause first; empty = healthy
  std::vector<HealthEvent> problems; // the health events behind it (recorded and recomputed), by step
  int errors = 0;                    // findings of severity "error"
  bool finished = false;             // last step reached trainer.max_steps
  bool healthy() const { return findings.empty(); }
  std::string json() const;          // `athanor doctor --json`: status, findings, problems
};

// Raises athanor::Error when the directory or its metrics.jsonl is missing or
// unreadable, or a line other than the last is not JSON.
DoctorReport diagnose(const std::string& run_dir, const DoctorOptions& options = {});
inline std::string diagnose_run(const std::string& run_dir) { return diagnose(run_dir).text; }

}  // namespace athanor::observe
