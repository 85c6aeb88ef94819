#include "athanor/train/trainer.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <set>
#include <sstream>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/ckpt/safetensors.h"
#include "athanor/ckpt/sharded_checkpoint.h"
#include "athanor/core/rng.h"
#include "athanor/data/corpus.h"
#include "athanor/data/token_shard.h"
#include "athanor/dist/device_mesh.h"
#include "athanor/dist/pipeline_lm.h"
#include "athanor/dist/sync_batch_norm.h"
#include "athanor/dist/tensor_parallel_lm.h"
#include "athanor/dist/zero.h"
#include "athanor/nn/convnet.h"
#include "athanor/nn/gpt.h"
#include "athanor/nn/mlp.h"
#include "athanor/ops.h"
#include "athanor/observe/report.h"
#include "athanor/observe/tensorboard.h"
#include "athanor/ops/autocast.h"
#include "train/trainer_device.h"
#include "athanor/optim/clip.h"
#include <optional>
#include "athanor/data/debug_dataset.h"
#include "ckpt/checksum.h"
#include "ops/packed_weights.h"
#include "train/batch_feed.h"
#include "train/device_runtime.h"
#include "train/step_observer.h"

#include <nlohmann/json.hpp>

namespace athanor::train {
namespace fs = std::filesystem;

namespace {
std::atomic<bool> g_stop_requested{false};
extern "C" void athanor_stop_handler(int) { g_stop_requested.store(true); }

// Installs the SIGTERM/SIGINT handler for the duration of fit() and restores the previous ones.
class StopSignalScope {
 public:
  StopSignalScope() {
    struct sigaction sa {};
    sa.sa_handler = athanor_stop_handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_term_);
    sigaction(SIGINT, &sa, &old_int_);
  }
  ~StopSignalScope() {
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGINT, &old_int_, nullptr);
  }

 private:
  struct sigaction old_term_ {}, old_int_ {};
};

// A sampler that returns the same given order every epoch (a rank's share of the validation set).
class FixedOrderSampler final : public data::Sampler {
 public:
  explicit FixedOrderSampler(std::vector<int64_t> order) : order_(std::move(order)) {}
  std::vector<int64_t> indices(int64_t) const override { return order_; }

 private:
  std::vector<int64_t> order_;
};
std::shared_ptr<data::Sampler> fixed_order_sampler(std::vector<int64_t> order) {
  return std::make_shared<FixedOrderSampler>(std::move(order));
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double step_label_entropy(const data::Dataset& set, int64_t* classes) { return label_entropy(set, 4096, classes); }

// Over `params`: the model's, or (data parallel, ZeRO >= 1) the ones this rank owns.
std::unique_ptr<optim::Optimizer> make_optimizer(const Config& c, const optim::NamedTensors& params, int64_t global_batch) {
  double lr = c.get_float("optimizer.lr");
  if (c.get_int("optimizer.lr_scaling_base_batch") > 0)
    lr = optim::linear_scaled_lr(lr, global_batch, c.get_int("optimizer.lr_scaling_base_batch"));
  auto groups = optim::default_param_groups(params, lr, c.get_float("optimizer.weight_decay"),
                                            c.get_bool("optimizer.decay_embeddings"));
  const std::string& t = c.get_string("optimizer.type");
  const double eps = c.get_float("optimizer.eps"), mom = c.get_float("optimizer.momentum");
  if (t == "sgd") return optim::make_sgd(groups, {mom, c.get_float("optimizer.dampening"), c.get_bool("optimizer.nesterov")});
  if (t == "rmsprop") return optim::make_rmsprop(groups, {c.get_float("optimizer.alpha"), eps, mom, c.get_bool("optimizer.centered")});
  const optim::AdamOptions adam{c.get_float("optimizer.beta1"), c.get_float("optimizer.beta2"), eps};
  if (t == "adam") return optim::make_adam(groups, adam);
  if (t == "adamw") return optim::make_adamw(groups, adam);
  if (t == "lamb") return optim::make_lamb(groups, {adam.beta1, adam.beta2, eps});
  return optim::make_lars(groups, {mom, c.get_float("optimizer.trust_coefficient"), eps});
}
}  // namespace

namespace {
void check_batch(const Config& c) {
  ATH_CHECK(c.get_int("trainer.batch_size") > 0, "config", "trainer.batch_size must be > 0");
  ATH_CHECK(c.get_int("trainer.accum_steps") > 0, "config", "trainer.accum_steps must be > 0");
  const double target = c.get_float("trainer.stop_at_val_loss");
  ATH_CHECK(std::isfinite(target) && target >= 0, "config", "trainer.stop_at_val_loss must be a finite number >= 0, got ", target,
            Hint{"give the validation loss to stop at (e.g. 1.5), or 0 to train to trainer.max_steps"});
}
}  // namespace

