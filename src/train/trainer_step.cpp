// The training step (DESIGN.md, "The training step") and what it reports:
// forward under autocast, (scaled) backward, unscale, clip, the guarded optimizer
// step, then metrics — timings, memory by allocator tag, MFU — to metrics.jsonl,
// the progress line, callbacks and sinks. The non-finite policy is in trainer_health.cpp.
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "athanor/core/allocator.h"
#include "athanor/dist/zero.h"
#include "athanor/observe/profiler.h"
#include "athanor/ops.h"
#include "athanor/ops/autocast.h"
#include "athanor/optim/clip.h"
#include "athanor/train/trainer.h"
#include "train/step_observer.h"

namespace athanor::train {
namespace fs = std::filesystem;

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string fmt_duration(double s) {
  std::ostringstream o;
  const int64_t t = static_cast<int64_t>(s);
  if (t >= 3600) o << t / 3600 << "h" << std::setw(2) << std::setfill('0') << (t % 3600) / 60 << "m";
  else if (t >= 60) o << t / 60 << "m" << std::setw(2) << std::setfill('0') << t % 60 << "s";
  else o << t << "s";
  return o.str();
}

// Achieved FLOP/s of a square GEMM in `dt`, measured for ~0.3 s once per process and dtype.
// A private generator keeps the training RNG untouched.
double gemm_probe_flops(DType dt) {
  static std::mutex mu;
  static std::map<DType, double> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(dt); it != cache.end()) return it->second;
  NoGradGuard ng;
  MemTagScope tag(MemTag::workspace);
  Generator gen(12345);
  const int64_t n = 512;
  Tensor a = randn({n, n}, {}, gen).to(dt), b = randn({n, n}, {}, gen).to(dt);
  (void)matmul(a, b);  // warm-up (packing buffers, thread pool)
  int64_t reps = 0;
  const double t0 = now_seconds();
  double elapsed = 0;
  while (elapsed < 0.3) {
    (void)matmul(a, b).raw_data();
    ++reps;
    elapsed = now_seconds() - t0;
  }
  const double flops = 2.0 * static_cast<double>(n * n * n) * static_cast<double>(reps) / elapsed;
  cache[dt] = flops;
  return flops;
}

}  // namespace

void Trainer::measure_peak_flops() {
  if (peak_flops_ > 0) return;
  const double given = config_.get_float("observe.peak_gflops");
  peak_flops_ = given > 0 ? given * 1e9 : gemm_probe_flops(precision_);  // the GEMM dtype the forward uses
}

void Trainer::forward_backward(const std::vector<data::Batch>& batches, StepMetrics& m) {
  for (size_t k = 0; k < batches.size(); ++k) {
    const auto& b = batches[k];
    // Data parallel: gradients of non-final micro-batches accumulate locally (no reduction).
    std::optional<dist::DataParallel::NoSync> no_sync;
    if (dp_ && k + 1 < batches.size()) no_sync.emplace(*dp_);
    const double tf = now_seconds();
    Tensor loss;
    {
      observe::ProfileSpan span("forward");
      // What forward allocates (the activations kept for backward, autocast's weight casts) is
      // "activation"; backward's temporaries (activation gradients) are "workspace", so the
      // activation peak is the memory the forward pass holds, as the memory report means it.
      MemTagScope tag(MemTag::activation);
      std::optional<autocast> ac;
      if (precision_ != DType::f32) ac.emplace(precision_);
      // Layer-statistics steps: each layer's output, from the first micro-batch.
      std::optional<ForwardObserverScope> observe_layers;
      if (k == 0 && observe_window_) observe_layers.emplace(step_observer_->observer(activations_out_));
      loss = task_->loss(b);
    }
    const double w = static_cast<double>(b.num_targets) / static_cast<double>(m.targets);
    m.loss += loss.item() * w;
    const double tb = now_seconds();
    m.forward_seconds += tb - tf;
    // Backward runs outside autocast, as in PyTorch.
    observe::ProfileSpan span("backward");
    MemTagScope tag(MemTag::workspace);
    // m.targets counts every rank's targets; DDP averages over the world, hence × world_: the
    // reduced gradient is the token-weighted one of the global batch, as in 1 process.
    Tensor weighted = mul(loss, w * static_cast<double>(world_));
    if (scaler_->enabled()) weighted = scaler_->scale(weighted);
    weighted.backward();
    m.backward_seconds += now_seconds() - tb;
  }
}

