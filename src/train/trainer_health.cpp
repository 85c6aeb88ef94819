// What the trainer does when a step's loss or gradient is not finite
// (health.nonfinite_policy, health.diagnose_nonfinite) and how health events are
// reported (health.jsonl, the output, sinks).
//
// Diagnosis replays the failing step under anomaly mode: the default generator is
// put back to the step's start (same dropout masks), the same micro-batches run
// forward and backward, and the first op whose output is non-finite is reported
// with its module path, inputs and the batch's sample ids; its inputs are saved
// for offline replay. Afterwards the generator state is put back as after the
// original step, so a diagnosed run is as deterministic as an undiagnosed one.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <optional>
#include <sstream>

#include "athanor/autograd/anomaly.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/ckpt/safetensors.h"
#include "athanor/core/allocator.h"
#include "athanor/observe/report.h"
#include "athanor/ops.h"
#include "athanor/ops/autocast.h"
#include "athanor/train/trainer.h"

namespace athanor::train {
namespace fs = std::filesystem;

namespace {
std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}
}  // namespace

std::string Trainer::ids_text(const std::vector<int64_t>& ids, size_t limit) {
  std::string out;
  for (size_t i = 0; i < ids.size() && i < limit; ++i) {
    if (i) out += ",";
    out += std::to_string(ids[i]);
  }
  if (ids.size() > limit) out += ",…";
  return out;
}

std::string Trainer::nonfinite_policy() const {
  const std::string& p = config_.get_string("health.nonfinite_policy");
  if (p != "auto") return p;
  return scaler_->enabled() ? "skip" : "stop";
}

void Trainer::emit_health(const observe::HealthEvent& e) {
  health_.push_back(e);
  if (write_files_) {  // a fresh run starts the file anew; a resume has cut it back to the checkpoint
    std::ofstream(fs::path(run_dir_) / "health.jsonl", health_started_ ? std::ios::app : std::ios::trunc) << observe::to_json(e) << "\n";
    health_started_ = true;
  }
  std::ostringstream line;
  if (tty_) line << "\n";
  line << "health " << e.severity << " at step " << e.step << " [" << e.kind << "]: " << e.message << "\n";
  for (const auto& s : e.suggestions) line << "  hint: " << s << "\n";
  out_(line.str());
  for (auto& s : sinks_) s->on_health(e);
}

void Trainer::apply_lr_factor() {
  auto& groups = optim_->param_groups();
  for (size_t i = 0; i < groups.size() && i < initial_base_lrs_.size(); ++i) groups[i].base_lr = initial_base_lrs_[i] * lr_factor_;
  scheduler_->set_step(scheduler_->current_step());
}

