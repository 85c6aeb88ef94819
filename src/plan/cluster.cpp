// Cluster presets, cluster files, and this CPU measured once (plan/cluster.h).
#include "athanor/plan/cluster.h"

#include <omp.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"
#include "athanor/core/rng.h"
#include "athanor/ops/linalg.h"
#include "backend/cpu/cpu_peak.h"

namespace athanor::plan {
namespace fs = std::filesystem;

double Cluster::peak(Precision p) const {
  switch (p) {
    case Precision::f32: return peak_f32;
    case Precision::bf16: return peak_bf16;
    case Precision::f16: return peak_f16;
  }
  return peak_f32;
}

namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

// Vendor figures: dense tensor-core peaks (no sparsity); f32 is the plain FP32 rate (athanor's
// f32 GEMMs do not use TF32). Links per GPU, one direction: NVLink 4 is 450 GB/s on H100 SXM,
// NVLink 3 300 GB/s on A100; one 400 Gb/s (H100) or 200 Gb/s (A100) InfiniBand NIC per GPU.
// The usable memory is what remains after the CUDA context (~0.5 GiB).
Cluster h100() {
  Cluster c;
  c.name = "h100-sxm-80gb";
  c.source = "preset (NVIDIA H100 SXM5 80 GB, 8 per node, NVLink 4, 400 Gb/s InfiniBand per GPU)";
  c.devices_per_node = 8;
  c.memory_bytes = 79.5 * GiB;
  c.peak_f32 = 67e12;
  c.peak_bf16 = c.peak_f16 = 989e12;
  c.efficiency = 0.5;
  c.intra = {450e9, 3e-6};
  c.inter = {50e9, 5e-6};
  return c;
}

Cluster a100() {
  Cluster c;
  c.name = "a100-80gb";
  c.source = "preset (NVIDIA A100 SXM4 80 GB, 8 per node, NVLink 3, 200 Gb/s InfiniBand per GPU)";
  c.devices_per_node = 8;
  c.memory_bytes = 79.5 * GiB;
  c.peak_f32 = 19.5e12;
  c.peak_bf16 = c.peak_f16 = 312e12;
  c.efficiency = 0.5;
  c.intra = {300e9, 3e-6};
  c.inter = {25e9, 5e-6};
  return c;
}

double number(const YAML::Node& n, const std::string& key, const std::string& source) {
  try {
    return n.as<double>();
  } catch (const YAML::Exception&) {
    ATH_FAIL("plan", source, ": key '", key, "' must be a number, got '", YAML::Dump(n), "'",
             Hint{"see include/athanor/plan/cluster.h for the cluster file's keys"});
  }
}

Cluster from_yaml(const YAML::Node& y, const std::string& source) {
  static const std::vector<std::string> keys = {"name", "devices_per_node", "nodes", "memory_gib", "peak_tflops",
                                                "efficiency", "efficiency_lowp", "intra_node", "inter_node", "shared_compute", "cores",
                                                "memory_calibration", "oversubscribed_latency_us", "comm_probe",
                                                "slowdown_at_cores", "slowdown_at_2cores"};
  ATH_CHECK(y.IsMap(), "plan", source, ": a cluster file is a YAML mapping", Hint{"see include/athanor/plan/cluster.h"});
  for (const auto& kv : y) {
    const std::string k = kv.first.as<std::string>();
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) {
      std::string near = keys[0];
      for (const auto& c : keys)
        if (edit_distance(k, c) < edit_distance(k, near)) near = c;
      ATH_FAIL("plan", source, ": unknown key '", k, "'", Hint{"did you mean '" + near + "'?"});
    }
  }
  for (const char* k : {"devices_per_node", "memory_gib", "peak_tflops"})
    ATH_CHECK(y[k], "plan", source, ": the key '", k, "' is missing", Hint{"see include/athanor/plan/cluster.h"});
  Cluster c;
  c.name = y["name"] ? y["name"].as<std::string>() : fs::path(source).stem().string();
  c.source = source;
  c.devices_per_node = static_cast<int>(number(y["devices_per_node"], "devices_per_node", source));
  c.nodes = y["nodes"] ? static_cast<int>(number(y["nodes"], "nodes", source)) : 1;
  c.memory_bytes = number(y["memory_gib"], "memory_gib", source) * GiB;
  const YAML::Node p = y["peak_tflops"];
  ATH_CHECK(p.IsMap() && p["f32"], "plan", source, ": peak_tflops needs at least f32: {f32: …, bf16: …}",
            Hint{"per device, dense"});
  c.peak_f32 = number(p["f32"], "peak_tflops.f32", source) * 1e12;
  c.peak_bf16 = p["bf16"] ? number(p["bf16"], "peak_tflops.bf16", source) * 1e12 : c.peak_f32;
  c.peak_f16 = p["f16"] ? number(p["f16"], "peak_tflops.f16", source) * 1e12 : c.peak_bf16;
  if (y["efficiency"]) c.efficiency = number(y["efficiency"], "efficiency", source);
  if (y["efficiency_lowp"]) c.efficiency_lowp = number(y["efficiency_lowp"], "efficiency_lowp", source);
  auto link = [&](const char* key, Link def) {
    if (!y[key]) return def;
    const YAML::Node l = y[key];
    Link r;
    r.bytes_per_s = number(l["gbps"], std::string(key) + ".gbps", source) * 1e9;
    r.latency_s = l["latency_us"] ? number(l["latency_us"], std::string(key) + ".latency_us", source) * 1e-6 : 5e-6;
    return r;
  };
  c.intra = link("intra_node", {100e9, 5e-6});
  c.inter = link("inter_node", c.intra);
  if (y["shared_compute"]) c.shared_compute = y["shared_compute"].as<bool>();
  if (y["cores"]) c.cores = static_cast<int>(number(y["cores"], "cores", source));
  if (y["oversubscribed_latency_us"])
    c.latency_oversubscribed_s = number(y["oversubscribed_latency_us"], "oversubscribed_latency_us", source) * 1e-6;
  if (y["comm_probe"]) c.comm_probe = y["comm_probe"].as<std::string>();
  if (y["slowdown_at_cores"]) c.slowdown_at_cores = number(y["slowdown_at_cores"], "slowdown_at_cores", source);
  if (y["slowdown_at_2cores"]) c.slowdown_at_2cores = number(y["slowdown_at_2cores"], "slowdown_at_2cores", source);
  if (y["memory_calibration"]) c.memory_calibration = number(y["memory_calibration"], "memory_calibration", source);
  ATH_CHECK(c.devices_per_node >= 1 && c.nodes >= 1 && c.memory_bytes > 0 && c.peak_f32 > 0 && c.efficiency > 0 &&
                c.efficiency <= 1 && c.intra.bytes_per_s > 0 && c.inter.bytes_per_s > 0,
            "plan", source, ": devices_per_node, nodes, memory_gib, peak_tflops and the link gbps must be > 0 and efficiency in (0, 1]",
            Hint{"see include/athanor/plan/cluster.h"});
  return c;
}

}  // namespace

