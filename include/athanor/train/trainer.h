#pragma once
// The Trainer owns the order of a training step (DESIGN.md, "The training step"):
//
//   for each micro-batch k of accum_steps:
//       { autocast(bf16|f16) unless f32: loss_k = model(batch_k) }      (forward only)
//       (scaler.scale(loss_k * n_k / N)).backward()   (n_k counted targets; N over all k: token-weighted;
//                                                      the scaler is the identity except in f16)
//   found_inf = scaler.unscale(named params) or loss non-finite          (before clipping)
//   grad_norm = clip(grads)                      (pre-clip norm; computed even without clipping)
//   if !found_inf and grad_norm finite: optimizer.step()
//   else: the non-finite policy (f16 overflow: skip; otherwise diagnose under anomaly mode,
//         then stop | skip | rollback — trainer_health.cpp)
//   scaler.update(found_inf); scheduler.step(); zero_grad()   (the schedule counts step attempts)
//
// so no user can get the order wrong. Parameters, gradients and optimizer state stay f32.
//
// On one GPU (trainer.device cuda, no dp/tp/pp, adamw/adam/sgd) the decision above is made on
// the device and consumed there by the optimizer's kernels (trainer_step.cpp: guarded_update),
// so a step that is not logged makes no host synchronisation: its loss and grad norm stay on
// the device (NaN in its StepMetrics, which callbacks still receive; sinks and the health
// checks skip it), and the skipped-step count and the non-finite policy lag to the next
// logged step. health.nonfinite_policy=rollback keeps the per-step read.
// It builds the model (or takes a Task), data, optimizer and schedule from a Config,
// evaluates periodically, samples text from GPTs, and writes <out_dir>/<name>/config.yaml
// (resolved), metrics.jsonl and health.jsonl (observe/metrics.h), TensorBoard events,
// report.html and, with profile.enabled, trace.json.
//
// Data parallel (dist.*, parallel_context.h): under mpirun/srun every rank runs a Trainer; the
// model is wrapped in dist::DataParallel (zero_stage 0 = DDP, 1/2/3 = ZeRO; at 3 the sharding
// units are GPT's blocks transformer.h.<i>, MLP's Linear layers or a Task's FullyShardedBlocks;
// names and checkpoints stay those of 1 process; convnet is refused). Micro-batch k of a step is the same set of samples for
// any world size (DistributedSampler over the 1-process order; global batch = batch_size ×
// accum_steps × world). The step above becomes: backward under no_sync() for all but the last
// micro-batch, finish_backward() (its wait is comm_seconds), unscale, found_inf agreed by all
// ranks, clip over the global norm, step, zero_grad; the loss weights use the global target
// count, so 2 ranks × b train as 1 process × 2b. Losses/metrics are reduced across ranks; every
// rank evaluates its slice of the validation batches and the sums are reduced. Only rank 0
// prints and writes run files; checkpoints are collectives (optimizer state gathered under its
// 1-process names, rank 0 writes, a barrier follows) and state.json records world size, zero
// stage and the loader position in global samples, so a checkpoint resumes on any world size
// and stage. Dropout draws the same stream on every rank (the RNG state is rank 0's).
//
// Tensor parallelism (dist.tp > 1, GPT only; dist.sequence_parallel): the ranks form a
// DeviceMesh dp × tp (tp fastest); the model is a dist::TensorParallelGPT over the tp group
// and DataParallel runs over the dp group, so "world" above reads "dp": the data, the
// global batch (batch_size × accum_steps × dp) and the loss and metric sums are per dp rank,
// and the tp ranks of a dp group see the same micro-batches. The gradient norm counts each
// shard once and replicated parameters once; found_inf is agreed by every rank. Checkpoints
// keep logical names and shapes: each rank writes its shard, the index maps shards to slices
// (ckpt/sharded_checkpoint.h), and any (dp, tp, ZeRO) layout resumes any other; the final
// model.safetensors is the logical (merged) model. Every rank samples and saves the weights
// (collectives). The communication ledger's per-step totals by mesh dimension go into each
// step record ("comm").
//
// Pipeline parallelism (dist.pp > 1, GPT only): the mesh is dp x tp x pp; each rank holds its
// stage's chunks of a dist::PipelineGPT, and the step's micro-batch loop becomes the schedule
// dist.pp_schedule (gpipe, 1f1b, interleaved with dist.virtual_stages, zb-h1) run by
// dist::PipelineExecutor; the loss lives on the last stage and is handed to every rank; the
// tied embedding's gradient is summed between the first and last stage after the dp
// reduction; the grad norm and found_inf are agreed over every tp and pp rank; DDP or ZeRO-1
// on dp (ZeRO-2/3 are refused with a reason). Each step records the measured bubble next to
// the schedule's theory ("pipeline"), and a profiled step's per-rank action timeline goes to
// pipeline_timeline.json, which the report draws. Evaluation and samples run the stages as a
// chain; model.safetensors and checkpoints hold the logical model.
//
// On a GPU (trainer.device cuda | cuda:N; refused before any work where something does not run
// there, train/trainer_device.h): the model is moved (nn::Module::to) before the optimizer is
// made, so its state is created on the device; each step's batches are uploaded by the batch
// feed (train/batch_feed.h), the next step's while this step's update runs; the micro-batch
// losses stay on the device and are read back together after the gradient norm, the step's one
// host sync (the update is guarded by the norm's finiteness); per-layer statistics download
// what they read on the logged steps only; memory tags and peaks are the device allocator's,
// and trainer.empty_cache_every gives its cache back. Checkpoints stream device tensors
// through 16 MiB host pieces (ckpt/safetensors.h). The cpu runs take the same path, with
// nothing to move.
//
// The Trainer in parts, each a concept of its own: the parallel context (parallel_context.h:
// the mesh, groups, logical <-> local tensors), the step pipeline (step_pipeline.h: the
// micro-batch loop or a pipeline schedule), the checkpointer (checkpointer.h) and the run
// files (run_files.h). train_step() (trainer_step.cpp) reads as the step above.
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/data/dataloader.h"
#include "athanor/data/tokenizer.h"
#include "athanor/dist/shard_spec.h"
#include "athanor/nn/gpt.h"
#include "athanor/nn/llama.h"
#include "athanor/nn/module.h"
#include "athanor/optim/lr_schedule.h"
#include "athanor/optim/optimizer.h"
#include "athanor/amp/grad_scaler.h"
#include "athanor/core/rng.h"
#include "athanor/observe/health.h"
#include "athanor/observe/metrics.h"
#include "athanor/train/config.h"
#include "athanor/train/checkpointer.h"
#include "athanor/train/parallel_context.h"
#include "athanor/train/run_files.h"
#include "athanor/train/step_pipeline.h"