Trainer::Trainer(Config config, bool write_run_files)
    : config_(std::move(config)), run_files_(write_run_files), write_files_(write_run_files) {
  out_ = [](const std::string& s) { std::cout << s << std::flush; };
  tty_ = isatty(STDOUT_FILENO);
  check_batch(config_);
  check_trainer_device(config_);  // no GPU, cuda:7, not yet on cuda: before any work
  par_ = std::make_unique<ParallelContext>(config_);  // first: the sampler and the run files depend on the rank
  build_data();  // first: the text pipeline fixes the vocabulary size
  task_ = make_task(config_, par_->mesh());
  init(write_run_files);
}

Trainer::Trainer(Config config, std::unique_ptr<Task> task, bool write_run_files)
    : config_(std::move(config)), task_(std::move(task)), run_files_(write_run_files), write_files_(write_run_files) {
  out_ = [](const std::string& s) { std::cout << s << std::flush; };
  tty_ = isatty(STDOUT_FILENO);
  check_batch(config_);
  check_trainer_device(config_);  // no GPU, cuda:7, not yet on cuda: before any work
  ParallelContext::check_config(config_);
  const int64_t tp = config_.get_int("dist.tp"), pp = config_.get_int("dist.pp");
  ATH_CHECK(tp == 1 && pp == 1, "trainer", "dist.tp ", tp, ", dist.pp ", pp,
            ": a caller's Task cannot be split across tensor- or pipeline-parallel ranks by the trainer",
            Hint{"build the model from dist:: tensor-parallel layers (or dist::PipelineGPT with dist::PipelineExecutor) and train "
                 "it with dist::DataParallel directly, or let the trainer build its GPT (model.type gpt, no Task), or set "
                 "dist.tp: 1 and dist.pp: 1"});
  ATH_CHECK(task_ != nullptr, "trainer", "the task is null", Hint{"pass std::make_unique<YourTask>(...)"});
  par_ = std::make_unique<ParallelContext>(config_);
  build_data();
  init(write_run_files);
}

