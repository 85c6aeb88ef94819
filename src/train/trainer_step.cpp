// The training step (DESIGN.md, "The training step") and what it reports:
// forward under autocast, (scaled) backward, unscale, clip, the guarded optimizer
// step, then metrics — timings, memory by allocator tag, MFU — to metrics.jsonl,
// the progress line, callbacks and sinks. The non-finite policy is in trainer_health.cpp.
#include <omp.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "athanor/core/allocator.h"
#include "athanor/dist/comm_ledger.h"
#include "athanor/dist/process_group.h"
#include "athanor/dist/device_mesh.h"
#include "athanor/dist/pipeline_schedule.h"
#include "athanor/dist/zero.h"
#include "athanor/observe/profiler.h"
#include "athanor/ops.h"
#include "athanor/ops/autocast.h"
#include "athanor/optim/clip.h"
#include "athanor/train/bench.h"
#include "athanor/train/trainer.h"
#include "backend/cpu/cpu_peak.h"
#include "backend/cpu/isa.h"
#include "optim/device_update.h"
#include "train/batch_feed.h"
#include "train/device_runtime.h"
#include "train/step_observer.h"

#include <nlohmann/json.hpp>

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

// The GEMM probe of `athanor bench` (bench.h: measure_gemm_gflops) in FLOP/s, once per
// process and dtype: the denominator of GEMM efficiency, the same in the log and the bench.
double gemm_probe_flops(DType dt) {
  static std::mutex mu;
  static std::map<DType, double> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(dt); it != cache.end()) return it->second;
  const double flops = measure_gemm_gflops(dtype_name(dt)) * 1e9;
  cache[dt] = flops;
  return flops;
}

// This rank and its place in the mesh, the head of each rank's record in the per-rank files.
nlohmann::json rank_coordinates(const ParallelContext& par) {
  const auto* mesh = par.mesh();
  nlohmann::json j;
  j["rank"] = par.rank();
  j["dp"] = mesh ? mesh->dp_index() : 0;
  j["tp"] = mesh ? mesh->tp_index() : 0;
  j["pp"] = mesh ? mesh->pp_index() : 0;
  return j;
}

}  // namespace

void Trainer::measure_peak_flops() {
  if (peak_flops_ > 0) return;
  const double given = config_.get_float("observe.peak_gflops");
  if (given > 0) {  // no probe either (tests set it to skip the probe): GEMM efficiency unknown
    peak_flops_ = given * 1e9;
    peak_source_ = "observe.peak_gflops";
    return;
  }
  if (!device_.is_cpu()) {  // the GPU's peak for the precision; no GEMM probe on the device yet
    const DevicePeak p = cuda_peak_flops(device_, precision_);
    peak_flops_ = p.flops;
    peak_source_ = p.source;
    return;
  }
  // PaLM's MFU: the hardware's peak for the precision (cpu_peak.h), for the cores in use.
  const cpu::CpuPeak p = cpu::cpu_peak(precision_, omp_get_max_threads());
  peak_flops_ = p.gflops * 1e9;
  peak_source_ = p.describe();
  gemm_flops_ = gemm_probe_flops(precision_);  // the GEMM dtype the forward uses
}

std::string Trainer::bf16_speed_note() {
  if (precision_ != DType::bf16) return "";
  // bf16 arithmetic in hardware: our kernels' AVX512_BF16 level and oneDNN's bf16 GEMMs (AMX or
  // AVX512_BF16). Without it bf16 is converted to f32 and back around every product.
  const std::string onednn = cpu::onednn_isa_name();
  if (cpu::active_isa() == cpu::Isa::avx512_bf16 && (onednn == "avx512_core_bf16" || onednn == "avx512_core_amx")) return "";
  const double bf16 = gemm_probe_flops(DType::bf16), f32 = gemm_probe_flops(DType::f32);
  if (bf16 >= f32) return "";
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << "bf16 on this CPU (" << cpu::cpu_model_name() << ": kernels "
    << cpu::isa_name(cpu::active_isa()) << ", oneDNN " << onednn << ") has no bf16 arithmetic: a bf16 GEMM ran at "
    << bf16 / 1e9 << " GFLOP/s against f32's " << f32 / 1e9 << " (" << f32 / bf16
    << "x slower); bf16 autocast saves memory here, not time\n  hint: trainer.precision=f32 trains faster on this machine\n";
  return o.str();
}