observe::HealthEvent Trainer::diagnose_nonfinite(const std::vector<data::Batch>& batches, const GeneratorState& rng_at_start,
                                                 const StepMetrics& m) {
  const GeneratorState rng_after = default_generator().state();
  nn::Module& model = task_->module();
  // Keep the original step's gradients to put them back afterwards.
  std::vector<std::pair<Tensor, Tensor>> grads;
  for (auto& p : model.parameters()) grads.emplace_back(p, p.grad());
  default_generator().set_state(rng_at_start);
  optimizer_->zero_grad();
  clear_anomaly();
  int64_t failing_batch = -1;
  std::string error_text;
  for (size_t k = 0; k < batches.size() && failing_batch < 0; ++k) {
    const auto& b = batches[k];
    try {
      AnomalyModeGuard anomaly;
      MemTagScope tag(MemTag::activation);
      Tensor loss;
      {
        std::optional<autocast> ac;
        if (precision_ != DType::f32) ac.emplace(precision_);
        loss = task_->loss(b);
      }
      Tensor weighted = mul(loss, static_cast<double>(b.num_targets) / static_cast<double>(m.targets));
      if (scaler_->enabled()) weighted = mul(weighted, m.loss_scale);
      weighted.backward();
    } catch (const Error& e) {
      failing_batch = static_cast<int64_t>(k);
      error_text = e.what();
    }
  }
  const std::optional<AnomalyReport> a = last_anomaly();
  // Put the generator and gradients back as after the original step.
  optimizer_->zero_grad();
  for (auto& [p, g] : grads)
    if (g.defined()) p.set_grad(g);
  default_generator().set_state(rng_after);

  observe::HealthEvent e;
  e.step = m.step;
  e.severity = "error";
  std::vector<int64_t> ids;
  if (failing_batch >= 0) ids = batches[static_cast<size_t>(failing_batch)].sample_ids;
  else
    for (const auto& b : batches) ids.insert(ids.end(), b.sample_ids.begin(), b.sample_ids.end());
  e.details["sample_ids"] = ids_text(ids);
  e.details["loss"] = std::isfinite(m.loss) ? std::to_string(m.loss) : (std::isnan(m.loss) ? "nan" : "inf");
  if (!m.nonfinite_params.empty()) e.details["nonfinite_params"] = join(m.nonfinite_params, ",");
  if (!a) {
    e.kind = "nonfinite";
    e.message = "the loss or a gradient is not finite, but replaying the step under anomaly mode found no op producing it" +
                std::string(error_text.empty() ? "" : " (replay raised: " + error_text + ")") +
                "; the parameters or optimizer state may already hold non-finite values";
    e.suggestions = {"check the checkpoint's weights for NaN/Inf (athanor inspect)", "lower optimizer.lr or add optimizer.grad_clip"};
    return e;
  }
  e.kind = "nan_origin";
  const std::string where = a->module_path.empty() ? std::string("outside any module") : "in module '" + a->module_path + "'";
  e.message = "the first non-finite value of step " + std::to_string(m.step) + " came from op '" + a->op + "' " + where + " (" +
              a->phase + ", output " + std::to_string(a->output_index) + "; output " + a->output_stats + ")";
  e.details["op"] = a->op;
  e.details["module"] = a->module_path;
  e.details["phase"] = a->phase;
  e.details["input_shapes"] = join(a->input_shapes, "; ");
  e.details["input_stats"] = join(a->input_stats, "; ");
  e.details["output_stats"] = a->output_stats;
  e.details["micro_batch"] = std::to_string(failing_batch);
  // Non-finite inputs point at the data (first op) or an earlier op outside anomaly's
  // view; finite but huge inputs mean values grew over earlier steps until this op overflowed.
  bool inputs_nonfinite = false;
  double input_absmax = 0;
  for (const Tensor& in : a->inputs) {
    if (!in.defined() || !is_floating(in.dtype())) continue;
    if (!all_finite(in)) {
      inputs_nonfinite = true;
      continue;
    }
    input_absmax = std::max(input_absmax, max(abs(in.to(DType::f64))).item());
  }
  e.details["input_absmax"] = std::to_string(input_absmax);
  if (inputs_nonfinite && a->phase == "forward")
    e.suggestions.push_back("the op's inputs are already non-finite: check the data samples " + ids_text(ids) +
                            " (dataset indices) for NaN/Inf");
  else if (a->phase == "forward" && input_absmax > 1e6)
    e.suggestions.push_back("the op's inputs are finite but huge (|x| up to " + std::to_string(input_absmax) +
                            "): activations or weights grew over earlier steps until this op overflowed, the signature of "
                            "a learning rate that is too high (exploding training)");
  if (a->phase == "backward")
    e.suggestions.push_back("a gradient overflowed in backward: enable optimizer.grad_clip (e.g. 1.0) and lower optimizer.lr");
  e.suggestions.push_back("lower optimizer.lr or add schedule.warmup_steps; enable optimizer.grad_clip");
  if (precision_ == DType::f16) e.suggestions.push_back("prefer trainer.precision=bf16 over f16 when values overflow f16's range");
  e.suggestions.push_back("check the batch's samples (" + ids_text(ids, 16) + ") for bad values");
  if (write_files_) {
    // The op's inputs and the batch, for offline replay.
    std::ostringstream name;
    name << "nonfinite-step-" << std::setw(6) << std::setfill('0') << m.step << ".safetensors";
    const std::string path = (fs::path(run_dir_) / name.str()).string();
    ckpt::NamedTensors saved;
    for (size_t i = 0; i < a->inputs.size(); ++i)
      if (a->inputs[i].defined()) saved.emplace_back("input." + std::to_string(i), a->inputs[i].contiguous());
    if (a->output.defined()) saved.emplace_back("output", a->output.contiguous());
    if (failing_batch >= 0) {
      const auto& b = batches[static_cast<size_t>(failing_batch)];
      if (b.input.defined()) saved.emplace_back("batch.input", b.input.contiguous());
      if (b.target.defined()) saved.emplace_back("batch.target", b.target.contiguous());
    }
    try {
      ckpt::save_safetensors(path, saved, {{"op", a->op}, {"module", a->module_path}, {"phase", a->phase}, {"step", std::to_string(m.step)}});
      e.details["file"] = path;
    } catch (const Error& err) {
      e.details["file_error"] = err.what();
    }
  }
  return e;
}