void Trainer::init(bool /*write_run_files: in write_files_*/) {
  const Config& c = config_;
  const int64_t gb = global_batch();
  write_files_ = run_files_ && par_->rank() == 0;
  if (par_->rank() != 0) out_ = [](const std::string&) {};
  // trainer.device (checked before any work): the model moves before the optimizer is made,
  // so its state is created beside each parameter; on cpu nothing moves.
  device_ = parse_trainer_device(c.get_string("trainer.device"));
  device_ = par_->bind_device(device_, c);  // a launch's processes: their GPUs and the backend (dist.backend)
  task_->module().to(device_);
  const std::string prefetch = c.get_string("data.device_prefetch");
  feed_ = std::make_unique<BatchFeed>(*train_loader_, device_, prefetch == "on" || (prefetch == "auto" && !device_.is_cpu()));
  empty_cache_every_ = c.get_int("trainer.empty_cache_every");
  ATH_CHECK(empty_cache_every_ >= 0, "config", "trainer.empty_cache_every must be >= 0, got ", empty_cache_every_,
            Hint{"0 never empties the cache; N empties it every N steps"});
  par_->bind_model(task_->module());
  if (par_->distributed()) {
    zero_stage_ = par_->zero_stage();
    setup_data_parallel(gb);
  } else {
    optimizer_ = make_optimizer(config_, task_->module().named_parameters(), gb);
    optim_ = optimizer_.get();
  }
  max_steps_ = c.get_int("trainer.epochs") > 0
                   ? c.get_int("trainer.epochs") * train_loader_->batches_per_epoch() / c.get_int("trainer.accum_steps")
                   : c.get_int("trainer.max_steps");
  ATH_CHECK(max_steps_ > 0, "config", "nothing to train: max_steps is ", max_steps_,
            Hint{"raise trainer.max_steps/trainer.epochs, or lower trainer.batch_size × accum_steps below the dataset size"});
  optim::ScheduleConfig s;
  s.warmup_steps = c.get_int("schedule.warmup_steps");
  s.warmup_start_factor = c.get_float("schedule.warmup_start_factor");
  s.decay = c.get_string("schedule.decay");
  s.total_steps = max_steps_;
  s.min_lr_ratio = c.get_float("schedule.min_lr_ratio");
  s.step_size = c.get_int("schedule.step_size");
  s.gamma = c.get_float("schedule.gamma");
  s.power = c.get_float("schedule.power");
  s.t0 = c.get_int("schedule.t0");
  s.t_mult = c.get_float("schedule.t_mult");
  scheduler_ = std::make_unique<optim::Scheduler>(*optim_, optim::LRSchedule(s));
  for (const auto& g : optim_->param_groups()) initial_base_lrs_.push_back(g.base_lr);

  // Precision: f16 scales the loss dynamically; bf16 and f32 keep a disabled scaler, which
  // still reports non-finite gradients by parameter name.
  precision_ = dtype_from_name(c.get_string("trainer.precision"));
  // bf16/f16: the weights' low-precision copies come from the optimizer's update pass, so
  // autocast need not cast them every step. Not under ZeRO: its optimizer updates shards.
  if (precision_ != DType::f32 && c.get_bool("optimizer.low_precision_copies") && (!dp_ || zero_stage_ == 0))
    optim_->enable_low_precision_copies(precision_);
  detail::set_packed_weights_enabled(c.get_bool("optimizer.packed_weights"));
  GradScalerOptions so;
  so.enabled = precision_ == DType::f16;
  if (so.enabled) {
    so.init_scale = c.get_float("scaler.init_scale");
    so.growth_factor = c.get_float("scaler.growth_factor");
    so.backoff_factor = c.get_float("scaler.backoff_factor");
    so.growth_interval = c.get_int("scaler.growth_interval");
  }
  scaler_ = std::make_unique<GradScaler>(so);
  observe::HealthOptions ho;
  ho.spike_window = c.get_int("health.spike_window");
  ho.loss_spike_z = c.get_float("health.loss_spike_z");
  ho.grad_spike_z = c.get_float("health.grad_spike_z");
  ho.min_samples = ho.spike_window;  // a window is warm when full
  // The monitor reads the run's config to fit its advice (nothing already set is suggested).
  health_monitor_ = std::make_unique<observe::HealthMonitor>(ho, observe::RunSettings::from_yaml(c.resolved_yaml(), "the config"));
  // Per-layer statistics read every parameter's gradient: not where ZeRO shards them (stage 2/3).
  step_observer_ = std::make_unique<StepObserver>(c.get_int("trainer.log_every"),
                                                  c.get_bool("observe.layer_stats") && (!dp_ || zero_stage_ <= 1),
                                                  c.get_int("observe.histograms_every"), c.get_int("trainer.batch_size"));

  // The step's first part: the micro-batch loop, or the pipeline schedule.
  const StepParts parts{*task_, dp_.get(), *scaler_, precision_, par_->dp_size()};
  step_pipeline_ = par_->pp_size() > 1
                       ? make_pipeline_schedule(parts, *par_, dist::parse_schedule(c.get_string("dist.pp_schedule")),
                                                static_cast<int>(c.get_int("trainer.accum_steps")),
                                                static_cast<int>(c.get_int("dist.virtual_stages")))
                       : make_micro_batch_loop(parts);

  run_dir_ = (fs::path(c.get_string("out_dir")) / c.get_string("name")).string();
  files_ = std::make_unique<RunFiles>(run_dir_, write_files_);
  checkpointer_ = std::make_unique<Checkpointer>(
      (fs::path(run_dir_) / "checkpoints").string(),
      CheckpointParts{config_, *task_, dp_.get(), optimizer_.get(), *optim_, *scheduler_, *scaler_, *feed_, *par_});
  if (!run_files_) return;
  if (!write_files_) {  // ranks other than 0: only resume (every rank loads the checkpoint)
    if (c.get_string("resume") == "auto") resume_latest();
    return;
  }
  std::string resolved = config_.resolved_yaml();
  if (precision_ != DType::f16)
    resolved += "# scaler: off (dynamic loss scaling is used only with trainer.precision f16; this run uses " +
                c.get_string("trainer.precision") + ")\n";
  resolved += "# data parallel: " + (par_->distributed() ? "mpi, world size " + std::to_string(par_->world_size()) + ", zero_stage " + std::to_string(zero_stage_)
                                                         : std::string("off (1 process)")) +
              "; global batch " + std::to_string(gb) + " = batch_size " + std::to_string(c.get_int("trainer.batch_size")) +
              " x accum_steps " + std::to_string(c.get_int("trainer.accum_steps")) + " x dp " + std::to_string(par_->dp_size()) + "\n";
  if (par_->tp_size() > 1)
    resolved += "# tensor parallel: tp " + std::to_string(par_->tp_size()) + " x dp " + std::to_string(par_->dp_size()) +
                " (ranks tp-fastest), sequence parallel " + (c.get_bool("dist.sequence_parallel") ? "on" : "off") + "\n";
  if (par_->pp_size() > 1) {
    const auto* pm = dynamic_cast<const dist::PipelineLM*>(&task_->module());
    resolved += "# pipeline parallel: " + par_->describe() + ", schedule " + c.get_string("dist.pp_schedule") + ", " +
                std::to_string(c.get_int("trainer.accum_steps")) + " micro-batches, " + (pm ? pm->layout().describe() : "") + "\n";
  }
  if (dp_ && zero_stage_ == 3) {
    std::string units;
    for (const auto& u : dp_->shard_units()) units += (units.empty() ? "" : ", ") + u;
    resolved += "# zero_stage 3 sharded modules (parameters split across the ranks, gathered per forward/backward): " + units + "\n";
  }
  files_->create(resolved);
  write_run_info();
  if (c.get_bool("observe.tensorboard")) add_sink(std::make_shared<observe::TensorBoardSink>(run_dir_));
  if (c.get_string("resume") == "auto") resume_latest();
}