bool Trainer::train_step() {
  if (step_ >= max_steps_) return false;
  const int64_t accum = config_.get_int("trainer.accum_steps");
  nn::Module& model = task_->module();
  model.train();
  measure_peak_flops();  // once; before the clock starts
  profile_window(step_ + 1, true);
  Allocator::cpu().reset_peak();
  const GeneratorState rng_at_start = default_generator().state();
  const double t0 = now_seconds();
  StepMetrics m;
  m.step = step_ + 1;
  m.lr = scheduler_->lr();
  m.loss_scale = scaler_->enabled() ? scaler_->get_scale() : 0;

  // Fetch the step's micro-batches first: the loss weights need the total target count.
  std::vector<data::Batch> batches;
  {
    observe::ProfileSpan span("data_wait");
    for (int64_t k = 0; k < accum; ++k) batches.push_back(train_loader_->next());
  }
  m.data_seconds = now_seconds() - t0;
  observe_inputs(batches, m);  // a NaN sample is named before the step can stop the run
  for (const auto& b : batches) {
    m.targets += b.num_targets;
    m.flops += task_->train_flops(b);  // this process's (MFU is per process)
  }
  if (dp_) m.targets = std::llround(sum_across_ranks(static_cast<double>(m.targets)));
  ATH_CHECK(m.targets > 0, "trainer", "step ", m.step, " has no targets to learn from (all ignored?)");
  debug_rank_delay(m);  // after the step's last collective before backward: the others wait in the gradient reduction

  const int64_t log_every = std::max<int64_t>(1, config_.get_int("trainer.log_every"));
  const bool periodic = m.step % log_every == 0 || m.step == max_steps_ || m.step == 1;
  // Only where the run's files are written (rank 0 of a run with files): the benchmarks and
  // lr-find/batch-find, which write none, time their steps without it.
  const bool stats = write_files_ && (step_observer_->stats_step(m.step, max_steps_) || config_.get_bool("observe.layer_norms"));
  activations_out_ = stats ? &m.activations : nullptr;
  observe_window_ = stats || (write_files_ && step_observer_->dead_window_step(m.step, max_steps_));
  forward_backward(batches, m);
  activations_out_ = nullptr;
  observe_window_ = false;
  if (dp_) {
    maybe_kill_for_test();
    const double tc = now_seconds();
    {
      observe::ProfileSpan span("comm");
      dp_->finish_backward();  // the wait for the bucket reductions still in flight after backward
    }
    m.comm_seconds = now_seconds() - tc;
    m.loss = sum_across_ranks(m.loss);  // each rank added its share of the token-weighted mean
  }

  // Unscale (before clipping), clip, guarded step.
  const double topt = now_seconds();
  std::optional<observe::ProfileSpan> opt_span(std::in_place, "optimizer");
  const auto named = model.named_parameters();
  std::vector<Tensor> params;
  for (const auto& [n, p] : named) params.push_back(p);
  m.loss_nonfinite = !std::isfinite(m.loss);
  // f16: unscale first (clipping needs true gradients). bf16/f32: the (finite) gradient norm
  // below is the check; only a non-finite step pays a pass to name the bad parameters.
  bool found_inf = false;
  if (scaler_->enabled()) {
    found_inf = scaler_->unscale(named);
    m.nonfinite_params = scaler_->nonfinite_params();
  }
  found_inf = any_rank(found_inf || m.loss_nonfinite);  // every rank takes the same branch
  // Pre-clip per-layer norms; the weights are kept to measure this step's update.
  if (stats) step_observer_->before_update(named, m, /*keep_weights=*/true, step_observer_->histogram_step(m.step, max_steps_));
  const double clip = config_.get_float("optimizer.grad_clip");
  if (!found_inf && config_.get_float("optimizer.clip_value") > 0)
    optim::clip_grad_value(params, config_.get_float("optimizer.clip_value"));
  // Without data parallelism the clip coefficient is folded into the optimizer's update
  // (scale_grads_in_next_step, below): the same bits, one pass over the gradients fewer.
  // Spans inside "optimizer": where its time goes (the MLP's SGD step: the update ~3/4, the
  // gradient norm ~1/4; both wait on lines the backward left in the other core's cache).
  {
    observe::ProfileSpan span("grad_norm");
    if (dp_) m.grad_norm = clip > 0 ? dp_->clip_grad_norm(clip) : dp_->grad_norm();  // global norm over all shards
    else m.grad_norm = optim::grad_norm(params);
  }
  found_inf = found_inf || !std::isfinite(m.grad_norm);
  if (found_inf && !scaler_->enabled()) {
    scaler_->unscale(named);  // disabled: divides by nothing, records the names
    m.nonfinite_params = scaler_->nonfinite_params();
  }
  m.grad_norm_clipped = clip > 0 && m.grad_norm > clip ? clip : m.grad_norm;
  // An exploding step gets per-layer norms too, to name the layer (the gradients are
  // still unclipped without data parallelism).
  if (!stats && write_files_ && !dp_ && config_.get_bool("observe.layer_stats") && health_monitor_->wants_layer_detail(m.grad_norm))
    step_observer_->before_update(named, m, /*keep_weights=*/false, /*histograms=*/false);

  bool rolled_back = false;
  auto zero_grad = [&] { dp_ ? dp_->zero_grad() : optimizer_->zero_grad(); };
  if (!found_inf) {
    if (const double coef = optim::clip_coefficient(m.grad_norm, clip); !dp_ && clip > 0 && coef < 1.0)
      optimizer_->scale_grads_in_next_step(coef);
    observe::ProfileSpan span("optimizer_step");
    if (dp_) dp_->step();  // owned parameters, then (ZeRO >= 1) all-gathered
    else optimizer_->step();
    scaler_->update(false);
  } else {
    m.skipped = true;
    ++skipped_;
    scaler_->update(true);
    rolled_back = handle_nonfinite(batches, rng_at_start, m);  // may throw (policy stop)
  }
  if (rolled_back) {  // the state is the checkpoint's now: this step never happened
    zero_grad();
    return true;
  }
  if (stats && !m.skipped) step_observer_->after_update(named, m);
  scheduler_->step();
  {
    observe::ProfileSpan span("zero_grad");
    zero_grad();
  }
  m.optimizer_seconds = now_seconds() - topt;
  opt_span.reset();
  ++step_;
  m.skipped_total = skipped_;
  m.step_seconds = now_seconds() - t0;
  m.throughput = static_cast<double>(m.targets) / std::max(m.step_seconds, 1e-9);
  if (m.flops > 0 && peak_flops_ > 0) m.mfu = m.flops / std::max(m.step_seconds, 1e-9) / peak_flops_;
  const MemoryStats mem = Allocator::cpu().stats();
  for (int t = 0; t < kNumMemTags; ++t)
    m.memory.push_back({mem_tag_name(static_cast<MemTag>(t)), static_cast<int64_t>(mem.current[t]), static_cast<int64_t>(mem.peak[t])});
  finish_step_records(m, periodic);
  history_.push_back(m);
  if (history_.size() > kHistorySteps) history_.pop_front();
  history_.back().histograms.clear();  // TensorBoard's; the history keeps the scalars
  log_step(m);
  if (!memory_reported_) memory_report(m);
  // The batch's sample ids go into an event's details; formatted only when one fires.
  for (auto& e : health_monitor_->check(m)) {
    // The non-finite policy already reported this step's skip.
    if (!health_.empty() && health_.back().step == e.step && health_.back().kind == e.kind) continue;
    // Events about this one step name its samples (a bad batch can cause them).
    if (e.kind == "loss_spike" || e.kind == "grad_spike" || e.kind == "exploding_gradients" || e.kind == "skipped_step") {
      std::vector<int64_t> ids;
      for (const auto& b : batches) ids.insert(ids.end(), b.sample_ids.begin(), b.sample_ids.end());
      e.details["sample_ids"] = ids_text(ids);
    }
    emit_health(e);
  }
  profile_window(m.step, false);
  for (auto& cb : callbacks_) cb->on_step(m);
  for (auto& s : sinks_) s->on_step(m);
  return true;
}

