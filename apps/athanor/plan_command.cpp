// `athanor plan CONFIG --cluster PRESET|FILE [--nodes N] [--global-batch B] [--top K] [--write best.yaml]`:
// the parallel layout of a training config's model on a cluster (athanor/plan/search.h).
// `--evaluate [--world N]` predicts the config's own layout (dist.tp/pp/zero_stage, trainer.*)
// instead of searching; with --json, one JSON object (per-stage bytes by category, step time).
#include <yaml-cpp/yaml.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"
#include "athanor/core/rng.h"
#include "athanor/dist/process_group.h"
#include "athanor/ops/linalg.h"
#include "athanor/plan/search.h"
#include "athanor/train/config.h"
#include "athanor/train/trainer.h"
#include "command_registry.h"

namespace athanor::cli {
namespace {

struct PlanArgs {
  std::string config, cluster, write;
  std::vector<std::string> overrides;
  int nodes = 0, top = 5, world = 0;
  int64_t global_batch = 0;
  bool evaluate = false, json = false, calibrate = false;
  int steps = 4;
};

// The plain values the planner needs, from a training config (GPTs and Llamas are planned).
plan::TrainSpec spec_from_config(const train::Config& c) {
  const std::string type = c.get_string("model.type");
  ATH_CHECK(type == "gpt" || type == "llama", "plan", c.source(), ": model.type is ", type,
            ": athanor plan lays out the transformer language models (gpt, llama)",
            Hint{"use a GPT or Llama config, e.g. examples/gpt2-124m.yaml or examples/llama-char.yaml"});
  const std::string name = c.get_string("name").empty() ? c.source() : c.get_string("name");
  int64_t vocab = c.get_int("model.vocab_size");
  if (vocab == 0) vocab = c.get_string("data.type") == "text" && c.get_string("data.tokenizer") == "gpt2" ? 50257 : 256;
  plan::TrainSpec s;
  if (type == "llama") {
    nn::LlamaConfig lc = train::llama_config(c);  // the trainer's reading of the keys (defaults included)
    lc.vocab_size = vocab;
    s.model = plan::llama_model(lc, name);
  } else {
    s.model.name = name;
    s.model.n_layer = c.get_int("model.n_layer");
    s.model.n_head = c.get_int("model.n_head");
    s.model.n_embd = c.get_int("model.n_embd");
    s.model.seq = c.get_int("model.block_size");
    s.model.bias = c.get_bool("model.bias");
    s.model.dropout = c.get_float("model.dropout");
    s.model.vocab = vocab;
  }
  plan::check_model(s.model);
  s.precision = plan::parse_precision(c.get_string("trainer.precision"));
  s.optimizer = c.get_string("optimizer.type");
  s.momentum = c.get_float("optimizer.momentum");
  s.packed_weights = c.get_bool("optimizer.packed_weights");
  s.vocab_pad_multiple = c.get_int("dist.vocab_pad_multiple");
  s.bucket_mb = c.get_float("dist.bucket_mb");
  s.micro_batch = c.get_int("trainer.batch_size");
  s.accum = c.get_int("trainer.accum_steps");
  return s;
}

plan::Layout layout_from_config(const train::Config& c, int world) {
  plan::Layout l;
  l.tp = static_cast<int>(c.get_int("dist.tp"));
  l.pp = static_cast<int>(c.get_int("dist.pp"));
  ATH_CHECK(world % (l.tp * l.pp) == 0, "plan", "--world ", world, " does not divide by dist.tp x dist.pp = ", l.tp * l.pp,
            Hint{"the world is dp x tp x pp processes"});
  l.dp = world / (l.tp * l.pp);
  l.virtual_stages = static_cast<int>(c.get_int("dist.virtual_stages"));
  l.schedule = plan::parse_schedule(c.get_string("dist.pp_schedule"));
  l.zero = static_cast<int>(c.get_int("dist.zero_stage"));
  l.micro_batch = c.get_int("trainer.batch_size");
  l.accum = c.get_int("trainer.accum_steps");
  l.recompute = c.get_bool("model.gradient_checkpointing");
  l.sequence_parallel = c.get_bool("dist.sequence_parallel");
  return l;
}

nlohmann::json candidate_json(const plan::Candidate& cand) {
  nlohmann::json j;
  j["layout"] = cand.layout.str();
  j["peak_bytes"] = cand.peak;
  j["worst_stage"] = cand.worst_stage;
  j["step_s"] = cand.time.total;
  j["tokens_per_s"] = cand.time.tokens_per_s;
  j["mfu"] = cand.time.mfu;
  j["rejected"] = cand.rejected;
  for (const auto& s : cand.stages)
    j["stages"].push_back({{"stage", s.stage},        {"parameter", s.params},     {"gradient", s.grads},
                           {"optimizer_state", s.optimizer}, {"activation", s.activations}, {"workspace", s.workspace},
                           {"packed_weights", s.derived},    {"comm", s.comm},            {"peak", s.peak()},
                           {"in_flight", s.in_flight}});
  return j;
}

// The config with the layout's keys set: `athanor train` runs it as it is (under mpirun -np world).
void write_best(const PlanArgs& a, const plan::TrainSpec& spec, const plan::Layout& l) {
  YAML::Node y = YAML::LoadFile(a.config);
  y["trainer"]["batch_size"] = l.micro_batch;
  y["trainer"]["accum_steps"] = l.accum;
  y["model"]["gradient_checkpointing"] = l.recompute;
  y["dist"]["tp"] = l.tp;
  y["dist"]["pp"] = l.pp;
  y["dist"]["zero_stage"] = l.zero;
  y["dist"]["sequence_parallel"] = l.sequence_parallel;
  if (l.pp > 1) {
    y["dist"]["pp_schedule"] = std::string(plan::schedule_name(l.schedule));
    y["dist"]["virtual_stages"] = l.virtual_stages;
  } else {
    y["dist"].remove("pp_schedule");
    y["dist"].remove("virtual_stages");
    y["dist"].remove("pp_layers");
  }
  std::ofstream f(a.write);
  ATH_CHECK(f.good(), "plan", "cannot write '", a.write, "'", Hint{"check that the directory exists and is writable"});
  f << "# written by athanor plan from " << a.config << " for " << a.cluster << ": " << l.str() << "\n"
    << "#   mpirun -np " << l.world() << " athanor train " << a.write << "\n"
    << YAML::Dump(y) << "\n";
  (void)spec;
}

// --calibrate: trains the best layout for a few steps on this machine (under mpirun), then
// replaces the cluster's efficiency with the measured one and scales the memory model by the
// measured peak over the predicted (cached with the CPU's figures for later plans).
plan::Cluster calibrate(const PlanArgs& a, const plan::TrainSpec& spec, plan::Cluster cluster, const plan::Candidate& best) {
  namespace fs = std::filesystem;
  ATH_CHECK(cluster.shared_compute, "plan", "--calibrate trains on this machine, but the cluster is ", cluster.name,
            Hint{"use --cluster cpu with --calibrate"});
  const fs::path dir = fs::temp_directory_path() / ("athanor_calibrate_" + std::to_string(getpid()));
  fs::create_directories(dir);
  PlanArgs w = a;
  w.write = (dir / "calibrate.yaml").string();
  write_best(w, spec, best.layout);
  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  const int np = best.layout.world();
  std::ostringstream cmd;
  cmd << "OMP_NUM_THREADS=1 ";
  if (np > 1) cmd << "mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS -np " << np << " ";
  cmd << "'" << exe << "' train '" << w.write << "' trainer.max_steps=" << a.steps
      << " trainer.eval_every=0 trainer.eval_batches=1 trainer.sample_tokens=1 trainer.log_every=1 checkpoint.every=0"
      << " observe.report=false observe.tensorboard=false name=calibrate out_dir='" << dir.string() << "' > '"
      << (dir / "train.log").string() << "' 2>&1";
  std::cout << "calibrating: " << best.layout.str() << ", " << a.steps << " steps (" << (np > 1 ? "mpirun -np " + std::to_string(np) : "1 process") << ")\n";
  const int rc = std::system(cmd.str().c_str());
  ATH_CHECK(rc == 0, "plan", "--calibrate: the training run failed (exit status ", rc, "); its log is ", (dir / "train.log").string(),
            Hint{"run the command by hand to see why: " + cmd.str()});
  std::ifstream mem_file(dir / "calibrate" / "memory_ranks.json");
  ATH_CHECK(mem_file.good(), "plan", "--calibrate: the run wrote no memory_ranks.json", Hint{"see " + (dir / "train.log").string()});
  const nlohmann::json mem = nlohmann::json::parse(mem_file);
  std::vector<double> measured(best.stages.size(), 0.0);
  for (const auto& r : mem["ranks"]) {
    const int stage = r["pp"].get<int>();
    measured[stage] = std::max(measured[stage], r["peak_total"].get<double>());
  }
  std::vector<double> steps;
  std::ifstream metrics(dir / "calibrate" / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    if (!line.empty()) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("step_s") && j["step_s"].is_number()) steps.push_back(j["step_s"].get<double>());  // not the evaluation records
    }
  ATH_CHECK(!steps.empty(), "plan", "--calibrate: the run logged no steps", Hint{"see " + (dir / "train.log").string()});
  if (steps.size() > 1) steps.erase(steps.begin());  // the first step warms up
  std::sort(steps.begin(), steps.end());
  const double step = steps[steps.size() / 2];
  double ratio = 0;
  for (size_t s = 0; s < measured.size(); ++s) ratio = std::max(ratio, measured[s] / best.stages[s].peak());
  const double fixed = best.time.dp_comm + best.time.tp_comm + best.time.pp_comm;
  const double scaled = best.time.compute + best.time.bubble;
  const double was = cluster.efficiency_for(spec.precision);
  const double eff = std::clamp(was * scaled / std::max(step - fixed, 1e-9 * scaled), 1e-4, 1.0);
  std::cout << "  step: predicted " << best.time.total << " s, measured " << step << " s (median) -> efficiency "
            << was << " -> " << eff << "\n  peak: predicted " << plan::format_bytes(best.peak) << ", measured "
            << plan::format_bytes(*std::max_element(measured.begin(), measured.end())) << " -> memory x" << ratio << "\n";
  (spec.precision == plan::Precision::f32 ? cluster.efficiency : cluster.efficiency_lowp) = eff;
  cluster.memory_calibration = ratio;
  if (a.cluster == "cpu") {
    std::ofstream(plan::default_cpu_cache_path()) << "# this CPU, calibrated by athanor plan --calibrate\n" << plan::to_yaml(cluster);
    std::cout << "  saved in " << plan::default_cpu_cache_path() << "\n";
  }
  fs::remove_all(dir);
  return cluster;
}

bool mpirun_comm_probe(int ranks, double* alpha_s, double* compute_s);  // below

int run_plan(const PlanArgs& a) {
  plan::set_comm_probe(&mpirun_comm_probe);
  const train::Config cfg = train::Config::load(a.config, a.overrides);
  plan::TrainSpec spec = spec_from_config(cfg);
  plan::Cluster cluster = plan::load_cluster(a.cluster, a.nodes);
  if (cluster.shared_compute && spec.precision != plan::Precision::f32) {
    // This CPU: the low-precision efficiency at the model's own GEMM shape (a micro-batch's tokens
    // by the MLP's h × 4h, or the Llama's h × intermediate), relative to the f32 efficiency the cluster holds.
    const int64_t mlp = spec.model.llama() ? spec.model.intermediate : 4 * spec.model.n_embd;
    const double speedup = plan::lowp_gemm_speedup(spec.micro_batch * spec.model.seq, spec.model.n_embd, mlp);
    cluster.efficiency_lowp = std::min(1.0, cluster.efficiency * speedup * cluster.peak(plan::Precision::f32) / cluster.peak(spec.precision));
  }
  spec.packed_weights = spec.packed_weights && cluster.shared_compute;  // GEMM-layout copies are the CPU kernels'
  if (a.evaluate) {
    const int world = a.world > 0 ? a.world : cluster.devices();
    const plan::Layout l = layout_from_config(cfg, world);
    plan::check_layout(spec, l);
    const plan::Candidate cand = plan::evaluate(spec, l, cluster);
    if (a.json) {
      std::cout << candidate_json(cand).dump() << "\n";
    } else {
      std::cout << spec.model.name << " as configured: " << l.str() << " on " << cluster.name << "\n"
                << plan::format_memory(spec, cand) << "  step " << cand.time.total << " s, " << cand.time.tokens_per_s
                << " tokens/s, MFU " << 100 * cand.time.mfu << "%\n"
                << (cand.rejected.empty() ? std::string("  fits\n") : "  " + cand.rejected + "\n");
    }
    return cand.rejected.empty() ? 0 : 2;
  }
  plan::SearchOptions o;
  o.global_batch = a.global_batch;
  o.top = a.top;
  plan::PlanResult r = plan::search(spec, cluster, o);
  if (a.calibrate) {
    const plan::Cluster calibrated = calibrate(a, spec, cluster, r.ranked.front());
    r = plan::search(spec, calibrated, o);
    std::cout << "\nwith the measurements:\n" << plan::format_plan(spec, calibrated, r);
  } else {
    std::cout << plan::format_plan(spec, cluster, r);
  }
  if (!a.write.empty()) {
    write_best(a, spec, r.ranked.front().layout);
    std::cout << "wrote " << a.write << " (mpirun -np " << r.ranked.front().layout.world() << " athanor train " << a.write << ")\n";
  }
  return 0;
}

// `athanor plan-probe` under mpirun: α of this node's ranks as training sees it. Each rank
// alternates ~0.3 ms of GEMMs with a 1-element all-reduce (a step's compute between its
// collectives); α = (time per iteration − the same compute alone) / 2(n−1), the ring's hops
// (time_model.h). With more ranks than cores this includes waiting for descheduled peers.
int run_comm_probe() {
  auto world = dist::init_from_mpi();
  NoGradGuard ng;
  const int n = world->size();
  Generator gen(7);
  Tensor a = randn({64, 64}, {}, gen), b = randn({64, 64}, {}, gen), one = full({1}, 1.0);
  auto compute = [&] {
    for (int i = 0; i < 16; ++i) (void)matmul(a, b).raw_data();
  };
  auto per_iter = [&](bool reduce, int iters) {
    world->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      compute();
      if (reduce) world->all_reduce(one);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  };
  per_iter(true, 20);  // warm-up
  // Five interleaved pairs (the load of a shared machine drifts alike over both), medians.
  std::vector<double> alone_s, mixed_s;
  for (int r = 0; r < 5; ++r) {
    alone_s.push_back(per_iter(false, 100));
    if (n > 1) mixed_s.push_back(per_iter(true, 100));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double alone = median(alone_s);
  const double alpha = n > 1 ? std::max(0.0, median(mixed_s) - alone) / (2.0 * (n - 1)) : 0.0;
  Tensor t = from_vector(std::vector<double>{alpha, alone}, {2}, TensorOptions(DType::f64));
  world->all_reduce(t, dist::ReduceOp::max);  // the slowest rank's: a collective waits for it
  if (world->rank() == 0) std::printf("alpha_s %.9g compute_s %.9g\n", t.data_ptr<double>()[0], t.data_ptr<double>()[1]);
  dist::finalize();
  return 0;
}

// The planner's CommProbe: runs `athanor plan-probe` under mpirun with `ranks` processes.
bool mpirun_comm_probe(int ranks, double* alpha_s, double* compute_s) {
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec || std::system("command -v mpirun > /dev/null 2>&1") != 0) return false;
  const std::string cmd = "OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root --mca btl_vader_single_copy_mechanism none "
                          "-x OMP_NUM_THREADS -np " + std::to_string(ranks) + " '" + self + "' plan-probe 2>/dev/null";
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) return false;
  bool got = false;
  char line[256];
  while (std::fgets(line, sizeof line, p))
    if (!got && std::sscanf(line, "alpha_s %lf compute_s %lf", alpha_s, compute_s) == 2) got = true;
  return pclose(p) == 0 && got;
}

