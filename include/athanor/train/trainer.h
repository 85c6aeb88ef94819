#pragma once
// The Trainer owns the order of a training step (DESIGN.md, "The training step"):
//
//   for each micro-batch k of accum_steps:
//       loss_k = model(batch_k) * n_k / N        (n_k counted targets; N over all k: token-weighted)
//       loss_k.backward()
//   grad_norm = clip(grads)                      (pre-clip norm; computed even without clipping)
//   if grad_norm is finite: optimizer.step()     (else the update is skipped and counted)
//   scheduler.step(); zero_grad()                (the schedule counts optimizer steps only)
//
// so no user can get the order wrong. It builds the model, data, optimizer and
// schedule from a Config, evaluates periodically, samples text from GPTs, and
// writes <out_dir>/<name>/config.yaml (resolved) and metrics.jsonl.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "athanor/data/dataloader.h"
#include "athanor/data/tokenizer.h"
#include "athanor/nn/module.h"
#include "athanor/optim/lr_schedule.h"
#include "athanor/optim/optimizer.h"
#include "athanor/train/config.h"

namespace athanor::train {

struct StepMetrics {
  int64_t step = 0;            // optimizer steps completed
  double loss = 0;             // token/sample-weighted mean over the step's micro-batches
  double lr = 0;               // lr used by this step
  double grad_norm = 0;        // global L2 norm before clipping
  bool skipped = false;        // update skipped (non-finite gradient)
  int64_t targets = 0;         // tokens (LM) or samples (classifier) in the step
  double step_seconds = 0, data_seconds = 0;
  double throughput = 0;       // targets per second
};

struct EvalMetrics {
  int64_t step = 0;
  double loss = 0;
  double accuracy = -1;        // classifiers only (-1 otherwise)
  int64_t count = 0;           // targets evaluated
};

class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_step(const StepMetrics&) {}
  virtual void on_eval(const EvalMetrics&) {}
  virtual void on_end() {}
};

// What the trainer trains: a model plus how to get a loss from a batch.
class Task {
 public:
  virtual ~Task() = default;
  virtual nn::Module& module() = 0;
  virtual Tensor loss(const data::Batch& batch) = 0;  // mean over the batch's counted targets
  // Adds the summed loss and (for classifiers) the number of correct predictions.
  virtual void evaluate(const data::Batch& batch, double& loss_sum, int64_t& correct) = 0;
  virtual bool is_classifier() const = 0;
  virtual bool is_language_model() const { return false; }
};

class Trainer {
 public:
  // write_run_files = false: build everything but write nothing (eval/generate of an existing run).
  explicit Trainer(Config config, bool write_run_files = true);
  ~Trainer();
  void fit();                                  // trains to trainer.max_steps (or the time limit)
  bool train_step();                           // one optimizer step; false when finished
  EvalMetrics evaluate();
  std::string sample(int64_t tokens);          // GPT only: a decoded sample from the prompt
  std::string sample(int64_t tokens, const std::string& prompt);
  // The model's weights as safetensors (fit() writes <run_dir>/model.safetensors at the end).
  void save_weights(const std::string& path);
  void load_weights(const std::string& path);  // strict: names and shapes must match the config's model
  void add_callback(std::shared_ptr<Callback> cb) { callbacks_.push_back(std::move(cb)); }

  // Checkpoints (include/athanor/ckpt/checkpoint.h): <run_dir>/checkpoints/step-NNNNNN/ with
  // model.safetensors, optimizer.safetensors (states under logical names), state.json (step,
  // loader position, RNG state, scheduler step, optimizer scalars, model-shape config and its
  // hash, version) and MANIFEST.json. fit() saves every checkpoint.every steps and at the end
  // (when checkpoint.every > 0), and on SIGTERM/SIGINT: the step in flight finishes, a
  // checkpoint is saved and fit() returns. Resuming restores all of it, so N steps straight and
  // N/2 + resume + N/2 give bitwise-identical weights and losses.
  std::string save_checkpoint();               // returns the checkpoint directory
  // Restores a checkpoint directory (verified first). A config whose model shape differs from
  // the checkpoint's is refused, naming the differing keys; other keys (max_steps, lr...) may change.
  void resume_from(const std::string& checkpoint_dir);
  // Resumes from the newest valid checkpoint of the run directory; false when there is none.
  // Damaged newer checkpoints are reported through the output and skipped.
  bool resume_latest();
  std::string checkpoints_dir() const;
  // What a signal handler calls: stop after the current step (fit() saves a checkpoint and returns).
  static void request_stop();
  bool stopped_by_signal() const { return stopped_by_signal_; }

  Task& task() { return *task_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  optim::Scheduler& scheduler() { return *scheduler_; }
  data::DataLoader& train_loader() { return *train_loader_; }
  const Config& config() const { return config_; }
  int64_t step() const { return step_; }
  int64_t max_steps() const { return max_steps_; }
  int64_t skipped_steps() const { return skipped_; }
  const std::string& run_dir() const { return run_dir_; }
  const std::vector<StepMetrics>& history() const { return history_; }
  const std::vector<EvalMetrics>& evals() const { return evals_; }
  // Optional: where progress and messages go (default: stdout).
  void set_output(std::function<void(const std::string&)> out) { out_ = std::move(out); }

 private:
  void build_data();
  void log_step(const StepMetrics& m);
  void write_jsonl(const std::string& json_line);
  Config config_;
  std::unique_ptr<Task> task_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::shared_ptr<data::Dataset> train_set_, val_set_;
  std::unique_ptr<data::DataLoader> train_loader_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::Scheduler> scheduler_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::vector<StepMetrics> history_;
  std::vector<EvalMetrics> evals_;
  std::function<void(const std::string&)> out_;
  std::string run_dir_;
  int64_t step_ = 0, max_steps_ = 0, skipped_ = 0;
  int64_t last_checkpoint_step_ = -1;
  bool stopped_by_signal_ = false;
  bool metrics_started_ = false;  // metrics.jsonl truncated (fresh run) or filtered (resume)
  double start_time_ = 0;
  bool tty_ = false;
  bool write_files_ = true;
};

// Builds the model and task of a config (used by train, eval and generate).
std::unique_ptr<Task> make_task(const Config& config);

}  // namespace athanor::train