void Trainer::profile_window(int64_t step, bool at_start) {
  if (!config_.get_bool("profile.enabled")) return;
  const int64_t first = config_.get_int("profile.start_step"), last = first + config_.get_int("profile.num_steps") - 1;
  auto& prof = observe::Profiler::instance();
  if (at_start && step == first) {
    prof.reset();
    prof.start();
  } else if (!at_start && (step == last || (step == max_steps_ && step >= first && step < last))) {
    prof.stop();
    std::string msg = "profile of steps " + std::to_string(first) + "-" + std::to_string(step) + ":\n" + prof.table();
    if (write_files_) {
      const std::string path = (fs::path(run_dir_) / "trace.json").string();
      prof.write_chrome_trace(path);
      msg += "trace: " + path + " (open in Perfetto or chrome://tracing)\n";
    }
    if (tty_) out_("\n");
    out_(msg);
  }
}

void Trainer::memory_report(const StepMetrics& m) {
  memory_reported_ = true;
  auto peak_mib = [&](const char* tag) {
    for (const auto& t : m.memory)
      if (t.tag == tag) return static_cast<double>(t.peak) / (1024.0 * 1024.0);
    return 0.0;
  };
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << "memory (peak during step " << m.step << ", " << dtype_name(precision_)
    << "): activations " << peak_mib("activation") << " MiB, parameters " << peak_mib("parameter") << " MiB, gradients "
    << peak_mib("gradient") << " MiB, optimizer state " << peak_mib("optimizer_state") << " MiB, workspace "
    << peak_mib("workspace") << " MiB\n";
  if (tty_) out_("\n");
  out_(o.str());
}