namespace athanor::dist {
class DataParallel;
class DeviceMesh;
class ProcessGroup;
}  // namespace athanor::dist

namespace athanor::train {

class StepObserver;  // train/step_observer.h: per-layer, activation and input statistics
class BatchFeed;     // train/batch_feed.h: the step's batches on the trainer's device

// The records of a run (include/athanor/observe/metrics.h); the old train:: names stay valid.
using StepMetrics = observe::StepMetrics;
using EvalMetrics = observe::EvalMetrics;

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
  // Model FLOPs (forward + backward) of training on this micro-batch; 0 = unknown (no MFU).
  virtual double train_flops(const data::Batch&) const { return 0; }
  // Language models: tokens sampled after `prompt` (every rank of a tensor-parallel group calls it).
  virtual std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t tokens, double temperature, int64_t top_k,
                                        Generator& gen);
};

class Trainer {
 public:
  // write_run_files = false: build everything but write nothing (eval/generate of an existing run).
  explicit Trainer(Config config, bool write_run_files = true);
  // Trains a caller's model/loss with the config's data, optimizer, schedule and policies
  // (the config's model.* keys are ignored for building; data.* still builds the loaders).
  Trainer(Config config, std::unique_ptr<Task> task, bool write_run_files = true);
  ~Trainer();
  // Trains to trainer.max_steps, or until trainer.time_limit_s, a periodic evaluation at or below
  // trainer.stop_at_val_loss, or a signal (SIGTERM/SIGINT), whichever comes first.
  void fit();
  bool train_step();                           // one optimizer step; false when finished
  // Reports (and records) the validation loss at this trainer's step, or at `weights_step`: the
  // step the weights were trained to when they were loaded rather than trained here
  // (`athanor eval` passes what load_weights returns).
  EvalMetrics evaluate(std::optional<int64_t> weights_step = std::nullopt);
  // GPT only: a decoded sample from the prompt. Under dist.zero_stage 3 every rank must call it
  // (the sharded weights are gathered for it: a collective); the others just return it too.
  std::string sample(int64_t tokens);
  std::string sample(int64_t tokens, const std::string& prompt);
  // The model's weights as safetensors (fit() writes <run_dir>/model.safetensors at the end).
  // Under data parallel every rank must call it (stage 3 gathers the weights); rank 0 writes.
  void save_weights(const std::string& path);
  // Strict: names and shapes must match the config's model. Under data parallel every rank calls it.
  // Returns the step the weights were trained to (the "step" save_weights records in the file's
  // metadata); nullopt for a file without one (e.g. from import-hf).
  std::optional<int64_t> load_weights(const std::string& path);
  void add_callback(std::shared_ptr<Callback> cb) { callbacks_.push_back(std::move(cb)); }
  // Every step/eval/health record and the end of the run also go to these (TensorBoard, report…).
  void add_sink(std::shared_ptr<observe::MetricsSink> sink) { sinks_.push_back(std::move(sink)); }

