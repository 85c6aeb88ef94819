// The learning-rate range test (train/tuning.h).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "athanor/observe/report.h"
#include "athanor/train/trainer.h"
#include "athanor/train/tuning.h"

namespace athanor::train {
namespace fs = std::filesystem;

namespace {
std::string fmt(double v) {
  std::ostringstream o;
  o << std::setprecision(3) << v;
  return o.str();
}
}  // namespace

LrFindResult lr_find(const Config& config, const LrFindOptions& o, const std::function<void(const std::string&)>& out_fn) {
  ATH_CHECK(o.steps >= 5, "lr-find", "--steps must be at least 5, got ", o.steps, Hint{"100 is the usual length"});
  ATH_CHECK(o.min_lr > 0 && o.max_lr > o.min_lr, "lr-find", "the lr range must satisfy 0 < --min-lr < --max-lr, got ", o.min_lr,
            " .. ", o.max_lr, Hint{"e.g. --min-lr 1e-7 --max-lr 10"});
  ATH_CHECK(o.smoothing >= 0 && o.smoothing < 1, "lr-find", "the smoothing factor must be in [0, 1), got ", o.smoothing);
  auto out = [&](const std::string& s) { if (out_fn) out_fn(s); };
  // The config's model, data and optimizer; the schedule is the test's own (exponential, no
  // warm-up), and nothing is written but the result.
  Config c = config;
  c.set("schedule.warmup_steps", int64_t{0});
  c.set("schedule.decay", std::string("constant"));
  c.set("trainer.max_steps", o.steps);
  c.set("trainer.epochs", int64_t{0});
  c.set("trainer.eval_every", int64_t{0});
  c.set("health.nonfinite_policy", std::string("skip"));  // a non-finite loss ends the test, not the program
  c.set("health.diagnose_nonfinite", false);
  c.set("trainer.log_every", int64_t{1});  // each step's loss is read (a GPU step reads it only when logged)
  c.set("observe.layer_stats", false);
  c.set("resume", std::string("off"));
  LrFindResult r;
  r.config_lr = config.get_float("optimizer.lr");
  Trainer t(c, /*write_run_files=*/false);
  t.set_output([](const std::string&) {});
  auto& groups = t.optimizer().param_groups();
  std::vector<double> ratio;  // each group's lr relative to the first (e.g. lr scaling applies to all)
  for (const auto& g : groups) ratio.push_back(groups.front().base_lr > 0 ? g.base_lr / groups.front().base_lr : 1.0);
  double avg = 0, best = std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < o.steps; ++i) {
    const double lr = o.min_lr * std::pow(o.max_lr / o.min_lr, static_cast<double>(i) / static_cast<double>(o.steps - 1));
    for (size_t g = 0; g < groups.size(); ++g) groups[g].base_lr = lr * ratio[g];
    t.scheduler().set_step(t.scheduler().current_step());  // the groups' lr from the new base
    if (!t.train_step()) break;
    const double loss = t.history().back().loss;
    r.lrs.push_back(lr);
    r.losses.push_back(loss);
    if (!std::isfinite(loss)) {
      r.smoothed.push_back(loss);
      r.diverged_lr = lr;
      break;
    }
    avg = o.smoothing * avg + (1 - o.smoothing) * loss;
    const double smooth = avg / (1 - std::pow(o.smoothing, static_cast<double>(i + 1)));
    r.smoothed.push_back(smooth);
    best = std::min(best, smooth);
    if (i > 0 && smooth > o.diverge_factor * best) {
      r.diverged_lr = lr;
      break;
    }
    if (i % 10 == 0) out("lr-find step " + std::to_string(i + 1) + "/" + std::to_string(o.steps) + ": lr " + fmt(lr) + ", loss " + fmt(loss) + "\n");
  }
  ATH_CHECK(r.lrs.size() >= 5, "lr-find", "the loss was not finite from the start (", r.lrs.size(), " steps ran)",
            Hint{"lower --min-lr, or check the data and model with a short `athanor train` first"});
  // Steepest descent of the smoothed loss against log(lr): central differences, leaving out
  // the first tenth (the smoothing's start-up) and the points after the lowest loss.
  size_t lowest = 0;
  for (size_t i = 0; i < r.smoothed.size(); ++i)
    if (std::isfinite(r.smoothed[i]) && r.smoothed[i] < r.smoothed[lowest]) lowest = i;
  double steepest = 0;
  const size_t from = std::max<size_t>(1, r.smoothed.size() / 10);
  for (size_t i = from; i + 1 < r.smoothed.size() && i <= lowest; ++i) {
    const double slope = (r.smoothed[i + 1] - r.smoothed[i - 1]) / (std::log(r.lrs[i + 1]) - std::log(r.lrs[i - 1]));
    if (std::isfinite(slope) && slope < steepest) steepest = slope, r.steepest_lr = r.lrs[i];
  }
  if (r.steepest_lr <= 0) r.steepest_lr = r.lrs[lowest];
  if (r.diverged_lr > 0 && r.diverged_lr / 10 < r.steepest_lr) {
    r.suggested_lr = r.diverged_lr / 10;
    r.rule = "a tenth of the lr where the loss diverged (" + fmt(r.diverged_lr) + "), below the steepest descent (" + fmt(r.steepest_lr) + ")";
  } else {
    r.suggested_lr = r.steepest_lr;
    r.rule = "the steepest descent of the smoothed loss" +
             (r.diverged_lr > 0 ? ", below a tenth of where the loss diverged (" + fmt(r.diverged_lr) + ")"
                                : std::string(" (the loss did not diverge up to ") + fmt(r.lrs.back()) + ")");
  }
  out("lr-find: steepest descent at lr " + fmt(r.steepest_lr) +
      (r.diverged_lr > 0 ? ", diverged at " + fmt(r.diverged_lr) : std::string(", no divergence")) + "; suggested lr " +
      fmt(r.suggested_lr) + " (" + r.rule + "); the config has " + fmt(r.config_lr) + "\n");
  // Only the process that writes run files writes the result (rank 0 under mpirun).
  if (t.rank() == 0) {
    const fs::path dir = fs::path(config.get_string("out_dir")) / config.get_string("name");
    fs::create_directories(dir);
    nlohmann::ordered_json j;
    j["config"] = config.source();
    j["steps"] = r.lrs.size();
    j["min_lr"] = o.min_lr;
    j["max_lr"] = o.max_lr;
    j["smoothing"] = o.smoothing;
    j["steepest_lr"] = r.steepest_lr;
    j["diverged_lr"] = r.diverged_lr > 0 ? nlohmann::ordered_json(r.diverged_lr) : nlohmann::ordered_json(nullptr);
    j["suggested_lr"] = r.suggested_lr;
    j["suggestion_rule"] = r.rule;
    j["config_lr"] = r.config_lr;
    nlohmann::ordered_json pts = nlohmann::ordered_json::array();
    for (size_t i = 0; i < r.lrs.size(); ++i) {
      auto num = [](double v) { return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr); };
      pts.push_back({{"lr", r.lrs[i]}, {"loss", num(r.losses[i])}, {"smoothed", num(r.smoothed[i])}});
    }
    j["points"] = pts;
    r.json_path = (dir / "lr_find.json").string();
    std::ofstream(r.json_path) << j.dump(2) << "\n";
    out("wrote " + r.json_path + "; report: " + observe::write_report(dir.string()) + "\n");
  }
  return r;
}

}  // namespace athanor::train