void Trainer::log_step(const StepMetrics& m) {
  const int64_t every = std::max<int64_t>(1, config_.get_int("trainer.log_every"));
  const bool periodic = m.step % every == 0 || m.step == max_steps_ || m.step == 1;
  if (write_files_ && (periodic || m.skipped)) write_jsonl(observe::to_json(m));

  // The progress line: plain periodic lines, or in a terminal redrawn at most ~10 times a
  // second (and on those steps). Formatting it every step cost ~40 us of serial time per
  // step, ~1% of the MLP's, with nothing to show for it between prints.
  if (tty_) {
    const double now = now_seconds();
    if (!periodic && now - last_redraw_ < 0.1) return;
    last_redraw_ = now;
  } else if (!periodic) {
    return;
  }
  double recent = 0;
  int n = 0;
  for (auto it = history_.rbegin(); it != history_.rend() && n < 20; ++it, ++n) recent += it->step_seconds;
  const double eta = n ? recent / n * static_cast<double>(max_steps_ - m.step) : 0;
  std::ostringstream o;
  o << "step " << m.step << "/" << max_steps_ << " | loss " << std::fixed << std::setprecision(4) << m.loss << " | lr "
    << std::scientific << std::setprecision(2) << m.lr << std::fixed << " | grad " << std::setprecision(3) << m.grad_norm;
  if (m.loss_scale > 0) o << " | scale " << std::setprecision(0) << m.loss_scale;
  if (m.skipped_total > 0) o << " | skipped " << m.skipped_total;
  o << " | " << std::setprecision(0) << m.throughput << (task_->is_language_model() ? " tok/s" : " samples/s");
  if (dp_) o << " | comm wait " << std::setprecision(1) << 1e3 * m.comm_seconds << " ms";  // all ranks' tokens/s
  if (m.mfu >= 0) o << " | MFU " << std::setprecision(1) << 100 * m.mfu << "%";
  o << " | ETA " << fmt_duration(eta);
  if (tty_) {
    std::string line = "\r";
    line += o.str();
    line += "\x1b[K";
    if (m.step == max_steps_) line += "\n";
    out_(line);
  }
  else out_(o.str() + "\n");
}

void Trainer::write_jsonl(const std::string& line) {
  if (!write_files_) return;
  if (!metrics_started_) std::ofstream(fs::path(run_dir_) / "metrics.jsonl", std::ios::trunc);
  metrics_started_ = true;
  std::ofstream(fs::path(run_dir_) / "metrics.jsonl", std::ios::app) << line << "\n";
}

}  // namespace athanor::train
