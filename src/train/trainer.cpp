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
#include "athanor/dist/sync_batch_norm.h"
#include "athanor/dist/zero.h"
#include "athanor/nn/gpt.h"
#include "athanor/ops.h"
#include "athanor/observe/report.h"
#include "athanor/observe/tensorboard.h"
#include "athanor/ops/autocast.h"
#include "athanor/optim/clip.h"
#include <optional>
#include "ckpt/checksum.h"
#include "ops/packed_weights.h"

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

// The config keys that fix the model's parameter names and shapes (all applicable model.*
// keys but dropout), as "key" -> canonical value text.
bool key_applies(const Config& c, const ConfigKey& k) {
  if (k.applies_to.empty()) return true;
  const auto eq = k.applies_to.find('=');
  // Model keys depend on model.type (a string choice): "|a|b|" contains "|value|".
  std::string allowed = "|", value = "|";
  allowed += k.applies_to.substr(eq + 1);
  allowed += "|";
  value += c.get_string(k.applies_to.substr(0, eq));
  value += "|";
  return allowed.find(value) != std::string::npos;
}
std::string value_text(const Config& c, const ConfigKey& k) {
  std::ostringstream o;
  o << std::setprecision(17);
  switch (k.default_value.index()) {
    case 0: o << c.get_int(k.path); break;
    case 1: o << c.get_float(k.path); break;
    case 2: o << (c.get_bool(k.path) ? "true" : "false"); break;
    case 3: o << c.get_string(k.path); break;
    case 4: for (auto v : c.get_int_list(k.path)) o << v << ","; break;
    default: for (auto v : c.get_float_list(k.path)) o << v << ","; break;
  }
  return o.str();
}
std::map<std::string, std::string> model_shape(const Config& c) {
  std::map<std::string, std::string> out;
  for (const auto& k : config_schema())
    if (k.path.rfind("model.", 0) == 0 && k.path != "model.dropout" && key_applies(c, k)) out[k.path] = value_text(c, k);
  return out;
}
std::string shape_hash(const std::map<std::string, std::string>& shape) {
  std::string canon;
  for (const auto& [k, v] : shape) canon += k + "=" + v + "\n";
  return ckpt::sha256_hex(canon);
}

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

Trainer::Trainer(Config config, bool write_run_files)
    : config_(std::move(config)), run_files_(write_run_files), write_files_(write_run_files) {
  out_ = [](const std::string& s) { std::cout << s << std::flush; };
  tty_ = isatty(STDOUT_FILENO);
  setup_process_group();  // first: the sampler and the run files depend on the rank
  ATH_CHECK(config_.get_int("trainer.batch_size") > 0, "config", "trainer.batch_size must be > 0");
  ATH_CHECK(config_.get_int("trainer.accum_steps") > 0, "config", "trainer.accum_steps must be > 0");
  build_data();  // first: the text pipeline fixes the vocabulary size
  task_ = make_task(config_);
  init(write_run_files);
}

Trainer::Trainer(Config config, std::unique_ptr<Task> task, bool write_run_files)
    : config_(std::move(config)), task_(std::move(task)), run_files_(write_run_files), write_files_(write_run_files) {
  out_ = [](const std::string& s) { std::cout << s << std::flush; };
  tty_ = isatty(STDOUT_FILENO);
  setup_process_group();
  ATH_CHECK(task_ != nullptr, "trainer", "the task is null", Hint{"pass std::make_unique<YourTask>(...)"});
  ATH_CHECK(config_.get_int("trainer.batch_size") > 0, "config", "trainer.batch_size must be > 0");
  ATH_CHECK(config_.get_int("trainer.accum_steps") > 0, "config", "trainer.accum_steps must be > 0");
  build_data();
  init(write_run_files);
}