Trainer::~Trainer() = default;

namespace {
// The stage-3 sharding units of the models the trainer builds (empty: rely on FullyShardedBlocks).
std::vector<std::string> zero3_units(nn::Module& m) {
  if (auto* gpt = dynamic_cast<nn::GPT*>(&m)) return gpt->shard_units();
  if (auto* llama = dynamic_cast<nn::Llama*>(&m)) return llama->shard_units();
  if (auto* tpg = dynamic_cast<dist::TensorParallelLM*>(&m)) return tpg->shard_units();
  if (auto* mlp = dynamic_cast<nn::MLP*>(&m)) return mlp->shard_units();
  ATH_CHECK(dynamic_cast<nn::ConvNet*>(&m) == nullptr, "config",
            "dist.zero_stage 3 is not supported for model.type convnet: its layers are not called through "
            "nn::Module::run_forward, so they cannot be sharded (and its parameters are small)",
            Hint{"use dist.zero_stage 2 (gradients and optimizer state sharded) for the convnet; stage 3 supports "
                 "model.type gpt, llama and mlp"});
  for (auto& [path, sub] : m.named_modules())
    if (std::dynamic_pointer_cast<dist::FullyShardedBlock>(sub)) return {};
  ATH_FAIL("config", "dist.zero_stage 3: the task's model is not one the trainer builds (gpt, llama, mlp) and has no "
           "dist::FullyShardedBlock, so there is nothing to shard",
           Hint{"wrap the model's repeated blocks in dist::FullyShardedBlock (include/athanor/dist/zero.h), "
                "or use dist.zero_stage 2"});
}
}  // namespace

std::vector<std::string> Trainer::zero3_shard_modules() { return zero3_units(task_->module()); }

void Trainer::setup_data_parallel(int64_t gb) {
  if (config_.get_bool("dist.sync_batchnorm")) dist::convert_sync_batchnorm(task_->module(), par_->dp_group());
  // The model is owned by the task, which outlives dp_ (declared before it).
  std::shared_ptr<nn::Module> model(&task_->module(), [](nn::Module*) {});
  dist::DataParallelOptions o;
  o.zero_stage = zero_stage_;
  o.bucket_mb = config_.get_float("dist.bucket_mb");
  if (zero_stage_ == 3) o.shard_modules = zero3_shard_modules();
  if (const auto* specs = par_->tp_specs()) {  // norms over shards, sequence-parallel gradients summed over tp
    o.tp_group = par_->tp_group();
    o.tp_specs = *specs;
  }
  if (par_->pp_size() > 1) {  // the norm sums every stage's part, the last stage's tied copy not counted
    o.pp_group = par_->pp_group();
    o.norm_excluded = par_->duplicates();
  }
  dp_ = std::make_unique<dist::DataParallel>(
      model, par_->dp_group(), [this, gb](const optim::NamedTensors& owned) { return make_optimizer(config_, owned, gb); }, o);
  optim_ = &dp_->optimizer();
}

