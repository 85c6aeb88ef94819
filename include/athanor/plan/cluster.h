#pragma once
// The machine a plan is for: devices per node and their memory and peak FLOP/s,
// and the links between them for the α-β communication model (a message of n bytes
// over a link takes α + n/β). A cluster is a preset (h100-sxm-80gb, a100-80gb, cpu)
// or a YAML file with the same keys:
//
//   name: my-cluster
//   devices_per_node: 8
//   nodes: 16
//   memory_gib: 80            # per device, usable by the framework
//   peak_tflops: {f32: 19.5, bf16: 312, f16: 312}
//   efficiency: 0.45          # achieved / peak on the model's GEMMs (a probe or --calibrate replaces it)
//   intra_node: {gbps: 300, latency_us: 3}   # GB/s per device, one direction (NVLink)
//   inter_node: {gbps: 25, latency_us: 5}    # GB/s per device (InfiniBand)
#include <string>
#include <vector>

#include "athanor/plan/spec.h"

namespace athanor::plan {

struct Link {
  double bytes_per_s = 0;  // β: per device, one direction
  double latency_s = 0;    // α: per message
};

struct Cluster {
  std::string name;
  std::string source;  // "preset", a file path, or how it was measured
  int devices_per_node = 1;
  int nodes = 1;
  double memory_bytes = 0;  // per device
  double peak_f32 = 0, peak_bf16 = 0, peak_f16 = 0;  // FLOP/s per device
  double efficiency = 0.5;        // achieved / peak on the model's GEMMs, f32
  double efficiency_lowp = -1;    // the same for bf16/f16 (< 0: as f32)
  double efficiency_for(Precision p) const { return p != Precision::f32 && efficiency_lowp > 0 ? efficiency_lowp : efficiency; }
  Link intra, inter;
  // Devices of a node share its cores (this CPU: ranks oversubscribe the cores, so one
  // rank's compute rate is the node's peak over the ranks on the node).
  bool shared_compute = false;
  // Measured peak over predicted peak, from `athanor plan --calibrate` (1 = the model as is).
  double memory_calibration = 1.0;
  // α between ranks when a node's ranks outnumber its cores (< 0: as the link's): a collective
  // then waits for descheduled peers. `comm_probe` says how the latencies were measured
  // ("mpirun": the CPU probe below; empty: nominal).
  double latency_oversubscribed_s = -1;
  std::string comm_probe;
  // shared_compute: how much slower one rank computes when `cores` (resp. 2 × `cores`) ranks
  // compute at once than when it runs alone (measured by the same probe; < 0: not measured,
  // then the ranks are taken to share the cores evenly). The cores a node's ranks get are not
  // always all of them: other work on the node takes its share.
  double slowdown_at_cores = -1, slowdown_at_2cores = -1;
  double rank_slowdown(int ranks_on_node) const;
  int cores = 1;  // shared_compute: the node's cores; a rank runs one thread (OMP_NUM_THREADS=1 under mpirun)
  int devices() const { return devices_per_node * nodes; }
  double peak(Precision p) const;  // per device
};

// The preset names, for --help and did-you-mean.
std::vector<std::string> preset_names();
// A preset by name or a YAML file by path; an unknown name that is not a file is an
// Error with the nearest preset name. `nodes` > 0 overrides the node count.
Cluster load_cluster(const std::string& name_or_file, int nodes = 0);
// This CPU as a cluster: the clock-based peak (backend/cpu/cpu_peak.h), a memcpy bandwidth
// for the shared-memory "links", measured once and cached in cache_path (empty: not cached).
Cluster cpu_cluster(const std::string& cache_path);
std::string default_cpu_cache_path();
// Measures α among `ranks` processes of this node under mpirun (the apps layer registers it:
// it launches the CLI itself); returns false when it cannot (no mpirun). The CPU cluster runs it
// once, at `cores` and at 2 × `cores` ranks, and caches the result; a cache written before the
// probe existed (no comm_probe key) is probed again.
// `alpha_s`: α; `compute_s`: the probe's compute per iteration, the slowest rank's.
using CommProbe = bool (*)(int ranks, double* alpha_s, double* compute_s);
void set_comm_probe(CommProbe probe);  // $XDG_CACHE_HOME or ~/.cache /athanor/cpu-cluster.yaml

// How much faster one thread runs an (m × k)·(k × n) GEMM in bf16 than in f32, with the casts
// from f32 autocast does per op: the model's own shapes, which a 256³ probe does not represent
// (small GEMMs, or a CPU without fast bf16, gain far less than the peak ratio).
double lowp_gemm_speedup(int64_t m, int64_t k, int64_t n);

std::string to_yaml(const Cluster& c);  // a cluster file load_cluster reads back

}  // namespace athanor::plan