std::string to_yaml(const Cluster& c) {
  std::ostringstream o;
  o.precision(6);
  o << "name: " << c.name << "\ndevices_per_node: " << c.devices_per_node << "\nnodes: " << c.nodes
    << "\nmemory_gib: " << c.memory_bytes / GiB << "\npeak_tflops: {f32: " << c.peak_f32 / 1e12 << ", bf16: " << c.peak_bf16 / 1e12
    << ", f16: " << c.peak_f16 / 1e12 << "}\nefficiency: " << c.efficiency << "\nefficiency_lowp: " << c.efficiency_lowp << "\nintra_node: {gbps: " << c.intra.bytes_per_s / 1e9
    << ", latency_us: " << c.intra.latency_s * 1e6 << "}\ninter_node: {gbps: " << c.inter.bytes_per_s / 1e9
    << ", latency_us: " << c.inter.latency_s * 1e6 << "}\nshared_compute: " << (c.shared_compute ? "true" : "false")
    << "\ncores: " << c.cores << "\nmemory_calibration: " << c.memory_calibration << "\n";
  if (c.latency_oversubscribed_s >= 0) o << "oversubscribed_latency_us: " << c.latency_oversubscribed_s * 1e6 << "\n";
  if (!c.comm_probe.empty()) o << "comm_probe: " << c.comm_probe << "\n";
  if (c.slowdown_at_cores >= 0) o << "slowdown_at_cores: " << c.slowdown_at_cores << "\nslowdown_at_2cores: " << c.slowdown_at_2cores << "\n";
  return o.str();
}

