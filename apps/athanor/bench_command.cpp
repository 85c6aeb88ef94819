// `athanor bench CONFIG [key=value…] [--steps N] [--warmup W] [--json] [--profile]`: times full
// training steps of a config (train/bench.h) and prints throughput, ms/step,
// MFU, page faults, system-allocator calls and peak memory by tag. Nothing is
// written to disk (no run directory); --json prints one object for scripts
// (bench/compare_pytorch.py).
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "athanor/train/bench.h"
#include "athanor/train/trainer.h"
#include "command_registry.h"

namespace athanor::cli {
namespace {

struct BenchArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t steps = 10, warmup = 3;
  double peak_gflops = 0;
  bool json = false;
  bool profile = false;
};

int bench(const BenchArgs& a) {
  std::vector<std::string> overrides = a.overrides;
  // The bench decides how many steps run; evaluation and sampling are not part of a step.
  overrides.push_back("trainer.epochs=0");
  overrides.push_back("trainer.max_steps=" + std::to_string(a.warmup + a.steps));
  if (a.profile) {  // the timed steps, op by op (on cuda with each op's device time)
    overrides.push_back("profile.enabled=true");
    overrides.push_back("profile.start_step=" + std::to_string(a.warmup + 1));
    overrides.push_back("profile.num_steps=" + std::to_string(a.steps));
  }
  train::Trainer trainer(train::Config::load(a.config_path, overrides), /*write_run_files=*/false);
  std::string profile;  // the profiler's table, printed after the result
  trainer.set_output([&](const std::string& s) {  // no progress lines inside the timing
    if (s.find("profile of steps") != std::string::npos) profile += s;
  });
  train::BenchOptions opts;
  opts.steps = a.steps;
  opts.warmup = a.warmup;
  opts.peak_gflops = a.peak_gflops;
  const train::BenchResult r = train::run_bench(trainer, opts);
  std::cout << (a.json ? r.json() + "\n" : r.text() + profile) << std::flush;
  if (a.json) std::cerr << profile;  // the JSON stays one object
  return 0;
}

const bool registered = register_command(
    {"bench", "Time training steps of a config: throughput, ms/step, MFU, page faults, memory by tag", [](CLI::App& sub) {
       auto args = std::make_shared<BenchArgs>();
       sub.add_option("config", args->config_path, "YAML config (see bench/configs/*.yaml)")->required();
       sub.add_option("overrides", args->overrides, "key.path=value overrides, e.g. trainer.precision=bf16");
       sub.add_option("--steps", args->steps, "timed steps (default 10)");
       sub.add_option("--warmup", args->warmup, "untimed warm-up steps first (default 3)");
       sub.add_option("--peak-gflops", args->peak_gflops, "MFU denominator (default: the CPU's theoretical peak for the precision, as `athanor --version` prints it)");
       sub.add_flag("--json", args->json, "print one JSON object instead of the report");
       sub.add_flag("--profile", args->profile,
                    "profile the timed steps and print the op table (host and, on cuda, device time per op)");
       return [args] { return bench(*args); };
     }});

}  // namespace
}  // namespace athanor::cli
