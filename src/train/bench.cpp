#include "athanor/train/bench.h"

#include <omp.h>
#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <numeric>
#include <sstream>
#include <vector>

#include "athanor/core/error.h"
#include "athanor/core/half.h"
#include "backend/cpu/cpu_peak.h"
#include "backend/cpu/gemm.h"
#include "train/device_runtime.h"

namespace athanor::train {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Faults {
  long minor = 0, major = 0;
};
Faults faults(int who) {
  rusage u{};
  getrusage(who, &u);
  return {u.ru_minflt, u.ru_majflt};
}

template <class F>
double median_seconds(F&& f, int runs) {
  f();  // warm-up: creates and caches the oneDNN primitive, touches the buffers
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const double t0 = now_seconds();
    f();
    t.push_back(now_seconds() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The middle value, or the mean of the two middle ones (v sorted, not empty).
double median_of_sorted(const std::vector<double>& v) {
  const size_t k = v.size();
  return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

}  // namespace

double measure_gemm_gflops(const std::string& precision) {
  struct Shape3 {
    int64_t M, N, K;
  };
  double best = 0;
  for (Shape3 s : {Shape3{768, 3072, 768}, Shape3{1024, 1024, 1024}}) {
    std::vector<float> a(s.M * s.K), b(s.K * s.N), c(s.M * s.N);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 40503u) % 1000) / 1000.0f - 0.5f;
    const double flop = 2.0 * static_cast<double>(s.M * s.N * s.K);
    double sec;
    if (precision == "bf16") {
      std::vector<bfloat16> ah(a.begin(), a.end()), bh(b.begin(), b.end()), ch(c.size());
      // x @ W^T: the layout of Linear's forward.
      sec = median_seconds([&] {
        cpu::gemm_lowp<bfloat16>(false, true, s.M, s.N, s.K, 1.0f, ah.data(), s.K, bh.data(), s.K, 0.0f, ch.data(), s.N);
      }, 5);
    } else {
      sec = median_seconds([&] {
        cpu::gemm(false, true, s.M, s.N, s.K, 1.0f, a.data(), s.K, b.data(), s.K, 0.0f, c.data(), s.N);
      }, 5);
    }
    best = std::max(best, flop / sec * 1e-9);
  }
  return best;
}

double training_flops_per_step(Trainer& trainer) {
  const Config& c = trainer.config();
  const std::string type = c.get_string("model.type");
  const double batch = static_cast<double>(c.get_int("trainer.batch_size") * c.get_int("trainer.accum_steps"));
  nn::Module& m = trainer.task().module();
  if (type == "gpt") {
    double n = 0;
    for (const auto& [name, p] : m.named_parameters())
      if (name.find("wpe") == std::string::npos) n += static_cast<double>(p.numel());
    const double T = static_cast<double>(c.get_int("model.block_size"));
    const double L = static_cast<double>(c.get_int("model.n_layer")), d = static_cast<double>(c.get_int("model.n_embd"));
    const double tokens = batch * T;
    return 6.0 * n * tokens + 12.0 * L * d * T * tokens;
  }
  if (auto* llama = dynamic_cast<nn::Llama*>(&m)) {
    const int64_t T = c.get_int("model.block_size");
    return llama->flops_per_token(T) * batch * static_cast<double>(T);
  }
  if (type == "mlp") return 6.0 * static_cast<double>(m.parameters_count()) * batch;
  return 0;
}

BenchResult run_bench(Trainer& trainer, const BenchOptions& opts) {
  ATH_CHECK(opts.steps >= 1, "bench", "steps must be at least 1, got ", opts.steps, Hint{"pass --steps N with N >= 1"});
  ATH_CHECK(opts.warmup >= 0, "bench", "warmup must be >= 0, got ", opts.warmup, Hint{"pass --warmup W with W >= 0"});
  const int64_t left = trainer.max_steps() - trainer.step();
  ATH_CHECK(left >= opts.warmup + opts.steps, "bench", "the trainer has ", left, " steps left but the bench needs ",
            opts.warmup + opts.steps, " (warm-up ", opts.warmup, " + timed ", opts.steps, ")",
            Hint{"set trainer.max_steps (and trainer.epochs: 0) to at least warmup + steps"});
  const Config& c = trainer.config();
  BenchResult r;
  r.name = c.get_string("name");
  r.model_type = c.get_string("model.type");
  r.precision = c.get_string("trainer.precision");
  r.unit = trainer.task().is_language_model() ? "tokens" : "samples";
  r.parameters = trainer.task().module().parameters_count();
  r.warmup = opts.warmup;
  const Device device = trainer.device();
  r.device = device.str();

  for (int64_t i = 0; i < opts.warmup; ++i) trainer.train_step();

  // The trainer's device: its allocator's tags and peaks (the caching device allocator on
  // cuda), and each timed step ends when the device has finished it (a step returns with its
  // update queued there).
  synchronize_device(device);
  reset_device_memory_peak(device);
  const MemoryStats before = device_memory_stats(device);
  const Faults p0 = faults(RUSAGE_SELF), t0 = faults(RUSAGE_THREAD);
  r.step_seconds.reserve(opts.steps);  // no allocation inside the timed loop
  struct Phases {
    double data, forward, backward, optimizer, comm;
  };
  std::vector<Phases> phases;
  phases.reserve(opts.steps);
  for (int64_t i = 0; i < opts.steps; ++i) {
    const double s0 = now_seconds();
    ATH_CHECK(trainer.train_step(), "bench", "the trainer stopped after step ", trainer.step(),
              Hint{"raise trainer.max_steps; a time limit (trainer.time_limit_s) also stops it"});
    synchronize_device(device);
    r.step_seconds.push_back(now_seconds() - s0);
    if (!trainer.history().empty()) {
      const observe::StepMetrics& m = trainer.history().back();
      r.targets_per_step = m.targets;
      phases.push_back({m.data_seconds, m.forward_seconds, m.backward_seconds, m.optimizer_seconds, m.comm_seconds});
    }
  }
  const Faults p1 = faults(RUSAGE_SELF), t1 = faults(RUSAGE_THREAD);
  r.memory = device_memory_stats(device);
  if (!trainer.history().empty()) r.final_loss = trainer.history().back().loss;

  const double n = static_cast<double>(opts.steps);
  r.minor_faults_per_step = static_cast<double>(p1.minor - p0.minor) / n;
  r.major_faults_per_step = static_cast<double>(p1.major - p0.major) / n;
  r.thread_minor_faults_per_step = static_cast<double>(t1.minor - t0.minor) / n;
  r.system_allocs_per_step = static_cast<double>(r.memory.system_allocs - before.system_allocs) / n;
  r.system_frees_per_step = static_cast<double>(r.memory.system_frees - before.system_frees) / n;

  std::vector<double> sorted = r.step_seconds;
  std::sort(sorted.begin(), sorted.end());
  const double median = median_of_sorted(sorted);
  r.min_ms = sorted.front() * 1e3;
  r.max_ms = sorted.back() * 1e3;
  r.median_ms = median * 1e3;
  r.throughput = static_cast<double>(r.targets_per_step) / median;
  r.throughput_mean = static_cast<double>(r.targets_per_step) * n / std::accumulate(sorted.begin(), sorted.end(), 0.0);
  auto median_ms_of = [&](auto seconds) {
    std::vector<double> v;
    for (size_t i = 0; i < phases.size(); ++i) v.push_back(seconds(phases[i], r.step_seconds[i]));
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return 1e3 * median_of_sorted(v);
  };
  using P = const Phases&;
  r.data_ms = median_ms_of([](P p, double) { return p.data; });
  r.forward_ms = median_ms_of([](P p, double) { return p.forward; });
  r.backward_ms = median_ms_of([](P p, double) { return p.backward; });
  r.optimizer_ms = median_ms_of([](P p, double) { return p.optimizer; });
  r.comm_ms = median_ms_of([](P p, double) { return p.comm; });
  r.other_ms = median_ms_of([](P p, double wall) { return wall - p.data - p.forward - p.backward - p.optimizer - p.comm; });
  r.flops_per_step = training_flops_per_step(trainer);
  r.achieved_gflops = r.flops_per_step / median * 1e-9;
  if (opts.peak_gflops > 0) {
    r.peak_gflops = opts.peak_gflops;
    r.peak_source = "given";
  } else if (!device.is_cpu()) {  // the GPU's datasheet peak for the precision
    const DevicePeak p = cuda_peak_flops(device, trainer.precision());
    r.peak_gflops = p.flops * 1e-9;
    r.peak_source = p.source;
  } else {
    const cpu::CpuPeak p = cpu::cpu_peak(trainer.precision(), omp_get_max_threads());
    r.peak_gflops = p.gflops;
    r.peak_source = p.describe();
  }
  // The GEMM probe is the CPU's (oneDNN); none on the device yet: no GEMM efficiency there.
  r.gemm_gflops = device.is_cpu() ? measure_gemm_gflops(r.precision) : 0;
  r.mfu = r.peak_gflops > 0 ? r.achieved_gflops / r.peak_gflops : 0;
  r.gemm_efficiency = r.gemm_gflops > 0 ? r.achieved_gflops / r.gemm_gflops : 0;
  return r;
}

std::string BenchResult::json() const {
  // Ordered: the keys come out in the order bench/*.py and the tests have always read them.
  nlohmann::ordered_json j;
  j["engine"] = "athanor";
  j["name"] = name;
  j["model"] = model_type;
  j["precision"] = precision;
  j["unit"] = unit;
  j["targets_per_step"] = targets_per_step;
  j["parameters"] = parameters;
  j["warmup"] = warmup;
  j["steps"] = step_seconds.size();
  nlohmann::ordered_json step_ms = nlohmann::ordered_json::array();
  for (double s : step_seconds) step_ms.push_back(s * 1e3);
  j["step_ms"] = std::move(step_ms);
  j["min_ms"] = min_ms;
  j["median_ms"] = median_ms;
  j["max_ms"] = max_ms;
  j["throughput"] = throughput;
  j["throughput_mean"] = throughput_mean;
  j["flops_per_step"] = flops_per_step;
  j["achieved_gflops"] = achieved_gflops;
  j["peak_gflops"] = peak_gflops;
  j["peak_source"] = peak_source;
  j["gemm_gflops"] = gemm_gflops;
  j["mfu"] = mfu;
  j["gemm_efficiency"] = gemm_efficiency;
  j["minor_faults_per_step"] = minor_faults_per_step;
  j["major_faults_per_step"] = major_faults_per_step;
  j["thread_minor_faults_per_step"] = thread_minor_faults_per_step;
  j["system_allocs_per_step"] = system_allocs_per_step;
  j["system_frees_per_step"] = system_frees_per_step;
  j["final_loss"] = final_loss;  // a non-finite loss comes out as null, still valid JSON
  j["phase_ms"] = {{"data", data_ms}, {"forward", forward_ms}, {"backward", backward_ms},
                   {"optimizer", optimizer_ms}, {"comm", comm_ms}, {"other", other_ms}};
  nlohmann::ordered_json peak = nlohmann::ordered_json::object();
  for (int t = 0; t < kNumMemTags; ++t) peak[mem_tag_name(static_cast<MemTag>(t))] = memory.peak[t];
  peak["total"] = memory.peak_total;
  j["peak_bytes"] = std::move(peak);
  j["reserved_bytes"] = memory.reserved;
  j["device"] = device;
  return j.dump();
}

std::string BenchResult::text() const {
  std::ostringstream o;
  const char* per_s = unit == "tokens" ? "tok/s" : "samples/s";
  o << std::fixed;
  o << name << " (" << model_type << ", " << parameters << " parameters, " << precision << ", " << device << "): " << targets_per_step << " "
    << unit << "/step, " << warmup << " warm-up + " << step_seconds.size() << " timed steps\n";
  o << "  throughput   " << std::setprecision(0) << throughput << " " << per_s << " (median step; mean "
    << throughput_mean << ")\n";
  o << "  ms/step      min " << std::setprecision(1) << min_ms << "  median " << median_ms << "  max " << max_ms << "\n";
  o << "  MFU          " << std::setprecision(1) << 100 * mfu << "% (" << achieved_gflops << " GFLOP/s of a peak of "
    << peak_gflops << ": " << peak_source << ")\n";
  o << "  GEMM eff.    " << std::setprecision(1) << 100 * gemm_efficiency << "% (of a " << precision << " GEMM probe's "
    << gemm_gflops << " GFLOP/s)\n";
  o << "  phases       " << std::setprecision(2) << "data " << data_ms << "  forward " << forward_ms << "  backward "
    << backward_ms << "  optimizer " << optimizer_ms;
  if (comm_ms > 0) o << "  comm " << comm_ms;
  o << "  other " << other_ms << " ms (medians)\n";
  o << "  page faults  " << std::setprecision(1) << minor_faults_per_step << " minor/step (training thread "
    << thread_minor_faults_per_step << "), " << major_faults_per_step << " major/step\n";
  o << "  allocator    " << std::setprecision(2) << system_allocs_per_step << " system allocs/step, " << system_frees_per_step
    << " system frees/step\n";
  o << "  peak memory  ";
  for (int t = 0; t < kNumMemTags; ++t)
    o << mem_tag_name(static_cast<MemTag>(t)) << " " << std::setprecision(1) << static_cast<double>(memory.peak[t]) / 1048576.0
      << " MiB, ";
  o << "total " << static_cast<double>(memory.peak_total) / 1048576.0 << " MiB (reserved "
    << static_cast<double>(memory.reserved) / 1048576.0 << " MiB)\n";
  o << "  final loss   " << std::setprecision(4) << final_loss << "\n";
  return o.str();
}

}  // namespace athanor::train
