// The micro-batch search (train/tuning.h).
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "athanor/core/allocator.h"
#include "athanor/observe/report.h"
#include "athanor/train/trainer.h"
#include "athanor/train/tuning.h"

namespace athanor::train {
namespace fs = std::filesystem;

double parse_bytes(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    used = 0;
  }
  std::string unit = text.substr(used);
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  static const std::pair<const char*, double> units[] = {
      {"", 1},           {"b", 1},           {"k", 1e3},         {"kb", 1e3},      {"kib", 1024.0},     {"m", 1e6},
      {"mb", 1e6},       {"mib", 1048576.0}, {"g", 1e9},         {"gb", 1e9},      {"gib", 1073741824.0}, {"t", 1e12},
      {"tb", 1e12},      {"tib", 1099511627776.0}};
  for (const auto& [name, mult] : units)
    if (used > 0 && unit == name && v > 0) return v * mult;
  ATH_FAIL("batch-find", "cannot read the memory size '", text, "'", Hint{"write a number and a unit, e.g. 16GiB, 512MiB or 2GB"});
}

namespace {
std::string mib(double b) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << b / 1048576.0 << " MiB";
  return o.str();
}
}  // namespace

BatchFindResult batch_find(const Config& config, const BatchFindOptions& o, const std::function<void(const std::string&)>& out_fn) {
  auto out = [&](const std::string& s) { if (out_fn) out_fn(s); };
  ATH_CHECK(o.max_batch >= 1, "batch-find", "--max-batch must be >= 1, got ", o.max_batch);
  ATH_CHECK(o.steps_per_probe >= 1, "batch-find", "steps per probe must be >= 1, got ", o.steps_per_probe);
  BatchFindResult r;
  r.memory_budget = o.memory_bytes > 0 ? o.memory_bytes
                                       : static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  int rank = 0;
  // One probe: a fresh trainer at micro-batch b, a few real steps, the allocator's peak.
  auto probe = [&](int64_t b) {
    BatchProbe p;
    p.batch = b;
    try {
      Config c = config;
      c.set("trainer.batch_size", b);
      c.set("trainer.accum_steps", int64_t{1});
      c.set("trainer.max_steps", o.steps_per_probe);
      c.set("trainer.epochs", int64_t{0});
      c.set("trainer.eval_every", int64_t{0});
      c.set("schedule.warmup_steps", int64_t{0});
      c.set("schedule.decay", std::string("constant"));
      c.set("health.nonfinite_policy", std::string("skip"));
      c.set("observe.layer_stats", false);
      c.set("resume", std::string("off"));
      Trainer t(c, /*write_run_files=*/false);
      t.set_output([](const std::string&) {});
      r.world_size = t.world_size();
      rank = t.rank();
      double peak = 0;
      for (int64_t s = 0; s < o.steps_per_probe && t.train_step(); ++s) {
        peak = std::max(peak, static_cast<double>(Allocator::cpu().stats().peak_total));
        p.throughput = t.history().back().throughput;
      }
      p.peak_bytes = peak;
      p.fits = peak <= r.memory_budget;
    } catch (const Error& e) {  // out of memory, or a batch the data cannot fill
      p.fits = false;
      p.note = e.what();
      if (const auto nl = p.note.find('\n'); nl != std::string::npos) p.note.resize(nl);
    }
    out("batch-find: micro-batch " + std::to_string(b) + ": peak " + mib(p.peak_bytes) + (p.fits ? " fits" : " does not fit") +
        (p.note.empty() ? "" : " (" + p.note + ")") + "\n");
    r.probes.push_back(p);
    return p.fits;
  };
  int64_t good = 0, bad = 0;
  for (int64_t b = 1; b <= o.max_batch; b *= 2) {
    if (!probe(b)) {
      bad = b;
      break;
    }
    good = b;
    if (b > o.max_batch / 2) break;
  }
  if (good > 0 && bad == 0 && good < o.max_batch) {  // up to the cap
    if (probe(o.max_batch)) good = o.max_batch;
    else bad = o.max_batch;
  }
  while (good > 0 && bad > good + 1) {  // bisection between the last fit and the first miss
    const int64_t mid = good + (bad - good) / 2;
    if (probe(mid)) good = mid;
    else bad = mid;
  }
  r.max_micro_batch = good;
  r.target_global_batch = o.target_global_batch > 0
                              ? o.target_global_batch
                              : config.get_int("trainer.batch_size") * config.get_int("trainer.accum_steps") * r.world_size;
  if (good > 0) {
    const int64_t per_step = good * r.world_size;
    r.accum_steps = (r.target_global_batch + per_step - 1) / per_step;
    out("batch-find: the largest micro-batch within " + mib(r.memory_budget) + " is " + std::to_string(good) +
        "; a global batch of " + std::to_string(r.target_global_batch) + " takes trainer.accum_steps: " +
        std::to_string(r.accum_steps) + " (x " + std::to_string(r.world_size) + " ranks x micro-batch " + std::to_string(good) +
        " = " + std::to_string(r.accum_steps * per_step) + ")\n");
  } else {
    out("batch-find: not even a micro-batch of 1 fits in " + mib(r.memory_budget) + "\n");
  }
  if (rank == 0) {  // under mpirun, rank 0 writes
    const fs::path dir = fs::path(config.get_string("out_dir")) / config.get_string("name");
    fs::create_directories(dir);
    nlohmann::ordered_json j;
    j["config"] = config.source();
    j["memory_budget"] = r.memory_budget;
    j["max_micro_batch"] = r.max_micro_batch;
    j["target_global_batch"] = r.target_global_batch;
    j["accum_steps"] = r.accum_steps;
    j["world_size"] = r.world_size;
    nlohmann::ordered_json probes = nlohmann::ordered_json::array();
    for (const auto& p : r.probes)
      probes.push_back({{"batch", p.batch}, {"peak_bytes", p.peak_bytes}, {"fits", p.fits}, {"throughput", p.throughput}, {"note", p.note}});
    j["probes"] = probes;
    r.json_path = (dir / "batch_find.json").string();
    std::ofstream(r.json_path) << j.dump(2) << "\n";
    out("wrote " + r.json_path + "; report: " + observe::write_report(dir.string()) + "\n");
  }
  return r;
}

}  // namespace athanor::train
