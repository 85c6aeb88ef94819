#pragma once
// Tools that find settings by running real training steps on a config:
//
//   lr_find     a learning-rate range test (Smith 2017; Lightning's lr_find, fastai's lr_find):
//               from a fresh initialisation the lr grows exponentially from min_lr to
//               max_lr over `steps` steps (no warm-up, no decay); the loss, smoothed by an
//               exponential moving average, is recorded against the lr until it exceeds
//               `diverge_factor` x its lowest value. Two suggestions: the lr of the steepest
//               descent of the smoothed loss (against log lr), and a tenth of the lr where
//               the loss diverged; the suggested lr is the smaller of the two (both are
//               stable points of the curve; the smaller keeps a margin from divergence).
//   batch_find  the largest micro-batch whose training step fits a memory budget: real
//               steps at micro-batches 1, 2, 4, … then a bisection between the last that
//               fit and the first that did not, each measured by the allocator's peak; and
//               the gradient-accumulation steps that reach a target global batch.
//
// Both write their result as JSON into the run directory (<out_dir>/<name>/lr_find.json,
// batch_find.json), which report.html draws, and leave the run's other files alone.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "athanor/train/config.h"

namespace athanor::train {

struct LrFindOptions {
  int64_t steps = 100;
  double min_lr = 1e-7;
  double max_lr = 10.0;
  double smoothing = 0.98;       // EMA factor of the loss (Lightning's beta)
  double diverge_factor = 4.0;   // stop when the smoothed loss exceeds this x its lowest
};

struct LrFindResult {
  std::vector<double> lrs, losses, smoothed;  // per step run
  double steepest_lr = 0;   // steepest descent of the smoothed loss against log(lr)
  double diverged_lr = 0;   // where the smoothed loss passed diverge_factor x its lowest (0 = never)
  double suggested_lr = 0;
  double config_lr = 0;     // the config's optimizer.lr, for comparison
  std::string rule;         // which suggestion was taken, in words
  std::string json_path;    // where the result was written ("" when not written)
};

// Raises athanor::Error on bad options (steps < 5, min_lr >= max_lr, non-positive lrs).
LrFindResult lr_find(const Config& config, const LrFindOptions& options,
                     const std::function<void(const std::string&)>& out = nullptr);

struct BatchFindOptions {
  double memory_bytes = 0;        // budget; 0 = the machine's physical memory
  int64_t max_batch = 4096;       // never probe above this
  int64_t target_global_batch = 0;  // 0 = the config's batch_size x accum_steps x world
  int64_t steps_per_probe = 2;    // the first step allocates the optimizer state; the peak is over all
};

struct BatchProbe {
  int64_t batch = 0;
  double peak_bytes = 0;
  bool fits = false;
  double throughput = 0;  // samples per second of the last probed step
  std::string note;       // e.g. the error that ended the probe
};

struct BatchFindResult {
  std::vector<BatchProbe> probes;  // in the order run
  int64_t max_micro_batch = 0;     // 0 = not even 1 fits
  int64_t target_global_batch = 0;
  int64_t accum_steps = 0;         // ceil(target / (max_micro_batch x world))
  int world_size = 1;
  double memory_budget = 0;
  std::string json_path;
};

BatchFindResult batch_find(const Config& config, const BatchFindOptions& options,
                           const std::function<void(const std::string&)>& out = nullptr);

// "16GiB", "512MiB", "2.5GB", "1048576" -> bytes; raises athanor::Error naming the text.
double parse_bytes(const std::string& text);

}  // namespace athanor::train