namespace {

// One core's memcpy rate over 64 MiB (past the caches): what a shared-memory transfer
// between two ranks on this machine moves per second.
double memcpy_bytes_per_s() {
  const size_t n = 64u << 20;
  std::vector<char> a(n, 1), b(n, 0);
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return static_cast<double>(n) / best;
}

// FLOP/s of one thread on a 256 x 256 x 256 matmul in `dt`, the best of a few ~50 ms runs.
double gemm_probe(DType dt) {
  NoGradGuard ng;
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  Generator gen(7);
  const int64_t n = 256;
  Tensor a = randn({n, n}, {}, gen).to(dt), b = randn({n, n}, {}, gen).to(dt);
  (void)matmul(a, b).raw_data();  // warm-up
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    int reps = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double s = 0;
    while (s < 0.05) {
      (void)matmul(a, b).raw_data();
      ++reps;
      s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    best = std::max(best, 2.0 * n * n * n * reps / s);
  }
  omp_set_num_threads(threads);
  return best;
}

}  // namespace

double lowp_gemm_speedup(int64_t m, int64_t k, int64_t n) {
  NoGradGuard ng;
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  Generator gen(7);
  const Tensor a = randn({m, k}, {}, gen), w = randn({k, n}, {}, gen);
  // As training runs it: f32 inputs, cast to bf16 per op under autocast (the weights are f32 masters).
  auto rate = [&](bool lowp) {
    auto once = [&] { (void)(lowp ? matmul(a.to(DType::bf16), w.to(DType::bf16)) : matmul(a, w)).raw_data(); };
    once();  // warm-up
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      int reps = 0;
      const auto t0 = std::chrono::steady_clock::now();
      double s = 0;
      while (s < 0.02) {
        once();
        ++reps;
        s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      best = std::min(best, s / reps);
    }
    return best;
  };
  const double f32 = rate(false), bf16 = rate(true);
  omp_set_num_threads(threads);
  return f32 / bf16;
}

std::vector<std::string> preset_names() { return {"h100-sxm-80gb", "a100-80gb", "cpu"}; }

std::string default_cpu_cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path base = xdg && *xdg ? fs::path(xdg) : fs::path(home && *home ? home : "/tmp") / ".cache";
  return (base / "athanor" / "cpu-cluster.yaml").string();
}

namespace {
CommProbe g_comm_probe = nullptr;

// α at `cores` ranks (each rank has a core) and at 2 × `cores` (oversubscribed), from the
// registered mpirun probe; false when there is none or it failed (the nominal 5 µs stays).
bool probe_latencies(Cluster& c) {
  if (!g_comm_probe) return false;
  const int n = std::max(2, c.cores);
  double a1 = 0, t1 = 0, fit = 0, t_fit = 0, over = 0, t_over = 0;
  if (!g_comm_probe(1, &a1, &t1) || !g_comm_probe(n, &fit, &t_fit) || !g_comm_probe(2 * n, &over, &t_over) || t1 <= 0) return false;
  c.intra.latency_s = fit;
  c.inter.latency_s = fit;
  c.latency_oversubscribed_s = std::max(fit, over);
  c.slowdown_at_cores = std::max(1.0, t_fit / t1);
  c.slowdown_at_2cores = std::max(c.slowdown_at_cores, t_over / t1);
  c.comm_probe = "mpirun";
  return true;
}

void write_cache(const Cluster& c, const std::string& cache_path) {
  std::error_code ec;
  fs::create_directories(fs::path(cache_path).parent_path(), ec);
  std::ofstream(cache_path) << "# this CPU, measured by athanor plan (delete to measure again)\n" << to_yaml(c);
}
}  // namespace

void set_comm_probe(CommProbe probe) { g_comm_probe = probe; }

