// What the trainer records for the doctor and the report beyond a step's own metrics
// (train/step_observer.h computes the statistics): run.json, the step's input statistics
// and their health check, the sums over every step (logged or not) that report.html's
// summary shows, each rank's compute time (a straggler shows as one rank's larger share),
// and the TEST ONLY per-rank delay of debug.slow_rank.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "athanor/train/trainer.h"
#include "train/step_observer.h"

namespace athanor::train {
namespace fs = std::filesystem;

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void Trainer::write_run_info() {
  if (!write_files_) return;
  nlohmann::ordered_json j;
  j["world_size"] = world_size();
  j["global_batch"] = global_batch();
  j["parameters"] = task_->module().parameters_count();
  j["precision"] = dtype_name(precision_);
  if (label_entropy_ >= 0) {
    j["label_entropy"] = label_entropy_;
    j["label_classes"] = label_classes_;
  }
  if (!end_reason_.empty()) j["end"] = {{"reason", end_reason_}, {"step", step_}, {"detail", end_detail_}};
  std::ofstream(fs::path(run_dir_) / "run.json") << j.dump(2) << "\n";
}

void Trainer::observe_inputs(const std::vector<data::Batch>& batches, StepMetrics& m) {
  if (!write_files_) return;  // its events go to health.jsonl (benchmarks write none and skip the pass)
  m.input = input_stats(batches);
  if (!m.input.present) return;
  for (auto& e : health_monitor_->check_inputs(m)) emit_health(e);
}

void Trainer::debug_rank_delay(StepMetrics& m) const {
  if (config_.get_int("debug.slow_rank") != rank()) return;
  const double t = now_seconds();
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(config_.get_float("debug.slow_rank_delay_ms")));
  m.forward_seconds += now_seconds() - t;  // it stands for slower compute on this rank
}

void Trainer::finish_step_records(StepMetrics& m, bool periodic) {
  if (start_time_ == 0) start_time_ = now_seconds();  // train_step() called without fit()
  // A fresh run under an old run's name: the old health events are not this run's. The file
  // is truncated by this run's first event, or here, after its first step, when it has none
  // (a resume has already cut it back to the checkpoint).
  if (write_files_ && !health_started_) {
    std::ofstream(fs::path(run_dir_) / "health.jsonl", std::ios::trunc);
    health_started_ = true;
  }
  totals_.steps += 1;
  totals_.step_s += m.step_seconds;
  totals_.data_s += m.data_seconds;
  totals_.forward_s += m.forward_seconds;
  totals_.backward_s += m.backward_seconds;
  totals_.optimizer_s += m.optimizer_seconds;
  totals_.comm_s += m.comm_seconds;
  m.totals = totals_;
  m.elapsed_seconds = now_seconds() - start_time_;
  compute_total_ += m.step_seconds - m.comm_seconds;
  // Every rank takes part (an all-gather) on the logged steps, which all ranks agree on.
  if (dp_ && periodic) m.rank_compute_seconds = gather_across_ranks(par_->world().get(), compute_total_);
}

}  // namespace athanor::train
