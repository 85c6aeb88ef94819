#pragma once
// Learning-rate schedules: a warmup followed by a decay, as a factor of each
// group's base_lr. Schedules count optimizer steps, never micro-batches.
#include <cstdint>
#include <string>

namespace athanor::optim {

class Optimizer;

struct ScheduleConfig {
  int64_t warmup_steps = 0;
  double warmup_start_factor = 0.0;  // linear warmup from start_factor*lr to lr
  std::string decay = "constant";    // constant | step | linear | polynomial | cosine | cosine_restarts
  int64_t total_steps = 0;           // end of decay (linear, polynomial, cosine); counted from step 0, warmup included
  double min_lr_ratio = 0.0;         // floor of linear/polynomial/cosine/cosine_restarts, as a fraction of base_lr
  int64_t step_size = 1;             // step decay: multiply by gamma every step_size steps (after warmup)
  double gamma = 0.1;
  double power = 1.0;                // polynomial
  int64_t t0 = 1;                    // cosine_restarts: first period (steps after warmup)
  double t_mult = 1.0;               // cosine_restarts: period growth
};

class LRSchedule {
 public:
  explicit LRSchedule(ScheduleConfig c);  // validates (Error naming the bad field)
  double factor(int64_t step) const;      // lr(step) = base_lr * factor(step)
  const ScheduleConfig& config() const { return c_; }
 private:
  ScheduleConfig c_;
};

// Applies a schedule to an optimizer: set_step(k) sets every group's lr for step k.
class Scheduler {
 public:
  Scheduler(Optimizer& opt, LRSchedule schedule);
  void step();  // after each optimizer step: advances and sets the next lr
  int64_t current_step() const { return step_; }
  void set_step(int64_t step);  // resume
  double lr() const;            // lr of the first group
 private:
  Optimizer& opt_;
  LRSchedule schedule_;
  int64_t step_ = 0;
};

// The linear scaling rule (Goyal et al.): lr = base_lr * global_batch / base_batch.
double linear_scaled_lr(double base_lr, int64_t global_batch, int64_t base_batch);

}  // namespace athanor::optim