void Trainer::build_data() {
  Config& c = config_;
  const uint64_t seed = static_cast<uint64_t>(c.get_int("seed"));
  // The TEST ONLY faults (debug.*), checked before any data is loaded.
  data::DebugDataOptions dbg;
  dbg.shuffle_labels = c.get_bool("debug.shuffle_labels");
  dbg.seed = seed;
  dbg.sample_delay_ms = c.get_float("debug.sample_delay_ms");
  dbg.corrupt_ids = c.get_int_list("debug.corrupt_samples");
  {
    const std::string& v = c.get_string("debug.corrupt_value");
    char* end = nullptr;
    dbg.corrupt_value = std::strtod(v.c_str(), &end);
    ATH_CHECK(!v.empty() && end == v.c_str() + v.size(), "config", "debug.corrupt_value must be 'nan', 'inf' or a number, got '", v, "'",
              Hint{"e.g. debug.corrupt_value: nan, or 1e6"});
  }
  dbg.input_scale = c.get_float("debug.input_scale");
  ATH_CHECK(dbg.sample_delay_ms >= 0 && c.get_float("debug.slow_rank_delay_ms") >= 0, "config",
            "debug.sample_delay_ms and debug.slow_rank_delay_ms must be >= 0", Hint{"they are delays in milliseconds"});
  data::LoaderOptions lo;
  lo.batch_size = c.get_int("trainer.batch_size");
  lo.num_workers = static_cast<int>(c.get_int("data.num_workers"));
  lo.prefetch = static_cast<int>(c.get_int("data.prefetch"));
  lo.seed = seed;
  if (c.get_string("data.type") == "fashion_mnist") {
    const std::string dir = c.get_string("data.dir").empty() ? data::default_fashion_mnist_dir() : c.get_string("data.dir");
    train_set_ = data::fashion_mnist(dir, true, c.get_bool("data.normalize"));
    val_set_ = data::fashion_mnist(dir, false, c.get_bool("data.normalize"));
  } else {
    const std::string corpus = c.get_string("data.corpus"), tok = c.get_string("data.tokenizer");
    tokenizer_ = data::make_tokenizer(tok, c.get_string("data.tokenizer_dir"));
    if (c.get_int("model.vocab_size") == 0) c.set("model.vocab_size", tokenizer_->vocab_size());
    ATH_CHECK(c.get_int("model.vocab_size") >= tokenizer_->vocab_size(), "config", "model.vocab_size (",
              c.get_int("model.vocab_size"), ") is smaller than the tokenizer's vocabulary (", tokenizer_->vocab_size(), ")",
              Hint{"set model.vocab_size: 0 to take the tokenizer's"});
    ParallelContext::check_config(c);  // the vocabulary is known now (before the data is prepared)
    // Tokenized shards are cached per (corpus, tokenizer) and reused.
    const std::string stem = corpus == "brown" ? "brown" : fs::path(corpus).stem().string();
    const fs::path dir = fs::path(c.get_string("data.cache_dir")) / (stem + "-" + tok);
    // Under data parallel rank 0 prepares the shards while the others wait (one writer).
    const bool need = any_rank(!fs::exists(dir / "train.bin") || !fs::exists(dir / "val.bin"));
    if (need && par_->rank() == 0) {
      std::string text_path = corpus;
      if (corpus == "brown") {
        fs::create_directories(c.get_string("data.cache_dir"));
        text_path = (fs::path(c.get_string("data.cache_dir")) / "brown.txt").string();
        if (!fs::exists(text_path)) std::ofstream(text_path) << data::brown_corpus_text(c.get_string("data.corpus_dir"));
      }
      out_("preparing " + dir.string() + " from " + text_path + " (" + tokenizer_->name() + " tokenizer)\n");
      data::prepare_text(text_path, dir.string(), tok, c.get_string("data.tokenizer_dir"), c.get_float("data.val_fraction"));
    }
    if (need) barrier();
    const int64_t vocab = c.get_int("model.vocab_size"), T = c.get_int("model.block_size");
    train_set_ = data::token_windows(std::make_shared<data::TokenShard>((dir / "train.bin").string(), vocab), T);
    val_set_ = data::token_windows(std::make_shared<data::TokenShard>((dir / "val.bin").string(), vocab), T);
  }
  if (c.get_int("data.train_samples") > 0) train_set_ = data::prefix_subset(train_set_, c.get_int("data.train_samples"));
  // The labels' entropy (the loss of a model that ignores its inputs), for the doctor: of the
  // data as it is, before any debug.* fault.
  if (rank() == 0) label_entropy_ = step_label_entropy(*train_set_, &label_classes_);
  if (dbg.any()) train_set_ = data::debug_dataset(train_set_, dbg);
  ATH_CHECK(train_set_->size() >= lo.batch_size, "data", train_set_->describe(), " has fewer samples than one batch (",
            lo.batch_size, ")", Hint{"lower trainer.batch_size or use more data"});
  train_loader_ = std::make_unique<data::DataLoader>(train_set_, lo, par_->train_sampler(train_set_->size(), seed));
}