const bool registered_probe = register_command(
    {"plan-probe", "Measure the collective latency of this node's ranks (run under mpirun; athanor plan --cluster cpu runs it once)",
     [](CLI::App&) { return [] { return run_comm_probe(); }; }});

const bool registered = register_command(
    {"plan", "Plan the parallel layout (dp x tp x pp, ZeRO, micro-batch, recompute) of a GPT or Llama config on a cluster",
     [](CLI::App& sub) {
       auto a = std::make_shared<PlanArgs>();
       sub.add_option("config", a->config, "training config (YAML)")->required();
       sub.add_option("overrides", a->overrides, "key.path=value overrides of the config");
       sub.add_option("--cluster", a->cluster, "preset (h100-sxm-80gb, a100-80gb, cpu) or a cluster YAML file")->required();
       sub.add_option("--nodes", a->nodes, "nodes of the cluster (default: the preset's or file's)");
       sub.add_option("--global-batch", a->global_batch, "samples per optimizer step (default: the config's batch_size x accum_steps)");
       sub.add_option("--top", a->top, "layouts to list (default 5)");
       sub.add_option("--write", a->write, "write the best layout as a training config");
       sub.add_flag("--evaluate", a->evaluate, "predict the config's own layout instead of searching");
       sub.add_option("--world", a->world, "with --evaluate: processes (default: the cluster's devices)");
       sub.add_flag("--json", a->json, "with --evaluate: one JSON object");
       sub.add_flag("--calibrate", a->calibrate, "train the best layout a few steps here (--cluster cpu) and plan again with the measured efficiency and memory");
       sub.add_option("--steps", a->steps, "with --calibrate: steps to train (default 4)");
       return [a] { return run_plan(*a); };
     }});
}  // namespace
}  // namespace athanor::cli
