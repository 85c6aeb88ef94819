#include "athanor/optim/lr_schedule.h"

#include <cmath>

#include "athanor/core/error.h"
#include "athanor/optim/optimizer.h"

namespace athanor::optim {

LRSchedule::LRSchedule(ScheduleConfig c) : c_(std::move(c)) {
  const char* op = "lr_schedule";
  ATH_CHECK(c_.warmup_steps >= 0, op, "warmup_steps must be >= 0, got ", c_.warmup_steps);
  ATH_CHECK(c_.warmup_start_factor >= 0 && c_.warmup_start_factor <= 1, op, "warmup_start_factor must be in [0, 1], got ",
            c_.warmup_start_factor);
  ATH_CHECK(c_.min_lr_ratio >= 0 && c_.min_lr_ratio <= 1, op, "min_lr_ratio must be in [0, 1], got ", c_.min_lr_ratio);
  const std::string& d = c_.decay;
  ATH_CHECK(d == "constant" || d == "step" || d == "linear" || d == "polynomial" || d == "cosine" || d == "cosine_restarts",
            op, "unknown decay '", d, "'", Hint{"use one of constant, step, linear, polynomial, cosine, cosine_restarts"});
  if (d == "linear" || d == "polynomial" || d == "cosine")
    ATH_CHECK(c_.total_steps > c_.warmup_steps, op, "decay '", d, "' needs total_steps (", c_.total_steps,
              ") > warmup_steps (", c_.warmup_steps, ")", Hint{"set the schedule's total_steps to the number of optimizer steps"});
  if (d == "step") ATH_CHECK(c_.step_size > 0, op, "step decay needs step_size > 0, got ", c_.step_size);
  if (d == "cosine_restarts") ATH_CHECK(c_.t0 > 0 && c_.t_mult >= 1, op, "cosine_restarts needs t0 > 0 and t_mult >= 1");
}

double LRSchedule::factor(int64_t step) const {
  if (step < c_.warmup_steps)  // linear warmup from start_factor to 1
    return c_.warmup_start_factor + (1.0 - c_.warmup_start_factor) * static_cast<double>(step) / c_.warmup_steps;
  const double s = static_cast<double>(step - c_.warmup_steps);
  const double floor = c_.min_lr_ratio;
  const double span = static_cast<double>(c_.total_steps - c_.warmup_steps);
  const std::string& d = c_.decay;
  if (d == "constant") return 1.0;
  if (d == "step") return std::pow(c_.gamma, std::floor(s / c_.step_size));
  if (d == "linear") return s >= span ? floor : floor + (1.0 - floor) * (1.0 - s / span);
  if (d == "polynomial") return s >= span ? floor : floor + (1.0 - floor) * std::pow(1.0 - s / span, c_.power);
  if (d == "cosine") return s >= span ? floor : floor + (1.0 - floor) * 0.5 * (1.0 + std::cos(M_PI * s / span));
  // cosine_restarts (SGDR, Loshchilov & Hutter): periods t0, t0*t_mult, t0*t_mult^2, …
  double period = static_cast<double>(c_.t0), start = 0;
  while (s >= start + period) {
    start += period;
    period *= c_.t_mult;
  }
  return floor + (1.0 - floor) * 0.5 * (1.0 + std::cos(M_PI * (s - start) / period));
}

Scheduler::Scheduler(Optimizer& opt, LRSchedule schedule) : opt_(opt), schedule_(std::move(schedule)) { set_step(0); }

void Scheduler::set_step(int64_t step) {
  step_ = step;
  const double f = schedule_.factor(step_);
  for (auto& g : opt_.param_groups()) g.lr = g.base_lr * f;
}

void Scheduler::step() { set_step(step_ + 1); }

double Scheduler::lr() const { return opt_.param_groups().empty() ? 0.0 : opt_.param_groups()[0].lr; }

double linear_scaled_lr(double base_lr, int64_t global_batch, int64_t base_batch) {
  ATH_CHECK(base_batch > 0 && global_batch > 0, "linear_scaled_lr", "batch sizes must be positive (global ", global_batch,
            ", base ", base_batch, ")");
  return base_lr * static_cast<double>(global_batch) / static_cast<double>(base_batch);
}

}  // namespace athanor::optim