EvalMetrics Trainer::evaluate(std::optional<int64_t> weights_step) {
  nn::Module& model = task_->module();
  model.eval();
  NoGradGuard ng;
  // Stage 3: the ranks' slices may differ in length, so the blocks are gathered once for the
  // whole evaluation (a collective here) rather than per forward.
  std::optional<dist::DataParallel::FullParameters> full;
  if (dp_ && zero_stage_ == 3) full.emplace(*dp_);
  data::LoaderOptions lo;
  lo.batch_size = config_.get_int("trainer.batch_size");
  lo.shuffle = false;
  lo.drop_last = false;
  lo.num_workers = static_cast<int>(config_.get_int("data.num_workers"));
  // The validation batches are those of one sequential pass in global micro-batches (batch_size
  // × dp, as training); under data parallel dp rank r evaluates its slice of each and the sums
  // are reduced, so the result is that of 1 process with batch_size × dp.
  const int64_t global = lo.batch_size * par_->dp_size(), N = val_set_->size();
  const int64_t total = (N + global - 1) / global;
  const int64_t limit = config_.get_int("trainer.eval_batches");
  const int64_t n = limit > 0 ? std::min(limit, total) : total;
  std::vector<int64_t> mine;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i * global + par_->dp_rank() * lo.batch_size; j < std::min(i * global + (par_->dp_rank() + 1) * lo.batch_size, N); ++j)
      mine.push_back(j);
  EvalMetrics e;
  e.step = weights_step.value_or(step_);
  double loss_sum = 0;
  int64_t correct = 0;
  if (!mine.empty()) {
    data::DataLoader val(val_set_, lo, fixed_order_sampler(std::move(mine)));
    for (int64_t i = 0; i < val.batches_per_epoch(); ++i) {
      const data::Batch b = batch_to_device(val.next(), device_);
      std::optional<autocast> ac;
      if (precision_ != DType::f32) ac.emplace(precision_);
      task_->evaluate(b, loss_sum, correct);
      e.count += b.num_targets;
    }
  }
  loss_sum = par_->sum_over_dp(loss_sum);
  correct = std::llround(par_->sum_over_dp(static_cast<double>(correct)));
  e.count = std::llround(par_->sum_over_dp(static_cast<double>(e.count)));
  e.loss = loss_sum / std::max<int64_t>(e.count, 1);
  if (task_->is_classifier()) e.accuracy = static_cast<double>(correct) / std::max<int64_t>(e.count, 1);
  model.train();
  evals_.push_back(e);
  std::ostringstream o;
  o << "eval at step " << e.step << ": val loss " << std::fixed << std::setprecision(4) << e.loss;
  if (e.accuracy >= 0) o << ", accuracy " << std::setprecision(2) << 100 * e.accuracy << "%";
  o << " (" << e.count << (task_->is_language_model() ? " tokens)" : " samples)");
  if (tty_) out_("\n");
  out_(o.str() + "\n");
  files_->append_metrics(observe::to_json(e));
  for (auto& cb : callbacks_) cb->on_eval(e);
  for (auto& s : sinks_) s->on_eval(e);
  return e;
}

std::string Trainer::sample(int64_t tokens) { return sample(tokens, config_.get_string("trainer.sample_prompt")); }

std::string Trainer::sample(int64_t tokens, const std::string& prompt_text) {
  ATH_CHECK(task_->is_language_model() && tokenizer_, "sample", "only GPT models on text data can generate text");
  std::vector<int32_t> prompt = tokenizer_->encode(prompt_text);
  if (prompt.empty()) prompt.push_back(0);
  std::optional<dist::DataParallel::FullParameters> full;  // stage 3: every rank is here (a collective)
  if (dp_ && zero_stage_ == 3) full.emplace(*dp_);
  Generator gen(static_cast<uint64_t>(config_.get_int("seed")) + static_cast<uint64_t>(step_));
  auto ids = task_->generate(prompt, tokens, config_.get_float("trainer.sample_temperature"), config_.get_int("trainer.sample_top_k"), gen);
  return tokenizer_->decode(ids);
}

void Trainer::save_weights(const std::string& path) {
  ckpt::NamedTensors named;
  // Stage 3: gathered copies under the 1-process names (a collective); otherwise the tensors
  // themselves; tensor parallel: the shards merged into the logical tensors (a collective).
  // Pipeline: every stage's tensors gathered on the first stage (collectives over pp).
  for (auto& [n, t] : par_->gather_stages(par_->logical(dp_ && zero_stage_ == 3 ? dp_->full_state_dict() : task_->module().state_dict())))
    named.emplace_back(n, t);
  if (par_->rank() == 0) ckpt::save_safetensors(path, named, {{"format", "athanor"}, {"step", std::to_string(step_)}});
}

std::optional<int64_t> Trainer::load_weights(const std::string& path) {
  auto file = ckpt::load_safetensors(path);
  const nn::StateDict state = par_->local(nn::StateDict(file.tensors.begin(), file.tensors.end()), false);
  if (dp_) dp_->load_full_state_dict(state);  // stage 3: into the gathered blocks (every rank calls it)
  else task_->module().load_state_dict(state);
  const auto it = file.metadata.find("step");
  if (it == file.metadata.end()) return std::nullopt;
  try {
    size_t used = 0;
    const int64_t step = std::stoll(it->second, &used);
    if (used == it->second.size() && step >= 0) return step;
  } catch (const std::exception&) {
  }
  return std::nullopt;  // a "step" that is not a step count: not ours to trust
}

std::string Trainer::checkpoints_dir() const { return (fs::path(run_dir_) / "checkpoints").string(); }

void Trainer::request_stop() { g_stop_requested.store(true); }

int Trainer::rank() const { return par_->rank(); }
int Trainer::world_size() const { return par_->world_size(); }
int Trainer::tp_size() const { return par_->tp_size(); }
int Trainer::pp_size() const { return par_->pp_size(); }
int Trainer::dp_size() const { return par_->dp_size(); }
int64_t Trainer::global_batch() const {
  return config_.get_int("trainer.batch_size") * config_.get_int("trainer.accum_steps") * par_->dp_size();
}
bool Trainer::any_rank(bool v) const { return par_->any_rank(v); }
void Trainer::barrier() const { par_->barrier(); }
bool Trainer::collective_model() const { return zero_stage_ == 3 || par_->tp_size() > 1 || par_->pp_size() > 1; }