double Cluster::rank_slowdown(int r) const {
  const double n = std::max(1, cores);
  if (slowdown_at_cores < 0 || slowdown_at_2cores < 0) return std::max<double>(r, n) / n;  // the cores shared evenly
  if (r <= 1) return 1;
  if (r <= n) return 1 + (slowdown_at_cores - 1) * (r - 1) / std::max(1.0, n - 1);
  if (r <= 2 * n) return slowdown_at_cores + (slowdown_at_2cores - slowdown_at_cores) * (r - n) / n;
  return slowdown_at_2cores * r / (2 * n);
}

Cluster cpu_cluster(const std::string& cache_path) {
  if (!cache_path.empty() && fs::exists(cache_path)) {
    Cluster c = from_yaml(YAML::LoadFile(cache_path), cache_path);
    // A cache from before the latency probe: measure the latencies now, keep the rest.
    if (c.comm_probe.empty() && probe_latencies(c)) write_cache(c, cache_path);
    c.source = "this CPU, measured once (cached in " + cache_path + ")";
    return c;
  }
  Cluster c;
  c.name = "cpu";
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Ranks on this machine are processes sharing its cores (mpirun --oversubscribe): up to
  // 8 "devices", sharing the node's compute and, in equal parts, its memory.
  c.devices_per_node = 8;
  c.shared_compute = true;
  c.cores = cores;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  c.memory_bytes = static_cast<double>(pages) * static_cast<double>(page) / c.devices_per_node;
  c.peak_f32 = cpu::cpu_peak(DType::f32, cores).gflops * 1e9;
  c.peak_bf16 = cpu::cpu_peak(DType::bf16, cores).gflops * 1e9;
  c.peak_f16 = c.peak_f32;  // athanor computes f16 GEMMs in f32 on the CPU
  // The efficiency from a probe: one thread (a rank's share under mpirun) multiplying
  // 256 x 256 matrices, over one core's peak; bf16 separately (its peak may be AMX's, which
  // small GEMMs do not reach). --calibrate replaces it with a real step's.
  c.efficiency = std::min(1.0, gemm_probe(DType::f32) / (c.peak_f32 / cores));
  c.efficiency_lowp = std::min(1.0, gemm_probe(DType::bf16) / (c.peak_bf16 / cores));
  const double bw = memcpy_bytes_per_s();
  c.intra = {bw, 5e-6};  // Open MPI's shared-memory transport: a copy in, a copy out per message
  c.inter = c.intra;
  probe_latencies(c);  // α measured under mpirun when the CLI registered its probe
  if (!cache_path.empty()) write_cache(c, cache_path);
  c.source = "this CPU, measured now" + (cache_path.empty() ? std::string() : " (cached in " + cache_path + ")");
  return c;
}

Cluster load_cluster(const std::string& name_or_file, int nodes) {
  ATH_CHECK(nodes >= 0, "plan", "--nodes must be >= 1, got ", nodes, Hint{"the number of nodes of the cluster"});
  Cluster c;
  if (name_or_file == "h100-sxm-80gb" || name_or_file == "h100") {
    c = h100();
  } else if (name_or_file == "a100-80gb" || name_or_file == "a100") {
    c = a100();
  } else if (name_or_file == "cpu") {
    c = cpu_cluster(default_cpu_cache_path());
  } else if (fs::exists(name_or_file) && fs::is_regular_file(name_or_file)) {
    YAML::Node y;
    try {
      y = YAML::LoadFile(name_or_file);
    } catch (const YAML::Exception& e) {
      ATH_FAIL("plan", name_or_file, ": not valid YAML: ", e.what(), Hint{"see include/athanor/plan/cluster.h"});
    }
    c = from_yaml(y, name_or_file);
  } else {
    std::string near;
    for (const auto& p : preset_names())
      if (near.empty() || edit_distance(name_or_file, p) < edit_distance(name_or_file, near)) near = p;
    ATH_FAIL("plan", "unknown cluster preset '", name_or_file, "' (and no such file)",
             Hint{"did you mean '" + near + "'? presets: h100-sxm-80gb, a100-80gb, cpu; or give a cluster YAML file"});
  }
  if (nodes > 0) c.nodes = nodes;
  return c;
}

}  // namespace athanor::plan