  // Checkpoints (include/athanor/ckpt/checkpoint.h): <run_dir>/checkpoints/step-NNNNNN/ with
  // model.safetensors, optimizer.safetensors (states under logical names; under data parallel
  // one shard of each per rank plus an index, ckpt/sharded_checkpoint.h), state.json (step,
  // loader position, RNG state, scheduler step, optimizer scalars, model-shape config and its
  // hash, version) and MANIFEST.json. fit() saves every checkpoint.every steps and at the end
  // (when checkpoint.every > 0), and on SIGTERM/SIGINT: the step in flight finishes, a
  // checkpoint is saved and fit() returns. Resuming restores all of it, so N steps straight and
  // N/2 + resume + N/2 give bitwise-identical weights and losses.
  std::string save_checkpoint();               // returns the checkpoint directory
  // Restores a checkpoint directory (verified first). A config whose model shape differs from
  // the checkpoint's is refused, naming the differing keys; other keys (max_steps, lr...) may change.
  void resume_from(const std::string& checkpoint_dir);
  // verify_checkpoint (ckpt/checkpoint.h); under data parallel the ranks split the hashing
  // and agree (a collective).
  void verify_checkpoint(const std::string& checkpoint_dir) const;
  // Resumes from the newest valid checkpoint of the run directory; false when there is none.
  // Damaged newer checkpoints are reported through the output and skipped.
  bool resume_latest();
  std::string checkpoints_dir() const;
  // What a signal handler calls: stop after the current step (fit() saves a checkpoint and returns).
  static void request_stop();
  bool stopped_by_signal() const { return stopped_by_signal_; }
  // Why fit() ended: "max_steps", "time_limit_s", "stop_at_val_loss" or "signal" ("" before it
  // ends); also in the log and in run.json's "end" (with the step and, in words, the detail).
  const std::string& end_reason() const { return end_reason_; }

  Task& task() { return *task_; }
  // This rank's optimizer (under dist.zero_stage >= 1: over the parameters this rank owns).
  optim::Optimizer& optimizer() { return *optim_; }
  optim::Scheduler& scheduler() { return *scheduler_; }
  data::DataLoader& train_loader() { return *train_loader_; }
  const Config& config() const { return config_; }
  int64_t step() const { return step_; }
  int64_t max_steps() const { return max_steps_; }
  int64_t skipped_steps() const { return skipped_; }
  const std::string& run_dir() const { return run_dir_; }
  // The most recent kHistorySteps steps (memory stays bounded on long runs; every step is in
  // metrics.jsonl).
  static constexpr std::size_t kHistorySteps = 10000;
  const std::deque<StepMetrics>& history() const { return history_; }
  const std::vector<EvalMetrics>& evals() const { return evals_; }
  const std::vector<observe::HealthEvent>& health_events() const { return health_; }
  DType precision() const { return precision_; }       // f32, bf16 or f16 (compute dtype of the forward)
  // trainer.device: where the model, its gradients, the optimizer state and the batches live.
  Device device() const { return device_; }
  const GradScaler& scaler() const { return *scaler_; }  // enabled only for f16
  double lr_factor() const { return lr_factor_; }        // cumulative rollback lr multiplier
  double peak_flops() const { return peak_flops_; }      // FLOP/s used for MFU: the hardware's peak (0 = unknown)
  double gemm_flops() const { return gemm_flops_; }      // a GEMM probe's FLOP/s, for GEMM efficiency
  // Parallel layout (parallel_context.h; dist.backend mpi, or auto under mpirun/srun with > 1 process):
  // every rank runs a Trainer; the global batch is batch_size × accum_steps × dp.
  int rank() const;
  int world_size() const;
  int tp_size() const;  // dist.tp (1 without tensor parallelism)
  int pp_size() const;  // dist.pp (1 without pipeline parallelism)
  int dp_size() const;  // world / (tp x pp)
  bool distributed() const { return dp_ != nullptr; }
  const ParallelContext& parallel() const { return *par_; }
  int64_t global_batch() const;
  // Optional: where progress and messages go (default: stdout; ranks other than 0: nowhere).
  void set_output(std::function<void(const std::string&)> out) { out_ = std::move(out); }

