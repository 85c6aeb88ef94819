// `athanor lr-find CONFIG` and `athanor batch-find CONFIG`: settings found by running real
// training steps (train/tuning.h); both write their result into the run directory and
// redraw its report.html.
#include <iostream>
#include <memory>

#include "athanor/train/config.h"
#include "athanor/train/tuning.h"
#include "command_registry.h"

namespace {
struct LrFindArgs {
  std::string config;
  std::vector<std::string> overrides;
  athanor::train::LrFindOptions o;
};
const bool lr_registered = athanor::cli::register_command(
    {"lr-find", "Learning-rate range test: loss against an exponentially growing lr; suggests an lr", [](CLI::App& sub) {
       auto a = std::make_shared<LrFindArgs>();
       sub.add_option("config", a->config, "YAML config (see examples/*.yaml)")->required();
       sub.add_option("overrides", a->overrides, "key.path=value overrides");
       sub.add_option("--steps", a->o.steps, "steps of the test (default 100)");
       sub.add_option("--min-lr", a->o.min_lr, "lr of the first step (default 1e-7)");
       sub.add_option("--max-lr", a->o.max_lr, "lr of the last step (default 10)");
       return [a] {
         const auto cfg = athanor::train::Config::load(a->config, a->overrides);
         const auto r = athanor::train::lr_find(cfg, a->o, [](const std::string& s) { std::cout << s << std::flush; });
         std::cout << "suggested lr: " << r.suggested_lr << "\n";
         return 0;
       };
     }});

struct BatchFindArgs {
  std::string config, memory;
  std::vector<std::string> overrides;
  athanor::train::BatchFindOptions o;
};
const bool batch_registered = athanor::cli::register_command(
    {"batch-find", "Largest micro-batch whose training step fits a memory budget, and the accumulation for a global batch",
     [](CLI::App& sub) {
       auto a = std::make_shared<BatchFindArgs>();
       sub.add_option("config", a->config, "YAML config (see examples/*.yaml)")->required();
       sub.add_option("overrides", a->overrides, "key.path=value overrides");
       sub.add_option("--memory", a->memory, "memory budget, e.g. 16GiB (default: this machine's memory)");
       sub.add_option("--max-batch", a->o.max_batch, "largest micro-batch to try (default 4096)");
       sub.add_option("--global-batch", a->o.target_global_batch, "global batch to reach (default: the config's)");
       return [a] {
         if (!a->memory.empty()) a->o.memory_bytes = athanor::train::parse_bytes(a->memory);
         const auto cfg = athanor::train::Config::load(a->config, a->overrides);
         const auto r = athanor::train::batch_find(cfg, a->o, [](const std::string& s) { std::cout << s << std::flush; });
         std::cout << "micro-batch: " << r.max_micro_batch << ", accum_steps: " << r.accum_steps << "\n";
         return r.max_micro_batch > 0 ? 0 : 1;
       };
     }});
}  // namespace