void Trainer::init(bool /*write_run_files: in write_files_*/) {
  const Config& c = config_;
  const int64_t gb = global_batch();
  if (group_) {
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
  health_monitor_ = std::make_unique<observe::HealthMonitor>(ho);

  run_dir_ = (fs::path(c.get_string("out_dir")) / c.get_string("name")).string();
  if (!run_files_) return;
  if (!write_files_) {  // ranks other than 0: only resume (every rank loads the checkpoint)
    if (c.get_string("resume") == "auto") resume_latest();
    return;
  }
  std::error_code ec;
  fs::create_directories(run_dir_, ec);
  ATH_CHECK(!ec, "trainer", "cannot create the run directory '", run_dir_, "': ", ec.message(),
            Hint{"check out_dir and the permissions"});
  std::string resolved = config_.resolved_yaml();
  if (precision_ != DType::f16)
    resolved += "# scaler: off (dynamic loss scaling is used only with trainer.precision f16; this run uses " +
                c.get_string("trainer.precision") + ")\n";
  resolved += "# data parallel: " + (group_ ? "mpi, world size " + std::to_string(world_) + ", zero_stage " + std::to_string(zero_stage_)
                                            : std::string("off (1 process)")) +
              "; global batch " + std::to_string(gb) + " = batch_size " + std::to_string(c.get_int("trainer.batch_size")) +
              " x accum_steps " + std::to_string(c.get_int("trainer.accum_steps")) + " x world " + std::to_string(world_) + "\n";
  if (dp_ && zero_stage_ == 3) {
    std::string units;
    for (const auto& u : dp_->shard_units()) units += (units.empty() ? "" : ", ") + u;
    resolved += "# zero_stage 3 sharded modules (parameters split across the ranks, gathered per forward/backward): " + units + "\n";
  }
  std::ofstream(fs::path(run_dir_) / "config.yaml") << resolved;
  if (c.get_bool("observe.tensorboard")) add_sink(std::make_shared<observe::TensorBoardSink>(run_dir_));
  // metrics.jsonl is truncated by the first line written, unless a resume keeps it up to the checkpoint.
  std::ofstream(fs::path(run_dir_) / "metrics.jsonl", std::ios::app);
  if (c.get_string("resume") == "auto") resume_latest();
}

Trainer::~Trainer() = default;

void Trainer::setup_data_parallel(int64_t gb) {
  if (config_.get_bool("dist.sync_batchnorm")) dist::convert_sync_batchnorm(task_->module(), group_);
  // The model is owned by the task, which outlives dp_ (declared before it).
  std::shared_ptr<nn::Module> model(&task_->module(), [](nn::Module*) {});
  dist::DataParallelOptions o;
  o.zero_stage = zero_stage_;
  o.bucket_mb = config_.get_float("dist.bucket_mb");
  if (zero_stage_ == 3) o.shard_modules = zero3_shard_modules();
  dp_ = std::make_unique<dist::DataParallel>(
      model, group_, [this, gb](const optim::NamedTensors& owned) { return make_optimizer(config_, owned, gb); }, o);
  optim_ = &dp_->optimizer();
}

void Trainer::build_data() {
  Config& c = config_;
  const uint64_t seed = static_cast<uint64_t>(c.get_int("seed"));
  data::LoaderOptions lo;
  lo.batch_size = c.get_int("trainer.batch_size");
  lo.num_workers = static_cast<int>(c.get_int("data.num_workers"));
  lo.prefetch = static_cast<int>(c.get_int("data.prefetch"));
  lo.seed = seed;
  if (c.get_string("data.type") == "fashion_mnist") {
    const std::string dir = c.get_string("data.dir").empty() ? data::default_fashion_mnist_dir() : c.get_string("data.dir");
    train_set_ = data::fashion_mnist(dir, true);
    val_set_ = data::fashion_mnist(dir, false);
  } else {
    const std::string corpus = c.get_string("data.corpus"), tok = c.get_string("data.tokenizer");
    tokenizer_ = data::make_tokenizer(tok, c.get_string("data.tokenizer_dir"));
    if (c.get_int("model.vocab_size") == 0) c.set("model.vocab_size", tokenizer_->vocab_size());
    ATH_CHECK(c.get_int("model.vocab_size") >= tokenizer_->vocab_size(), "config", "model.vocab_size (",
              c.get_int("model.vocab_size"), ") is smaller than the tokenizer's vocabulary (", tokenizer_->vocab_size(), ")",
              Hint{"set model.vocab_size: 0 to take the tokenizer's"});
    // Tokenized shards are cached per (corpus, tokenizer) and reused.
    const std::string stem = corpus == "brown" ? "brown" : fs::path(corpus).stem().string();
    const fs::path dir = fs::path(c.get_string("data.cache_dir")) / (stem + "-" + tok);
    // Under data parallel rank 0 prepares the shards while the others wait (one writer).
    const bool need = any_rank(!fs::exists(dir / "train.bin") || !fs::exists(dir / "val.bin"));
    if (need && rank_ == 0) {
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
  ATH_CHECK(train_set_->size() >= lo.batch_size, "data", train_set_->describe(), " has fewer samples than one batch (",
            lo.batch_size, ")", Hint{"lower trainer.batch_size or use more data"});
  train_loader_ = std::make_unique<data::DataLoader>(train_set_, lo, train_sampler(train_set_->size(), seed));
}

EvalMetrics Trainer::evaluate() {
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
  // × world, as training); under data parallel rank r evaluates its slice of each and the sums
  // are reduced, so the result is that of 1 process with batch_size × world.
  const int64_t global = lo.batch_size * world_, N = val_set_->size();
  const int64_t total = (N + global - 1) / global;
  const int64_t limit = config_.get_int("trainer.eval_batches");
  const int64_t n = limit > 0 ? std::min(limit, total) : total;
  std::vector<int64_t> mine;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i * global + rank_ * lo.batch_size; j < std::min(i * global + (rank_ + 1) * lo.batch_size, N); ++j)
      mine.push_back(j);
  EvalMetrics e;
  e.step = step_;
  double loss_sum = 0;
  int64_t correct = 0;
  if (!mine.empty()) {
    data::DataLoader val(val_set_, lo, fixed_order_sampler(std::move(mine)));
    for (int64_t i = 0; i < val.batches_per_epoch(); ++i) {
      data::Batch b = val.next();
      std::optional<autocast> ac;
      if (precision_ != DType::f32) ac.emplace(precision_);
      task_->evaluate(b, loss_sum, correct);
      e.count += b.num_targets;
    }
  }
  loss_sum = sum_across_ranks(loss_sum);
  correct = std::llround(sum_across_ranks(static_cast<double>(correct)));
  e.count = std::llround(sum_across_ranks(static_cast<double>(e.count)));
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
  write_jsonl(observe::to_json(e));
  for (auto& cb : callbacks_) cb->on_eval(e);
  for (auto& s : sinks_) s->on_eval(e);
  return e;
}

std::string Trainer::sample(int64_t tokens) { return sample(tokens, config_.get_string("trainer.sample_prompt")); }

std::string Trainer::sample(int64_t tokens, const std::string& prompt_text) {
  ATH_CHECK(task_->is_language_model() && tokenizer_, "sample", "only GPT models on text data can generate text");
  auto& gpt = dynamic_cast<nn::GPT&>(task_->module());
  std::vector<int32_t> prompt = tokenizer_->encode(prompt_text);
  if (prompt.empty()) prompt.push_back(0);
  std::optional<dist::DataParallel::FullParameters> full;  // stage 3: every rank is here (a collective)
  if (dp_ && zero_stage_ == 3) full.emplace(*dp_);
  Generator gen(static_cast<uint64_t>(config_.get_int("seed")) + static_cast<uint64_t>(step_));
  auto ids = gpt.generate(prompt, tokens, config_.get_float("trainer.sample_temperature"), config_.get_int("trainer.sample_top_k"), gen);
  return tokenizer_->decode(ids);
}

void Trainer::save_weights(const std::string& path) {
  ckpt::NamedTensors named;
  // Stage 3: gathered copies under the 1-process names (a collective); otherwise the tensors themselves.
  for (auto& [n, t] : dp_ && zero_stage_ == 3 ? dp_->full_state_dict() : task_->module().state_dict()) named.emplace_back(n, t);
  if (rank_ == 0) ckpt::save_safetensors(path, named, {{"format", "athanor"}, {"step", std::to_string(step_)}});
}

void Trainer::load_weights(const std::string& path) {
  auto file = ckpt::load_safetensors(path);
  const nn::StateDict state(file.tensors.begin(), file.tensors.end());
  if (dp_) dp_->load_full_state_dict(state);  // stage 3: into the gathered blocks (every rank calls it)
  else task_->module().load_state_dict(state);
}

std::string Trainer::checkpoints_dir() const { return (fs::path(run_dir_) / "checkpoints").string(); }

void Trainer::request_stop() { g_stop_requested.store(true); }

std::string Trainer::save_checkpoint() {
  // Under data parallel every rank saves its own part, under the logical (1-process) names
  // (ckpt/sharded_checkpoint.h): no rank ever holds the full state. The scalars (steps, lrs)
  // are gathered: a collective, so every rank calls save_checkpoint.
  const ckpt::NamedTensors model_tensors = dp_ ? dp_->local_state_dict() : task_->module().state_dict();
  const ckpt::NamedTensors optim_tensors = dp_ ? dp_->local_optimizer_state() : optimizer_->state_tensors();
  const std::map<std::string, double> optim_scalars = dp_ ? dp_->full_optimizer_scalars() : optimizer_->state_scalars();
  const auto shape = model_shape(config_);
  const data::LoaderPosition pos = train_loader_->position();
  const GeneratorState rng = default_generator().state();
  nlohmann::json j;
  j["format"] = "athanor-train-state";
  j["version"] = ATHANOR_VERSION;
  j["step"] = step_;
  j["skipped_steps"] = skipped_;
  j["max_steps"] = max_steps_;
  j["epoch"] = pos.epoch;
  // "samples": the position in the epoch's global sample stream, so that another world size or
  // micro-batch continues with the same global batches.
  const int64_t micro = config_.get_int("trainer.batch_size");
  j["loader"] = {{"epoch", pos.epoch}, {"batch", pos.batch}, {"samples", pos.batch * micro * world_}};
  j["dist"] = {{"world_size", world_}, {"zero_stage", zero_stage_}, {"micro_batch", micro}};
  j["rng"] = {{"default", {{"seed", rng.seed}, {"offset", rng.offset}}}};
  j["scheduler_step"] = scheduler_->current_step();
  j["optimizer"] = {{"type", optim_->name()}, {"scalars", optim_scalars}};
  j["model_shape"] = shape;
  j["config_hash"] = shape_hash(shape);
  j["seed"] = config_.get_int("seed");
  j["lr_factor"] = lr_factor_;
  if (scaler_->enabled())
    j["scaler"] = {{"scale", scaler_->get_scale()}, {"growth_tracker", scaler_->growth_tracker()}, {"skipped_steps", scaler_->skipped_steps()}};
  const std::map<std::string, std::string> meta{{"format", "athanor"}, {"step", std::to_string(step_)}};
  std::string dir;
  if (dp_) {  // every rank writes its shards, rank 0 the indexes, state.json and the manifest
    dir = ckpt::save_sharded_checkpoint(*group_, checkpoints_dir(), step_, {{"model", model_tensors, meta}, {"optimizer", optim_tensors, meta}},
                                        {{"state.json", j.dump(2) + "\n"}});
  } else {
    dir = ckpt::save_checkpoint(checkpoints_dir(), step_,
                                {{"model.safetensors", model_tensors, meta}, {"optimizer.safetensors", optim_tensors, meta}},
                                {{"state.json", j.dump(2) + "\n"}});
  }
  if (write_files_)
    ckpt::apply_retention(checkpoints_dir(), config_.get_int("checkpoint.keep_last"), config_.get_int("checkpoint.keep_every"));
  barrier();  // the checkpoint is complete for every rank (a rollback may read it next)
  last_checkpoint_step_ = step_;
  return dir;
}

void Trainer::verify_checkpoint(const std::string& dir) const {
  if (group_) ckpt::verify_checkpoint_across(*group_, dir);  // each rank hashes 1/N of the files; any failure fails all
  else ckpt::verify_checkpoint(dir);
}

void Trainer::resume_from(const std::string& dir) {
  verify_checkpoint(dir);
  const fs::path state_path = fs::path(dir) / "state.json";
  nlohmann::json j;
  try {
    std::ifstream f(state_path);
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    ATH_FAIL("resume", "'", state_path.string(), "' is not valid JSON: ", e.what(), Hint{"use an earlier checkpoint"});
  }
  try {
    ATH_CHECK(j.value("format", "") == "athanor-train-state", "resume", "'", state_path.string(), "' is not an athanor training state");
    // The model shape must match: the weights would not fit otherwise.
    const auto saved = j.at("model_shape").get<std::map<std::string, std::string>>();
    const auto now = model_shape(config_);
    if (j.at("config_hash").get<std::string>() != shape_hash(now)) {
      std::string diff;
      std::set<std::string> keys;
      for (const auto& [k, v] : saved) keys.insert(k);
      for (const auto& [k, v] : now) keys.insert(k);
      for (const auto& k : keys) {
        const auto a = saved.count(k) ? saved.at(k) : std::string("(unset)");
        const auto b = now.count(k) ? now.at(k) : std::string("(unset)");
        if (a != b) diff += (diff.empty() ? "" : ", ") + k + " (checkpoint " + a + ", config " + b + ")";
      }
      ATH_FAIL("resume", "cannot resume from '", dir, "': the config changes the model shape: ", diff.empty() ? "hash differs" : diff,
               Hint{"restore those model.* keys, or start a new run (another name, or resume: off)"});
    }
    const std::string opt = j.at("optimizer").at("type").get<std::string>();
    ATH_CHECK(opt == optim_->name(), "resume", "cannot resume from '", dir, "': it holds ", opt, " optimizer state but optimizer.type makes ",
              optim_->name(), Hint{"restore optimizer.type, or start a new run"});
    // One file (1 process) or the shards of every rank of the saving run (any world size and
    // stage). Shards are memory-mapped: each rank reads only the tensors it keeps.
    const std::string model_path = (fs::path(dir) / "model.safetensors").string();
    auto optim_file = ckpt::load_checkpoint_tensors(dir, "optimizer");
    if (dp_) {  // the data-parallel wrapper may shard parameters: it takes what this rank holds
      auto model_file = ckpt::load_checkpoint_tensors(dir, "model");
      dp_->load_full_state_dict(nn::StateDict(model_file.tensors.begin(), model_file.tensors.end()));
    } else if (fs::exists(model_path)) {  // straight into the parameters: one copy, as fast as read()
      ckpt::load_safetensors_into(model_path, task_->module().state_dict());
    } else {
      auto model_file = ckpt::load_checkpoint_tensors(dir, "model");
      task_->module().load_state_dict(nn::StateDict(model_file.tensors.begin(), model_file.tensors.end()));
    }
    const auto scalars = j.at("optimizer").at("scalars").get<std::map<std::string, double>>();
    if (dp_) dp_->load_full_optimizer_state(optim_file.tensors, scalars);  // each rank keeps its part: any world size/stage
    else optimizer_->load_state(optim_file.tensors, scalars);
    // Loading bumped the weights' versions: remake their low-precision copies now rather than cast each one in the next step.
    if (optim_->low_precision_copies() != DType::f32) optim_->enable_low_precision_copies(optim_->low_precision_copies());
    step_ = j.at("step").get<int64_t>();
    skipped_ = j.at("skipped_steps").get<int64_t>();
    scheduler_->set_step(j.at("scheduler_step").get<int64_t>());
    const auto& loader = j.at("loader");
    int64_t batch = loader.at("batch").get<int64_t>();
    if (loader.contains("samples")) {  // map the global sample position onto this run's micro-batch × world
      const int64_t samples = loader.at("samples").get<int64_t>(), per = config_.get_int("trainer.batch_size") * world_;
      ATH_CHECK(samples % per == 0, "resume", "cannot resume from '", dir, "': it stopped after ", samples,
                " samples of its epoch, which is not a whole number of this run's global micro-batches (batch_size ",
                config_.get_int("trainer.batch_size"), " x world ", world_, " = ", per, ")",
                Hint{"choose trainer.batch_size and the number of processes so that batch_size x world divides " + std::to_string(samples)});
      batch = samples / per;
    }
    train_loader_->set_position({loader.at("epoch").get<int64_t>(), batch});
    lr_factor_ = j.value("lr_factor", 1.0);
    apply_lr_factor();
    if (scaler_->enabled() && j.contains("scaler"))
      scaler_->load_state_dict({{"scale", scalar_tensor(j.at("scaler").at("scale").get<double>(), {DType::f64})},
                                {"growth_tracker", scalar_tensor(static_cast<double>(j.at("scaler").at("growth_tracker").get<int64_t>()),
                                                                 {DType::f64})}});
    default_generator().set_state({j.at("rng").at("default").at("seed").get<uint64_t>(), j.at("rng").at("default").at("offset").get<uint64_t>()});
  } catch (const nlohmann::json::exception& e) {
    ATH_FAIL("resume", "'", state_path.string(), "' lacks a field or has a wrong type: ", e.what(), Hint{"use an earlier checkpoint"});
  }
  last_checkpoint_step_ = step_;
  history_.clear();
  // metrics.jsonl and health.jsonl: keep the lines up to the checkpoint, so the logs read as one run.
  if (write_files_) {
    for (const char* log : {"metrics.jsonl", "health.jsonl"}) {
      const fs::path mp = fs::path(run_dir_) / log;
      if (!fs::exists(mp)) continue;
      std::ifstream in(mp);
      std::string line, kept;
      while (std::getline(in, line)) {
        const auto at = line.find("\"step\":");
        if (at != std::string::npos && std::strtoll(line.c_str() + at + 7, nullptr, 10) > step_) continue;
        kept += line + "\n";
      }
      in.close();
      std::ofstream(mp, std::ios::trunc) << kept;
    }
    metrics_started_ = health_started_ = true;
  }
  out_("resumed from " + dir + " at step " + std::to_string(step_) + "\n");
}

bool Trainer::resume_latest() {
  const auto found = ckpt::find_latest_valid(checkpoints_dir(), [this](const std::string& dir) { verify_checkpoint(dir); });
  for (const auto& s : found.skipped) out_("skipping damaged checkpoint " + s + "\n");
  if (found.path.empty()) {
    if (!found.skipped.empty()) out_("no valid checkpoint in " + checkpoints_dir() + "; starting from scratch\n");
    return false;
  }
  resume_from(found.path);
  return true;
}

void Trainer::fit() {
  start_time_ = now_seconds();
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
  out_("training " + task_->module().local_name() + std::to_string(task_->module().parameters_count()) + " parameters on " +
       train_set_->describe() + " for " + std::to_string(max_steps_) + " steps (batch " +
       std::to_string(config_.get_int("trainer.batch_size")) + " x accum " + std::to_string(config_.get_int("trainer.accum_steps")) +
       (dp_ ? " x " + std::to_string(world_) + " ranks (mpi, zero_stage " + std::to_string(zero_stage_) + ")" : std::string()) +
       " = global batch " + std::to_string(global_batch()) + "); run directory " + run_dir_ + "\n");
  const int64_t eval_every = config_.get_int("trainer.eval_every"), sample_every = config_.get_int("trainer.sample_every");
  const double limit = config_.get_float("trainer.time_limit_s");
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
    if (eval_every > 0 && step_ % eval_every == 0 && step_ < max_steps_) evaluate();
    // Stage 3: every rank samples (the weights are gathered for it); only rank 0 has an output.
    if ((rank_ == 0 || zero_stage_ == 3) && sample_every > 0 && step_ % sample_every == 0 && step_ < max_steps_ &&
        task_->is_language_model())
      out_("--- sample ---\n" + sample(config_.get_int("trainer.sample_tokens")) + "\n--------------\n");
    if (time_up) {
      out_("\nstopping at step " + std::to_string(step_) + ": trainer.time_limit_s (" + std::to_string(limit) + " s) reached\n");
      break;
    }
  }
  if (!stopped_by_signal_ && any_rank(g_stop_requested.load())) {  // a signal during the last step
    stopped_by_signal_ = true;
    if (run_files_ && last_checkpoint_step_ != step_) out_("saved " + save_checkpoint() + "\n");
  }
  if (run_files_ && ckpt_every > 0 && last_checkpoint_step_ != step_) save_checkpoint();
  if (stopped_by_signal_) {  // leave quickly: no sample; evaluate only if nothing was evaluated yet
    if (evals_.empty()) evaluate();
    if (write_files_ || (run_files_ && zero_stage_ == 3)) save_weights((fs::path(run_dir_) / "model.safetensors").string());
    for (auto& cb : callbacks_) cb->on_end();
    for (auto& s : sinks_) s->on_end();
    return;
  }
  evaluate();
  if (write_files_ || (run_files_ && zero_stage_ == 3)) save_weights((fs::path(run_dir_) / "model.safetensors").string());
  if (write_files_ && config_.get_bool("observe.report")) {
    try {
      out_("report: " + observe::write_report(run_dir_) + "\n");
    } catch (const Error& e) {  // the run itself succeeded: say so and go on
      out_(std::string("could not write report.html: ") + e.what() + "\n");
    }
  }
  if ((rank_ == 0 || zero_stage_ == 3) && task_->is_language_model())
    out_("--- sample ---\n" + sample(config_.get_int("trainer.sample_tokens")) + "\n--------------\n");
  for (auto& cb : callbacks_) cb->on_end();
  for (auto& s : sinks_) s->on_end();
}

}  // namespace athanor::train