bool Trainer::handle_nonfinite(const std::vector<data::Batch>& batches, const GeneratorState& rng_at_start, StepMetrics& m) {
  const std::string policy = nonfinite_policy();
  // f16's ordinary overflow: the scaler halves the scale and the step is skipped; nothing to diagnose.
  if (scaler_->enabled() && !m.loss_nonfinite) return false;

  std::optional<observe::HealthEvent> diagnosis;
  // The replay runs forward/backward outside the data-parallel step (its gradient hooks would
  // launch reductions): under data parallel the event names the parameters but not the op.
  // Once per streak of non-finite steps (a diverged run under `skip` would otherwise replay
  // and save inputs at every step); a finite step in between re-arms it.
  const bool streak = last_diagnosed_step_ >= 0 && last_nonfinite_step_ == m.step - 1;
  last_nonfinite_step_ = m.step;
  if (config_.get_bool("health.diagnose_nonfinite") && !dp_ && !streak) {
    diagnosis = diagnose_nonfinite(batches, rng_at_start, m);
    last_diagnosed_step_ = m.step;
    emit_health(*diagnosis);
  }
  auto stop = [&](const std::string& why) {
    std::string saved;
    if (run_files_) {
      saved = save_checkpoint();
      if (write_files_ && config_.get_bool("observe.report")) try {
          observe::write_report(run_dir_);
        } catch (const Error&) {  // the Error below is what matters
        }
    }
    const std::string what = diagnosis ? diagnosis->message : std::string("the loss or a gradient is not finite");
    std::string where;
    if (diagnosis && diagnosis->details.count("op"))
      where = " (op " + diagnosis->details.at("op") + ", module '" + diagnosis->details.at("module") + "', samples " +
              diagnosis->details.at("sample_ids") + ")";
    ATH_FAIL("trainer", "step ", m.step, ": ", what, where, why, saved.empty() ? "" : "; the state before the step is saved in " + saved,
             Hint{"see " + (write_files_ ? run_dir_ + "/health.jsonl" : std::string("the health events")) +
                  "; lower optimizer.lr, add warmup or optimizer.grad_clip, or set health.nonfinite_policy=skip|rollback"});
  };
  if (policy == "stop") stop("");
  if (policy == "rollback") {
    const double factor = config_.get_float("health.rollback_lr_factor");
    if (!run_files_) stop("; no checkpoint to roll back to (run files are off)");
    // A rollback that ends up at the same failure again and again (bad data) would loop forever.
    rollbacks_in_a_row_ = last_rollback_step_ == m.step ? rollbacks_in_a_row_ + 1 : 1;
    last_rollback_step_ = m.step;
    if (rollbacks_in_a_row_ > 3) stop("; rolling back did not get past this step 3 times");
    const double new_factor = lr_factor_ * factor;
    if (!resume_latest()) stop("; no valid checkpoint to roll back to (set checkpoint.every)");
    lr_factor_ = new_factor;
    apply_lr_factor();
    observe::HealthEvent e;
    e.step = m.step;
    e.kind = "rollback";
    e.severity = "warning";
    std::ostringstream msg;
    msg << "step " << m.step << " was not finite: rolled back to step " << step_ << " and lowered the lr by " << factor
        << " (cumulative factor " << lr_factor_ << ")";
    e.message = msg.str();
    e.details["to_step"] = std::to_string(step_);
    e.details["lr_factor"] = std::to_string(lr_factor_);
    e.suggestions = {"if rollbacks repeat, lower optimizer.lr in the config or add optimizer.grad_clip"};
    emit_health(e);
    return true;
  }
  // skip
  observe::HealthEvent e;
  e.step = m.step;
  e.kind = "skipped_step";
  e.severity = "warning";
  std::ostringstream msg;
  msg << "step " << m.step << ": the gradient norm is " << m.grad_norm << " (loss " << m.loss << "); the update was skipped ("
      << skipped_ << " skipped so far)";
  e.message = msg.str();
  e.details["skipped_total"] = std::to_string(skipped_);
  if (!m.nonfinite_params.empty()) e.details["nonfinite_params"] = join(m.nonfinite_params, ",");
  e.suggestions = {"lower optimizer.lr, add schedule.warmup_steps or optimizer.grad_clip"};
  emit_health(e);
  return false;
}

}  // namespace athanor::train