bool Trainer::train_step() {
  if (step_ >= max_steps_) return false;
  const int64_t accum = config_.get_int("trainer.accum_steps");
  nn::Module& model = task_->module();
  model.train();
  measure_peak_flops();  // once; before the clock starts
  profile_window(step_ + 1, true);
  reset_device_memory_peak(device_);
  if (par_->distributed()) dist::comm_ledger().reset();  // the step's communication, by mesh dimension, goes into its record
  const GeneratorState rng_at_start = default_generator().state();
  const double t0 = now_seconds();
  StepMetrics m;
  m.step = step_ + 1;
  m.lr = scheduler_->lr();

  // The step's micro-batches first (the loss weights need the total target count): on the
  // device already when the previous step prefetched them (batch_feed.h).
  FedStep fed = feed_->take(accum);
  const std::vector<data::Batch>& batches = fed.device;
  m.data_seconds = fed.wait_seconds;
  observe_inputs(fed.host, m);  // a NaN sample is named before the step can stop the run
  for (const auto& b : batches) {
    m.targets += b.num_targets;
    m.flops += task_->train_flops(b);  // this process's (MFU is per process)
  }
  if (dp_) m.targets = std::llround(par_->sum_over_dp(static_cast<double>(m.targets)));
  ATH_CHECK(m.targets > 0, "trainer", "step ", m.step, " has no targets to learn from (all ignored?)");
  debug_rank_delay(m);  // after the step's last collective before backward: the others wait in the gradient reduction

  const int64_t log_every = std::max<int64_t>(1, config_.get_int("trainer.log_every"));
  const bool periodic = m.step % log_every == 0 || m.step == max_steps_ || m.step == 1;
  // Per-layer statistics see whole layers only in a run without tensor or pipeline parallelism
  // (a rank holds shards or a stage there); they run only where the run's files are written
  // (rank 0 of a run with files): the benchmarks and lr-find/batch-find, which write none,
  // time their steps without them.
  const bool whole_layers = par_->tp_size() == 1 && par_->pp_size() == 1;
  const bool stats = write_files_ && whole_layers &&
                     (step_observer_->stats_step(m.step, max_steps_) || config_.get_bool("observe.layer_norms"));
  // One GPU, no parallelism, an optimizer with CUDA kernels: the update is guarded on the
  // device and only a logged step reads anything back (guarded_update, below).
  const bool guarded = !device_.is_cpu() && !dp_ && whole_layers && par_->pp_size() == 1 && optimizer_ &&
                       (optimizer_->name() == "adamw" || optimizer_->name() == "adam" || optimizer_->name() == "sgd") &&
                       config_.get_float("optimizer.clip_value") <= 0 && nonfinite_policy() != "rollback";
  const bool read_back = !guarded || periodic || stats;
  step_deferred_ = !read_back;
  if (!guarded && optimizer_ && optimizer_->device_guarded()) optimizer_->set_device_guard(Tensor(), Tensor());
  m.loss_scale = scaler_->enabled() && read_back ? scaler_->get_scale() : 0;  // the scale this step's backward uses
  activations_out_ = stats ? &m.activations : nullptr;
  observe_window_ = stats || (write_files_ && whole_layers && step_observer_->dead_window_step(m.step, max_steps_));
  if (observe_window_) step_pipeline_->observe_next_first_forward(step_observer_->observer(activations_out_));
  // Forward and (scaled) backward of every micro-batch: the loop, or the pipeline schedule.
  step_pipeline_->forward_backward(batches, m);
  activations_out_ = nullptr;
  observe_window_ = false;
  if (dp_) par_->maybe_kill_for_test(m.step);
  step_pipeline_->finish_backward(m);  // wait for the gradient reduction
  if (dp_) {  // each dp rank added its share of the token-weighted mean
    step_pipeline_->read_loss(m);
    m.loss = par_->sum_over_dp(m.loss);
  }

  // Unscale (before clipping), clip, guarded step.
  const double topt = now_seconds();
  std::optional<observe::ProfileSpan> opt_span(std::in_place, "optimizer");
  const auto named = model.named_parameters();
  std::vector<Tensor> params;
  for (const auto& [n, p] : named) params.push_back(p);
  bool rolled_back = false;
  auto zero_grad = [&] { dp_ ? dp_->zero_grad() : optimizer_->zero_grad(); };
  if (guarded) {
    rolled_back = guarded_update(batches, rng_at_start, m, named, params, read_back, stats);
  } else {
    // f16: unscale first (clipping needs true gradients). bf16/f32: the (finite) gradient norm
    // below is the check; only a non-finite step pays a pass to name the bad parameters.
    // The scaler's no-sync forms, as the guarded step uses them: on the CPU reading their flag
    // costs nothing; with data parallelism on a GPU it is the read the branch below needs anyway.
    bool found_inf = false;
    Tensor found;
    if (scaler_->enabled()) {
      found = scaler_->unscale_async(named);
      found_inf = found.item<double>() != 0.0;
      m.nonfinite_params = scaler_->nonfinite_params();
    }
    // Pre-clip per-layer norms; the weights are kept to measure this step's update.
    if (stats) step_observer_->before_update(named, m, /*keep_weights=*/true, step_observer_->histogram_step(m.step, max_steps_));
    if (!whole_layers && config_.get_bool("observe.layer_norms")) {  // every rank: tensor parallelism sums over tp
      for (const auto& [n, p] : named)
        m.layers.push_back({n, p.grad().defined() ? l2_norm(p.grad()) : 0.0, l2_norm(p)});
      if (const auto* specs = par_->tp_specs()) {  // a shard's norm is part of its logical tensor's: sum the squares over tp
        std::vector<double> sq;
        for (size_t i = 0; i < named.size(); ++i) {
          const bool sharded = dist::spec_of(*specs, named[i].first).sharded();
          sq.push_back(sharded ? m.layers[i].grad_norm * m.layers[i].grad_norm : 0.0);
          sq.push_back(sharded ? m.layers[i].param_norm * m.layers[i].param_norm : 0.0);
        }
        Tensor t = from_vector(sq, {static_cast<int64_t>(sq.size())}, TensorOptions(DType::f64));
        par_->tp_group()->all_reduce(t);
        const std::vector<double> total = t.to_vector();
        for (size_t i = 0; i < named.size(); ++i)
          if (dist::spec_of(*specs, named[i].first).sharded()) {
            m.layers[i].grad_norm = std::sqrt(total[2 * i]);
            m.layers[i].param_norm = std::sqrt(total[2 * i + 1]);
          }
      }
    }
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
    // The step's host sync: the norm above waited for the device (the update is guarded by it).
    // The loss, kept on the device through the step, is read now, with nothing left to wait for.
    if (!dp_) step_pipeline_->read_loss(m);
    m.loss_nonfinite = !std::isfinite(m.loss);
    found_inf = any_rank(found_inf || m.loss_nonfinite);  // every rank takes the same branch
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

    if (!found_inf) {
      if (const double coef = optim::clip_coefficient(m.grad_norm, clip); !dp_ && clip > 0 && coef < 1.0)
        optimizer_->scale_grads_in_next_step(coef);
      observe::ProfileSpan span("optimizer_step");
      if (dp_) dp_->step();  // owned parameters, then (ZeRO >= 1) all-gathered
      else optimizer_->step();
      if (found.defined()) scaler_->update(found);  // 0: no gradient overflowed
      else scaler_->update(false);
    } else {
      m.skipped = true;
      ++skipped_;
      if (found.defined()) {  // a non-finite loss or norm backs off too
        if (found.item<double>() == 0.0) found.fill_(1.0);
        scaler_->update(found);
      } else {
        scaler_->update(true);
      }
      rolled_back = handle_nonfinite(batches, rng_at_start, m);  // may throw (policy stop)
    }
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
  // The next step's batches, fetched and uploaded while the device runs this step's update.
  if (step_ < max_steps_) feed_->prefetch(accum);
  if (empty_cache_every_ > 0 && step_ % empty_cache_every_ == 0) empty_device_cache(device_);
  m.skipped_total = skipped_;
  m.step_seconds = now_seconds() - t0;
  m.throughput = static_cast<double>(m.targets) / std::max(m.step_seconds, 1e-9);
  if (m.flops > 0 && peak_flops_ > 0) m.mfu = m.flops / std::max(m.step_seconds, 1e-9) / peak_flops_;
  if (m.flops > 0 && gemm_flops_ > 0) m.gemm_efficiency = m.flops / std::max(m.step_seconds, 1e-9) / gemm_flops_;
  if (par_->distributed())
    for (const auto& [dim, t] : dist::comm_ledger().by_dimension())
      m.comm.push_back({dim, t.ops, static_cast<double>(t.bytes), t.wire_bytes, t.seconds});
  const MemoryStats mem = device_memory_stats(device_);
  for (int t = 0; t < kNumMemTags; ++t)
    m.memory.push_back({mem_tag_name(static_cast<MemTag>(t)), static_cast<int64_t>(mem.current[t]), static_cast<int64_t>(mem.peak[t])});
  finish_step_records(m, periodic);
  history_.push_back(m);
  if (history_.size() > kHistorySteps) history_.pop_front();
  history_.back().histograms.clear();  // TensorBoard's; the history keeps the scalars
  log_step(m);
  if (!memory_reported_) memory_report(m);
  // The batch's sample ids go into an event's details; formatted only when one fires. A
  // guarded step that read nothing back (guarded_update) has nothing to check.
  for (auto& e : step_deferred_ ? std::vector<observe::HealthEvent>{} : health_monitor_->check(m)) {
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
  // The pipeline's action timeline of one step (the first profiled one, else step 2: past the warm-up).
  const bool profiling = config_.get_bool("profile.enabled");
  if (par_->pp_size() > 1 && run_files_ &&
      m.step == (profiling ? config_.get_int("profile.start_step") : std::min<int64_t>(2, max_steps_)))
    write_pipeline_timeline(m.step);
  write_rank_memory(mem, m.step == max_steps_);
  for (auto& cb : callbacks_) cb->on_step(m);
  if (!step_deferred_)  // a guarded step's loss and norm are on the device (guarded_update): TensorBoard skips it
    for (auto& s : sinks_) s->on_step(m);
  return true;
}

// The update on one GPU with no host read (DESIGN.md "GPUs": a step issues no host
// synchronisation). The CPU's decision (trainer_step above: skip on a non-finite loss, grad
// norm or f16 overflow; clip by norm folded into the update) is made on the device
// (optim::detail::step_guard_on_device) and consumed there by the optimizer's kernels
// (Optimizer::set_device_guard): a skipped step changes no weight, state or step count, as on
// the CPU. GradScaler runs its no-sync forms (unscale_async, update(found_inf)) and backs off
// on the same decision. Only a logged step (read_back) reads the loss, the norm and the
// flags. So on the steps between two logged ones the host does not know the loss, the norm
// or whether the step was skipped: the skipped-step count (skipped_steps(), metrics'
// skipped_total), the health checks and the non-finite policy lag to the next logged step,
// which reports the skips since the last one (health.nonfinite_policy=stop stops there: the
// skipped steps changed nothing but the schedule and the data position). Only a skipped
// logged step is diagnosed (its batches are at hand). Returns whether the state was rolled
// back (never: rollback keeps the per-step read, see train_step).
bool Trainer::guarded_update(const std::vector<data::Batch>& batches, const GeneratorState& rng_at_start,
                             StepMetrics& m, const optim::NamedTensors& named, const std::vector<Tensor>& params,
                             bool read_back, bool stats) {
  Tensor found;  // f16: GradScaler's overflow flag, on the device
  if (scaler_->enabled()) found = scaler_->unscale_async(named);
  if (stats) step_observer_->before_update(named, m, /*keep_weights=*/true, step_observer_->histogram_step(m.step, max_steps_));
  const double clip = config_.get_float("optimizer.grad_clip");
  Tensor sumsq;
  {
    observe::ProfileSpan span("grad_norm");
    sumsq = optim::grad_sum_squares_on_device(params);
  }
  if (!guard_skip_.defined() || guard_skip_.device() != device_) {
    guard_skip_ = zeros({1}, TensorOptions(DType::f32).with_device(device_).with_tag(MemTag::other));
    guard_out_ = zeros({3}, TensorOptions(DType::f64).with_device(device_).with_tag(MemTag::other));
    guard_skipped_read_ = 0;
  }
  if (!optimizer_->device_guarded()) optimizer_->set_device_guard(guard_skip_, make_view(guard_out_, {1}, {1}, 0));
  optim::detail::step_guard_on_device(sumsq, found, step_pipeline_->loss_on_device(), clip, guard_skip_, guard_out_);
  {
    observe::ProfileSpan span("optimizer_step");
    optimizer_->step();  // a no-op on the device when guard_skip_ says so
  }
  if (scaler_->enabled()) scaler_->update(guard_skip_);
  if (!read_back) {  // nothing is known on the host: see above
    m.loss = m.grad_norm = m.grad_norm_clipped = std::numeric_limits<double>::quiet_NaN();
    return false;
  }
  // The logged step's reads: the guard's record (which waits for the whole step), then the
  // flag and the losses, with nothing left to wait for.
  const std::vector<double> out = guard_out_.to_vector();
  const bool skipped_now = guard_skip_.item<double>() != 0.0;
  step_pipeline_->read_loss(m);
  m.loss_nonfinite = !std::isfinite(m.loss);
  m.grad_norm = out[1];
  m.grad_norm_clipped = clip > 0 && m.grad_norm > clip ? clip : m.grad_norm;
  const auto skipped_total = static_cast<int64_t>(out[2]);
  const int64_t earlier = skipped_total - guard_skipped_read_ - (skipped_now ? 1 : 0);  // unlogged steps skipped
  guard_skipped_read_ = skipped_total;
  skipped_ += earlier;
  if (earlier > 0) {
    observe::HealthEvent e;
    e.step = m.step;
    e.kind = "skipped_step";
    e.severity = "warning";
    e.message = std::to_string(earlier) + " step(s) before step " + std::to_string(m.step) +
                " (since the last logged one) had a non-finite loss or gradients and were skipped on the device";
    e.suggestions = {"set trainer.log_every=1 to find the step (the GPU step reads its flags only on logged steps)"};
    emit_health(e);
    if (!scaler_->enabled() && nonfinite_policy() == "stop")
      ATH_FAIL("trainer", e.message, Hint{"lower optimizer.lr, add warmup or optimizer.grad_clip, set "
                                          "health.nonfinite_policy=skip, or trainer.log_every=1 to stop at the step itself"});
  }
  if (skipped_now && !scaler_->enabled()) {
    scaler_->unscale(named);  // disabled: divides by nothing, records the names
    m.nonfinite_params = scaler_->nonfinite_params();
    scaler_->update(true);
  } else if (scaler_->enabled() && skipped_now) {
    m.nonfinite_params = scaler_->nonfinite_params();
  }
  if (!stats && write_files_ && config_.get_bool("observe.layer_stats") && health_monitor_->wants_layer_detail(m.grad_norm))
    step_observer_->before_update(named, m, /*keep_weights=*/false, /*histograms=*/false);  // after the update: post-step
  if (!skipped_now) return false;
  m.skipped = true;
  ++skipped_;
  return handle_nonfinite(batches, rng_at_start, m);  // may throw (policy stop)
}

void Trainer::profile_window(int64_t step, bool at_start) {
  if (!config_.get_bool("profile.enabled")) return;
  const int64_t first = config_.get_int("profile.start_step"), last = first + config_.get_int("profile.num_steps") - 1;
  auto& prof = observe::Profiler::instance();
  if (at_start && step == first) {
    prof.reset();
    prof.set_device(device_);  // on cuda: each op's device time too (CUDA events, resolved by table())
    prof.start();
  } else if (!at_start && (step == last || (step == max_steps_ && step >= first && step < last))) {
    prof.stop();
    std::string msg = "profile of steps " + std::to_string(first) + "-" + std::to_string(step) + ":\n" + prof.table();
    const std::string path = files_->path("trace.json");
    if (par_->distributed() && run_files_) {
      // One track per rank: every rank's events, gathered on rank 0 (a collective).
      std::string track = "rank " + std::to_string(par_->rank());
      if (const auto* mesh = par_->mesh())
        track += " (dp " + std::to_string(mesh->dp_index()) + ", tp " + std::to_string(mesh->tp_index()) + ", pp " +
                 std::to_string(mesh->pp_index()) + ")";
      const auto all = dist::all_gather_strings(*par_->world(), prof.trace_events(par_->rank(), track));
      if (write_files_) observe::write_merged_chrome_trace(path, all);
    } else if (write_files_) {
      prof.write_chrome_trace(path);
    }
    if (write_files_) msg += "trace: " + path + " (open in Perfetto or chrome://tracing)\n";
    if (tty_) out_("\n");
    out_(msg);
  }
}

void Trainer::write_pipeline_timeline(int64_t step) {
  nlohmann::json mine = rank_coordinates(*par_);
  nlohmann::json events = nlohmann::json::array();
  for (const auto& e : step_pipeline_->timeline())
    events.push_back({dist::action_name(e.kind), e.mb, e.chunk, e.start, e.end});
  mine["events"] = events;
  const auto all = dist::all_gather_strings(*par_->world(), mine.dump());  // every rank's clocks, on every rank
  if (!write_files_ || history_.empty()) return;
  const auto& pl = history_.back().pipeline;
  nlohmann::json j;
  j["step"] = step;
  j["schedule"] = pl.schedule;
  j["stages"] = pl.stages;
  j["virtual_stages"] = pl.virtual_stages;
  j["micro_batches"] = pl.micro_batches;
  j["bubble"] = pl.bubble;
  j["theory"] = pl.theory;
  j["schedule_s"] = pl.step_seconds;
  j["ranks"] = nlohmann::json::array();
  for (const auto& r : all) j["ranks"].push_back(nlohmann::json::parse(r));
  files_->write_text("pipeline_timeline.json", j.dump() + "\n");
}

void Trainer::write_rank_memory(const MemoryStats& step_stats, bool last) {
  for (int t = 0; t < kNumMemTags; ++t) run_peak_.peak[t] = std::max(run_peak_.peak[t], step_stats.peak[t]);
  run_peak_.peak_total = std::max(run_peak_.peak_total, step_stats.peak_total);
  if (!last) return;
  // What `athanor plan --evaluate` is checked against: each rank's allocator high-water mark
  // (requested bytes), the largest over the steps (the allocator's peak is reset per step).
  nlohmann::json mine = rank_coordinates(*par_);
  mine["peak_total"] = run_peak_.peak_total;
  mine["last_step_peak_total"] = step_stats.peak_total;
  for (int t = 0; t < kNumMemTags; ++t) mine["peak"][mem_tag_name(static_cast<MemTag>(t))] = run_peak_.peak[t];
  std::vector<std::string> all{mine.dump()};
  if (par_->distributed()) all = dist::all_gather_strings(*par_->world(), mine.dump());
  if (!write_files_) return;
  nlohmann::json j;
  j["steps"] = max_steps_;
  j["ranks"] = nlohmann::json::array();
  for (const auto& r : all) j["ranks"].push_back(nlohmann::json::parse(r));
  files_->write_text("memory_ranks.json", j.dump() + "\n");
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
    << peak_mib("workspace") << " MiB";
  if (const std::string note = device_memory_note(device_); !note.empty()) o << "; " << note;
  o << "\n";
  if (tty_) out_("\n");
  out_(o.str());
}

void Trainer::log_step(const StepMetrics& m) {
  if (step_deferred_) return;  // its loss and norm are still on the device (guarded_update)
  const int64_t every = std::max<int64_t>(1, config_.get_int("trainer.log_every"));
  const bool periodic = m.step % every == 0 || m.step == max_steps_ || m.step == 1;
  if (write_files_ && (periodic || m.skipped)) files_->append_metrics(observe::to_json(m));

  // The progress line: plain periodic lines, or in a terminal redrawn at most ~10 times a
  // second (and on those steps). Formatting it every step costs serial time in every
  // step, with nothing to show for it between prints.
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
  if (m.gemm_efficiency >= 0) o << " (GEMM eff " << std::setprecision(0) << 100 * m.gemm_efficiency << "%)";
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

}  // namespace athanor::train