 private:
  void init(bool write_run_files);  // everything after the task exists
  void build_data();
  void log_step(const StepMetrics& m);
  void write_jsonl(const std::string& json_line);
  void measure_peak_flops();
  void memory_report(const StepMetrics& m);
  void profile_window(int64_t step, bool at_start);  // profile.*: start/stop the profiler, print the table, write trace.json
  // The non-finite policy (trainer_health.cpp), after the update was skipped: diagnose, then
  // skip (false), roll back (true: the state is a checkpoint's now) or stop (throws).
  std::string nonfinite_policy() const;  // auto resolved to skip/stop
  bool handle_nonfinite(const std::vector<data::Batch>& batches, const GeneratorState& rng_at_start, StepMetrics& m);
  observe::HealthEvent diagnose_nonfinite(const std::vector<data::Batch>& batches, const GeneratorState& rng_at_start,
                                          const StepMetrics& m);
  void emit_health(const observe::HealthEvent& e);  // health.jsonl + a line to the output + sinks
  void apply_lr_factor();                          // base lr = initial base lr × lr_factor_
  void setup_data_parallel(int64_t global_batch);  // wraps the model; owns the optimizer (trainer.cpp)
  std::vector<std::string> zero3_shard_modules();  // dist.zero_stage 3: the model's sharding units
  bool any_rank(bool v) const;  // over every rank (identity in one process)
  void barrier() const;
  bool collective_model() const;  // sampling and saving the weights are collectives (ZeRO-3, tp, pp)
  void write_pipeline_timeline(int64_t step);  // pipeline_timeline.json from every rank's clocks (a collective)
  // memory_ranks.json: every rank's peak bytes, in total and per tag, over the run's steps (a collective).
  void write_rank_memory(const MemoryStats& step_stats, bool last);
  Config config_;
  std::unique_ptr<ParallelContext> par_;       // first: every other part depends on the layout
  std::unique_ptr<Task> task_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::shared_ptr<data::Dataset> train_set_, val_set_;
  std::unique_ptr<data::DataLoader> train_loader_;
  std::unique_ptr<BatchFeed> feed_;             // train_loader_'s batches on device_ (after it)
  Device device_;                                // trainer.device
  int64_t empty_cache_every_ = 0;                // trainer.empty_cache_every
  std::unique_ptr<dist::DataParallel> dp_;      // before scheduler_: destroyed after it
  std::unique_ptr<optim::Optimizer> optimizer_; // the optimizer without data parallel
  optim::Optimizer* optim_ = nullptr;           // optimizer_ or dp_'s
  int zero_stage_ = 0;
  std::unique_ptr<StepPipeline> step_pipeline_;  // the micro-batch loop or a pipeline schedule
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<RunFiles> files_;
  std::unique_ptr<optim::Scheduler> scheduler_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::vector<std::shared_ptr<observe::MetricsSink>> sinks_;
  std::vector<observe::HealthEvent> health_;
  std::unique_ptr<GradScaler> scaler_;
  std::unique_ptr<observe::HealthMonitor> health_monitor_;  // spikes, exploding/vanishing gradients
  // ---- what the doctor and the report read beyond the step's own metrics (trainer_observe.cpp)
  void write_run_info();                                    // run.json
  void observe_inputs(const std::vector<data::Batch>& batches, StepMetrics& m);  // input stats + their health check
  void debug_rank_delay(StepMetrics& m) const;              // debug.slow_rank (TEST ONLY)
  void finish_step_records(StepMetrics& m, bool periodic);  // totals, elapsed time, per-rank compute
  std::unique_ptr<StepObserver> step_observer_;
  std::vector<observe::ActivationStats>* activations_out_ = nullptr;  // set on layer-statistics steps
  bool observe_window_ = false;  // this step's forward is observed (statistics, or the dead-unit window)
  observe::PhaseTotals totals_;
  double compute_total_ = 0;                 // this rank's step time outside the gradient wait, summed
  double label_entropy_ = -1;                // of the training targets (before debug.* faults); -1 = n/a
  int64_t label_classes_ = 0;
  DType precision_ = DType::f32;
  std::vector<double> initial_base_lrs_;
  double lr_factor_ = 1.0;
  double peak_flops_ = 0;
  // Under bf16 autocast on a CPU without bf16 arithmetic: a warning with the measured bf16 / f32
  // GEMM ratio when bf16 is the slower one (printed at start-up); empty otherwise.
  std::string bf16_speed_note();
  double gemm_flops_ = 0;
  std::string peak_source_;  // how peak_flops_ was obtained, for the log
  bool memory_reported_ = false;
  MemoryStats run_peak_;  // per-tag and total peaks, the maximum over the run's steps
  // "12,40,7" (at most `limit` ids, then ",…"): the samples of a step, for health events.
  static std::string ids_text(const std::vector<int64_t>& ids, size_t limit = 64);
  int64_t rollbacks_in_a_row_ = 0;  // rollbacks that did not get past the failing step
  int64_t last_diagnosed_step_ = -1, last_nonfinite_step_ = -1;  // the replay runs once per run of consecutive non-finite steps
  int64_t last_rollback_step_ = -1;
  std::deque<StepMetrics> history_;
  std::vector<EvalMetrics> evals_;
  std::function<void(const std::string&)> out_;
  std::string run_dir_;
  int64_t step_ = 0, max_steps_ = 0, skipped_ = 0;
  int64_t last_checkpoint_step_ = -1;
  bool stopped_by_signal_ = false;
  std::string end_reason_, end_detail_;  // end_reason(); the detail in words, e.g. "val loss 1.8684 <= 1.99"
  bool health_started_ = false;   // health.jsonl truncated (fresh run) or cut back to the checkpoint (resume)
  double start_time_ = 0;
  bool tty_ = false;
  double last_redraw_ = 0;  // when a terminal's progress line was last drawn
  // The step guarded on the device (trainer_step.cpp, guarded_update): skip (f32 [1]) and
  // (clip coefficient, grad norm, skipped steps) (f64 [3]) written on the device each step;
  // the skipped count as last read; whether this step's metrics were left on the device.
  Tensor guard_skip_, guard_out_;
  int64_t guard_skipped_read_ = 0;
  bool step_deferred_ = false;
  bool guarded_update(const std::vector<data::Batch>& batches, const GeneratorState& rng_at_start, StepMetrics& m,
                      const optim::NamedTensors& named, const std::vector<Tensor>& params, bool read_back, bool stats);
  bool run_files_ = true;    // the run has files (checkpoints are collectives: every rank takes part)
  bool write_files_ = true;  // this process writes them (run_files_ and rank 0)
};

// Builds the model and task of a config (used by train, eval and generate). With a mesh whose
// pp size is > 1: this rank's stages of a dist::PipelineGPT (tp-split over mesh->tp()); else
// with a tp size > 1: the GPT as a dist::TensorParallelGPT over mesh->tp().
std::unique_ptr<Task> make_task(const Config& config, const dist::DeviceMesh* mesh = nullptr);
// The GPT shape a config's model.* keys describe (model.type must be gpt).
nn::GPTConfig gpt_config(const Config& config);
// The Llama shape a config's model.* keys describe (model.type must be llama); an
// inconsistent shape is an Error naming the config file and the keys.
nn::LlamaConfig llama_config(const Config& config);

}  // namespace athanor::train