std::string Trainer::save_checkpoint() {
  const std::string dir = checkpointer_->save({step_, skipped_, max_steps_, lr_factor_});
  if (write_files_)
    ckpt::apply_retention(checkpoints_dir(), config_.get_int("checkpoint.keep_last"), config_.get_int("checkpoint.keep_every"));
  barrier();  // the checkpoint is complete for every rank (a rollback may read it next)
  last_checkpoint_step_ = step_;
  return dir;
}

void Trainer::verify_checkpoint(const std::string& dir) const { checkpointer_->verify(dir); }

void Trainer::resume_from(const std::string& dir) {
  const TrainCounters c = checkpointer_->restore(dir);
  step_ = c.step;
  skipped_ = c.skipped;
  lr_factor_ = c.lr_factor;
  apply_lr_factor();
  last_checkpoint_step_ = step_;
  history_.clear();
  // metrics.jsonl and health.jsonl: keep the lines up to the checkpoint, so the logs read as one run.
  files_->keep_until(step_);
  if (write_files_) health_started_ = true;
  out_("resumed from " + dir + " at step " + std::to_string(step_) + "\n");
}

bool Trainer::resume_latest() {
  const std::string stale = stale_latest_note(checkpointer_->dir());
  const std::string found = checkpointer_->latest_valid([this](const std::string& s) { out_("skipping damaged checkpoint " + s + "\n"); });
  if (!stale.empty())
    out_("warning: " + stale + "; " +
         (found.empty() ? std::string("no valid checkpoint is left, so training starts from step 0")
                        : "resuming from the newest valid checkpoint, " + fs::path(found).filename().string() + ", instead") +
         "\n");
  if (found.empty()) return false;
  resume_from(found);
  return true;
}

void Trainer::fit() {
  if (start_time_ == 0 || step_ == 0) start_time_ = now_seconds();
  g_stop_requested.store(false);
  stopped_by_signal_ = false;
  StopSignalScope signals;
  const int64_t ckpt_every = config_.get_int("checkpoint.every");
  measure_peak_flops();
  {
    std::ostringstream o;
    o << "precision " << dtype_name(precision_);
    if (scaler_->enabled()) o << " with dynamic loss scaling (init scale " << scaler_->get_scale() << ")";
    o << "; MFU against a peak of " << std::fixed << std::setprecision(1) << peak_flops_ / 1e9 << " GFLOP/s (" << peak_source_
      << ")";
    if (gemm_flops_ > 0) o << ", GEMM efficiency against a " << dtype_name(precision_) << " GEMM's " << gemm_flops_ / 1e9 << " GFLOP/s";
    o << "; non-finite policy " << nonfinite_policy() << "\n";
    out_(o.str());
  }
  if (const std::string note = bf16_speed_note(); !note.empty()) out_("warning: " + note);
  const auto* tpm = dynamic_cast<const dist::TensorParallelLM*>(&task_->module());
  const auto* ppm = dynamic_cast<const dist::PipelineLM*>(&task_->module());
  const int64_t logical = tpm ? tpm->logical_parameters_count() : ppm ? ppm->logical_parameters_count() : 0;
  out_("training " + task_->module().local_name() +
       (logical ? std::to_string(logical) + " parameters (" + std::to_string(task_->module().parameters_count()) + " on rank 0, " +
                      (ppm ? "its pipeline stage" : "a tensor-parallel shard") + ")"
                : std::to_string(task_->module().parameters_count()) + " parameters") +
       " on " +
       train_set_->describe() + " for " + std::to_string(max_steps_) + " steps (batch " +
       std::to_string(config_.get_int("trainer.batch_size")) + " x accum " + std::to_string(config_.get_int("trainer.accum_steps")) +
       (dp_ ? " x " + std::to_string(par_->dp_size()) + " dp ranks (mpi, zero_stage " + std::to_string(zero_stage_) +
                  (par_->tp_size() > 1 ? "; tp " + std::to_string(par_->tp_size()) +
                                             (config_.get_bool("dist.sequence_parallel") ? ", sequence parallel" : "")
                                       : std::string()) +
                  (par_->pp_size() > 1 ? "; pp " + std::to_string(par_->pp_size()) + ", " + config_.get_string("dist.pp_schedule") +
                                             (config_.get_int("dist.virtual_stages") > 1
                                                  ? " x " + std::to_string(config_.get_int("dist.virtual_stages")) + " virtual stages"
                                                  : std::string())
                                       : std::string()) +
                  ")"
            : std::string()) +
       " = global batch " + std::to_string(global_batch()) + "); run directory " + run_dir_ + "\n");
  const int64_t eval_every = config_.get_int("trainer.eval_every"), sample_every = config_.get_int("trainer.sample_every");
  const double limit = config_.get_float("trainer.time_limit_s");
  const double target = config_.get_float("trainer.stop_at_val_loss");
  // Checked here rather than in the constructor: lr-find, batch-find and bench build trainers with
  // eval_every 0 from the user's config and never call fit().
  ATH_CHECK(target == 0 || eval_every > 0, "config", "trainer.stop_at_val_loss (", target,
            ") is checked at the periodic evaluations, but trainer.eval_every is ", eval_every, " (none before the end)",
            Hint{"set trainer.eval_every to how often to evaluate (e.g. 100), or trainer.stop_at_val_loss to 0"});
  end_reason_ = "max_steps";
  end_detail_ = "trained to trainer.max_steps (" + std::to_string(max_steps_) + ")";
  bool target_reached = false;
  while (train_step()) {
    // Under data parallel every rank must take the same branch (checkpoints are collectives):
    // a signal or the time limit seen by any rank stops all of them.
    const bool time_up = any_rank(limit > 0 && now_seconds() - start_time_ > limit);
    if (any_rank(g_stop_requested.load())) {
      g_stop_requested.store(true);
      stopped_by_signal_ = true;
      out_("\nstop requested (SIGTERM/SIGINT): saving a checkpoint at step " + std::to_string(step_) + "\n");
      if (run_files_) out_("saved " + save_checkpoint() + "\n");
      break;
    }
    if (run_files_ && ckpt_every > 0 && step_ % ckpt_every == 0) save_checkpoint();
    if (eval_every > 0 && step_ % eval_every == 0 && step_ < max_steps_) {
      const double val = evaluate().loss;  // the same on every rank (reduced over dp, broadcast over pp)
      target_reached = target > 0 && any_rank(val <= target);
      if (target_reached) {
        std::ostringstream o;
        o << "val loss " << std::fixed << std::setprecision(4) << val << " <= trainer.stop_at_val_loss (" << std::defaultfloat
          << target << ")";
        end_reason_ = "stop_at_val_loss";
        end_detail_ = o.str();
      }
    }
    // Stage 3: every rank samples (the weights are gathered for it); only rank 0 has an output.
    if ((par_->rank() == 0 || collective_model()) && sample_every > 0 && step_ % sample_every == 0 && step_ < max_steps_ &&
        task_->is_language_model())
      out_("--- sample ---\n" + sample(config_.get_int("trainer.sample_tokens")) + "\n--------------\n");
    if (target_reached) {
      out_("\nstopping at step " + std::to_string(step_) + ": " + end_detail_ + "\n");
      break;
    }
    if (time_up) {
      end_reason_ = "time_limit_s";
      end_detail_ = "trainer.time_limit_s (" + std::to_string(limit) + " s) reached";
      out_("\nstopping at step " + std::to_string(step_) + ": " + end_detail_ + "\n");
      break;
    }
  }
  if (!stopped_by_signal_ && any_rank(g_stop_requested.load())) {  // a signal during the last step
    stopped_by_signal_ = true;
    if (run_files_ && last_checkpoint_step_ != step_) out_("saved " + save_checkpoint() + "\n");
  }
  if (stopped_by_signal_) {
    end_reason_ = "signal";
    end_detail_ = "stop requested (SIGTERM/SIGINT)";
  }
  write_run_info();  // run.json's "end": why the run ended
  if (run_files_ && ckpt_every > 0 && last_checkpoint_step_ != step_) save_checkpoint();
  if (stopped_by_signal_) {  // leave quickly: no sample; evaluate only if nothing was evaluated yet
    if (evals_.empty()) evaluate();
    if (write_files_ || (run_files_ && collective_model())) save_weights((fs::path(run_dir_) / "model.safetensors").string());
    for (auto& cb : callbacks_) cb->on_end();
    for (auto& s : sinks_) s->on_end();
    return;
  }
  if (!target_reached) evaluate();  // (the weights that reached the target were evaluated at this step)
  if (write_files_ || (run_files_ && collective_model())) save_weights((fs::path(run_dir_) / "model.safetensors").string());
  if (write_files_ && config_.get_bool("observe.report")) {
    try {
      out_("report: " + files_->write_report() + "\n");
    } catch (const Error& e) {  // the run itself succeeded: say so and go on
      out_(std::string("could not write report.html: ") + e.what() + "\n");
    }
  }
  if ((par_->rank() == 0 || collective_model()) && task_->is_language_model())
    out_("--- sample ---\n" + sample(config_.get_int("trainer.sample_tokens")) + "\n--------------\n");
  for (auto& cb : callbacks_) cb->on_end();
  for (auto& s : sinks_) s->on_end();
}

}  // namespace athanor::train
