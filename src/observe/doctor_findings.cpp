// The doctor's run-level diagnosis (observe/doctor.h): from a run's records to causes,
// most likely first. Each rule says why its threshold is what it is; each cause absorbs
// the health events it explains (a NaN after a divergence is part of the divergence),
// and the events no cause explains are reported as they are.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "observe/doctor_run.h"

namespace athanor::observe::detail {
namespace {

std::string pct(double f) { return fmt(100 * f) + "%"; }

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const HealthEvent* first_event(const RunRecord& run, std::initializer_list<const char*> kinds) {
  for (const auto& e : run.events)
    for (const char* k : kinds)
      if (e.kind == k) return &e;
  return nullptr;
}

double detail_number(const HealthEvent& e, const std::string& key, double fallback) {
  auto it = e.details.find(key);
  if (it == e.details.end()) return fallback;
  try {
    return std::stod(it->second);
  } catch (...) {
    return fallback;
  }
}

void add_remedy(HealthEvent& f, const std::optional<Remedy>& r, bool is_fix) {
  if (!r) return;
  f.suggestions.push_back(r->text);
  if (is_fix) f.fix.insert(r->fix.begin(), r->fix.end());
}

// The lr of the logged step at or just before `step` (0 when unknown).
double lr_at(const RunRecord& run, int64_t step) {
  double lr = 0;
  for (const auto& m : run.steps) {
    if (m.step > step) break;
    if (std::isfinite(m.lr) && m.lr > 0) lr = m.lr;
  }
  return lr;
}

// The loss level at the end of the run: median of the last tenth of the logged steps
// (at least 3), or NaN when the last ones are not finite.
double final_level(const RunRecord& run) {
  const size_t n = run.steps.size();
  if (n == 0) return std::nan("");
  const size_t k = std::max<size_t>(3, n / 10);
  const size_t begin = n > k ? n - k : 0;
  if (!std::isfinite(run.steps.back().loss)) return std::nan("");
  return median_loss(run.steps, begin, n);
}

// Update-to-weight ratios of the weight matrices (ndim >= 2), per layer: the median over
// the statistics steps from `from_step` on.
std::vector<std::pair<std::string, double>> update_ratios(const RunRecord& run, int64_t from_step) {
  std::map<std::string, std::vector<double>> per;
  std::vector<std::string> order;
  for (const auto& m : run.steps) {
    if (m.step < from_step) continue;
    for (const auto& l : m.layers) {
      if (l.ndim < 2 || !(l.update_ratio >= 0) || !std::isfinite(l.update_ratio)) continue;
      if (!per.count(l.name)) order.push_back(l.name);
      per[l.name].push_back(l.update_ratio);
    }
  }
  std::vector<std::pair<std::string, double>> out;
  for (const auto& n : order) out.emplace_back(n, median(per[n]));
  return out;
}

std::string ratios_text(const std::vector<std::pair<std::string, double>>& r, size_t max_items = 12) {
  std::string s;
  for (size_t i = 0; i < r.size() && i < max_items; ++i) s += (i ? ", " : "") + r[i].first + " " + fmt(r[i].second);
  if (r.size() > max_items) s += " (+" + std::to_string(r.size() - max_items) + " more)";
  return s;
}

// The finding's rank: causes before the symptoms they produce. A corrupt sample or f16's
// range explains everything downstream; unnormalized inputs, dead or saturated units
// explain instability and flat losses; the optimizer settings come next; the run-level
// inefficiencies (overfitting, data, stragglers) last.
int priority(const std::string& kind, bool diverged) {
  // Units that die on the way to a NaN are part of the divergence, not its cause.
  if (diverged && kind == "dead_relus") return priority("lr_too_high", false) + 1;
  static const std::vector<std::string> order = {
      "bad_sample",          "scale_collapse", "inputs_not_normalized", "loss_at_chance", "dead_relus",
      "vanishing_gradients", "exploding_gradients", "lr_too_high",    "early_loss_spike", "lr_too_low",
      "batch_lr_not_scaled", "overfitting",    "data_starved",          "straggler"};
  const auto it = std::find(order.begin(), order.end(), kind);
  return it == order.end() ? static_cast<int>(order.size()) : static_cast<int>(it - order.begin());
}

struct Diagnosis {
  std::vector<HealthEvent> findings;
  std::set<std::string> explained;  // event kinds a finding accounts for
  bool diverged = false;            // the run went non-finite (lr_too_high from NaN/Inf)
  void add(HealthEvent f, std::initializer_list<const char*> explains) {
    explained.insert(f.kind);
    for (const char* k : explains) explained.insert(k);
    findings.push_back(std::move(f));
  }
};

const char* const kNonfiniteKinds[] = {"nan_origin", "nonfinite", "skipped_step", "rollback"};

bool has_nonfinite(const RunRecord& run) {
  for (const char* k : kNonfiniteKinds)
    if (first_event(run, {k})) return true;
  for (const auto& m : run.steps)
    if (!std::isfinite(m.loss)) return true;
  return false;
}

int64_t first_nonfinite_step(const RunRecord& run) {
  int64_t s = -1;
  for (const auto& e : run.events)
    for (const char* k : kNonfiniteKinds)
      if (e.kind == k && (s < 0 || e.step < s)) s = e.step;
  for (const auto& m : run.steps)
    if (!std::isfinite(m.loss) && (s < 0 || m.step < s)) s = m.step;
  return s;
}

void data_findings(const RunRecord& run, Diagnosis& d) {
  d.diverged = has_nonfinite(run);
  std::vector<const HealthEvent*> bad;
  for (const auto& e : run.events)
    if (e.kind == "bad_sample") bad.push_back(&e);
  if (!bad.empty()) {
    HealthEvent f = *bad.front();
    std::string all;
    for (const auto* e : bad) all += (all.empty() ? "" : "; ") + std::string("step ") + std::to_string(e->step) + ": " + e->details.at("sample_ids");
    f.details["sample_ids_by_step"] = all;
    if (f.severity == "error")
      f.message += ". Everything non-finite after it (the loss, the gradients, the first op's output) follows from this sample";
    d.add(f, {"nan_origin", "nonfinite", "skipped_step", "loss_spike", "grad_spike", "loss_rise", "exploding_gradients", "rollback"});
    d.diverged = false;  // the data's NaN, not the optimizer's
  }
  if (const HealthEvent* e = first_event(run, {"scale_collapse"}); e && run.settings.text("trainer.precision", "f16") == "f16") {
    HealthEvent f = *e;
    f.message += ". Values overflow f16's range (max 65504) in the forward or backward pass, so the scaler can only shrink the scale";
    d.add(f, {"nan_origin", "nonfinite", "skipped_step", "loss_spike", "grad_spike", "loss_rise", "exploding_gradients"});
    d.diverged = false;
  }
  if (const HealthEvent* e = first_event(run, {"inputs_not_normalized"}))
    d.add(*e, {"loss_spike", "grad_spike", "loss_rise", "exploding_gradients", "vanishing_gradients"});
  if (const HealthEvent* e = first_event(run, {"dead_relus"}))
    d.add(*e, {"loss_rise", "loss_spike", "grad_spike", "vanishing_gradients"});
  if (const HealthEvent* e = first_event(run, {"vanishing_gradients"}); e && !d.explained.count("vanishing_gradients"))
    d.add(*e, {});
}

// Gradients that explode with clipping off: the missing clip is the fix. With clipping on,
// an explosion is evidence for the lr rule below.
void exploding_finding(const RunRecord& run, Diagnosis& d) {
  const bool clipping = run.settings.number("optimizer.grad_clip", 0) > 0 || run.settings.number("optimizer.clip_value", 0) > 0;
  const HealthEvent* e = first_event(run, {"exploding_gradients"});
  if (!e || clipping || d.explained.count("exploding_gradients")) return;
  // An explosion that comes first: a non-finite step before it is the lr's story.
  const int64_t nf = first_nonfinite_step(run);
  if (nf >= 0 && nf < e->step) return;
  HealthEvent f = *e;
  f.severity = "error";
  f.fix.clear();
  add_remedy(f, remedy_clip(run.settings), true);
  if (f.details.count("layers")) f.message += " (layer: " + f.details.at("layers") + ")";
  d.add(f, {"grad_spike", "loss_spike", "loss_rise", "nan_origin", "nonfinite", "skipped_step"});
}

// The loss sat at the labels' entropy H (the loss of the best model that ignores its input)
// for the last half of a run of >= 100 steps without moving, and never went below it.
bool stuck_at_chance(const RunRecord& run) {
  const size_t n = run.steps.size();
  const double fin = final_level(run);
  if (run.label_entropy <= 0 || n < 4 || run.steps.back().step < 100 || !std::isfinite(fin)) return false;
  const double h = run.label_entropy;
  const double half = median_loss(run.steps, n / 2, n / 2 + std::max<size_t>(1, n / 10));
  double lowest = fin;
  for (size_t i = 0; i + 3 <= n; ++i) lowest = std::min(lowest, median_loss(run.steps, i, i + 3));
  // Within 5% of the entropy, never more than 5% below it (a model that got 5% past the
  // label frequencies has learned something from its inputs), and not far above it (that is
  // a divergence, not "chance").
  return fin >= 0.95 * h && fin <= 1.1 * h && lowest >= 0.95 * h && std::isfinite(half) && std::fabs(half - fin) <= 0.05 * h;
}

void lr_high_findings(const RunRecord& run, Diagnosis& d) {
  const HealthEvent* rise = first_event(run, {"loss_rise"});
  const bool nonfinite = has_nonfinite(run) && !d.explained.count("nan_origin");
  const double fin = final_level(run);
  bool diverged = nonfinite;
  bool recovered = false;
  if (rise && !d.explained.count("loss_rise")) {
    const double low = detail_number(*rise, "min_level", NAN), lvl = detail_number(*rise, "level", NAN);
    // Came back at least half way from the rise: a transient, not a divergence.
    recovered = std::isfinite(fin) && std::isfinite(low) && std::isfinite(lvl) && fin <= low + 0.5 * (lvl - low);
    diverged = diverged || !recovered;
  }
  if (diverged) {
    HealthEvent f;
    f.kind = "lr_too_high";
    f.severity = "error";
    const HealthEvent* origin = first_event(run, {"nan_origin"});
    const int64_t nf = first_nonfinite_step(run);
    // The onset: where the loss was lowest before it rose, else the first non-finite step.
    int64_t onset = rise && (nf < 0 || rise->step <= nf) ? static_cast<int64_t>(detail_number(*rise, "min_step", 0)) : nf;
    if (onset <= 0) onset = nf > 0 ? nf : 1;
    double onset_lr = rise && (nf < 0 || rise->step <= nf) ? detail_number(*rise, "lr_at_min", 0) : 0;
    if (!(onset_lr > 0)) onset_lr = lr_at(run, onset);
    if (!(onset_lr > 0)) onset_lr = run.settings.number("optimizer.lr", 0);
    f.step = nf > 0 ? nf : rise ? rise->step : onset;
    std::ostringstream msg;
    msg << "the learning rate is too high: training diverged";
    if (nf > 0) msg << " (non-finite loss or gradients from step " << nf << ")";
    else if (rise) msg << " (the loss rose from " << rise->details.at("min_level") << " at step " << rise->details.at("min_step")
                       << " and did not come back: " << fmt(fin) << " at the end)";
    if (origin) {
      auto det = [&](const char* k) { auto it = origin->details.find(k); return it == origin->details.end() ? std::string("?") : it->second; };
      msg << "; the first non-finite value came from op '" << det("op") << "'"
          << (det("module").empty() || det("module") == "?" ? std::string(" outside any module") : " in module '" + det("module") + "'")
          << (det("phase") == "?" ? std::string() : " (" + det("phase") + ")");
      f.details["op"] = det("op");
      f.details["module"] = det("module");
      if (origin->details.count("phase")) f.details["phase"] = det("phase");
      if (origin->details.count("file")) f.details["file"] = origin->details.at("file");
    }
    msg << "; the lr was " << fmt(onset_lr) << " at the onset (step " << onset << ")";
    f.message = msg.str();
    f.details["onset_step"] = std::to_string(onset);
    f.details["onset_lr"] = fmt(onset_lr);
    // A tenth of where it diverged, as an lr range test would suggest (Smith 2017; fastai).
    const double suggest = round_125(onset_lr / 10);
    f.details["suggested_lr"] = fmt(suggest);
    add_remedy(f, remedy_set_lr(run.settings, suggest, "a tenth of the lr where the loss diverged"), true);
    f.suggestions.push_back("measure it: athanor lr-find CONFIG (a learning-rate range test)");
    if (run.settings.number("schedule.warmup_steps", 0) <= 0) add_remedy(f, remedy_warmup(run.settings), false);
    add_remedy(f, remedy_clip(run.settings), false);
    d.add(f, {"nan_origin", "nonfinite", "skipped_step", "loss_rise", "loss_spike", "grad_spike", "exploding_gradients", "rollback"});
    return;
  }
  // A spike that "recovers" only to the label frequencies is the stuck run's story (below).
  if (rise && recovered && !d.explained.count("loss_rise") && !stuck_at_chance(run)) {
    const int64_t start = static_cast<int64_t>(detail_number(*rise, "min_step", static_cast<double>(rise->step)));
    const double max_steps = run.settings.number("trainer.max_steps", 0);
    const double warmup = run.settings.number("schedule.warmup_steps", 0);
    HealthEvent f = *rise;
    f.suggestions.clear();
    f.fix.clear();
    // Early: within the first tenth of the run (or 200 steps), where Adam's second-moment
    // estimates are still young and a full lr overshoots; past the warm-up, if there is one.
    const bool early = rise->step <= std::max(200.0, 0.1 * max_steps) && start >= static_cast<int64_t>(warmup);
    if (early) {
      f.kind = "early_loss_spike";
      f.message = "an early loss spike: " + rise->message + ", then recovered (" + fmt(fin) + " at the end)" +
                  (warmup <= 0 ? "; the run has no learning-rate warm-up, so the full lr hits an untrained model"
                               : "; the warm-up (" + fmt(warmup) + " steps) ends before the model is ready for the full lr");
      add_remedy(f, remedy_warmup(run.settings, 2 * rise->step), true);
      add_remedy(f, remedy_set_lr(run.settings, round_down_125(detail_number(*rise, "lr_at_min", run.settings.number("optimizer.lr", 0)) / 2),
                                  "or half the lr"),
                 false);
    } else {
      f.kind = "loss_spike";
      f.message = "a transient instability: " + rise->message + ", then recovered (" + fmt(fin) + " at the end)";
      add_remedy(f, remedy_set_lr(run.settings, round_down_125(lr_at(run, rise->step) / 3), "a third of the lr at the spike"), true);
      add_remedy(f, remedy_clip(run.settings), false);
    }
    d.add(f, {"loss_rise", "loss_spike", "grad_spike"});
  }
}

// How much the loss moved: (first level - final level) / first level.
double relative_progress(const RunRecord& run) {
  const size_t n = run.steps.size();
  if (n < 4) return std::nan("");
  const size_t k = std::max<size_t>(1, n / 10);
  const double first = median_loss(run.steps, 0, k), last = final_level(run);
  return (first - last) / std::max(std::fabs(first), 1e-12);
}

void learning_findings(const RunRecord& run, Diagnosis& d) {
  const size_t n = run.steps.size();
  if (n < 4) return;
  const int64_t last_step = run.steps.back().step;
  // Ratios past the first steps (Adam's first updates are ±lr on every weight whatever the
  // gradient) and past the warm-up.
  const int64_t from = std::max<int64_t>(static_cast<int64_t>(run.settings.number("schedule.warmup_steps", 0)) + 1, last_step / 4);
  const auto ratios = update_ratios(run, from);
  std::vector<double> rv;
  for (const auto& [name, r] : ratios) rv.push_back(r);
  const double med = median(rv);
  const double progress = relative_progress(run);
  const double fin = final_level(run);
  // lr_too_low: weights move by under 1e-4 of themselves per step (~1e-3 is the healthy
  // order, Karpathy's rule of thumb; athanor's healthy examples sit at 2e-3..2e-2 with Adam)
  // and the loss moved by under 10% over the run.
  if (!d.explained.count("lr_too_low") && std::isfinite(med) && med < 1e-4 && std::isfinite(progress) && progress < 0.1 &&
      last_step >= 20) {
    HealthEvent f;
    f.kind = "lr_too_low";
    f.severity = "warning";
    f.step = last_step;
    const double lr = run.settings.number("optimizer.lr", lr_at(run, last_step));
    f.message = "the learning rate is too low: the loss moved by " + pct(progress) + " over " + std::to_string(last_step) +
                " steps, and each step changes the weights by a median " + fmt(med) +
                " of their norm (updates of ~1e-3 of the weights are the healthy order)";
    f.details["update_to_weight"] = ratios_text(ratios);
    f.details["median_update_to_weight"] = fmt(med);
    // The update scales with the lr (SGD exactly, Adam nearly): aim the median at 3e-3, the
    // middle (in ratio) of the healthy 1e-3..1e-2 band.
    const double suggest = round_125(lr * 3e-3 / med);
    f.details["suggested_lr"] = fmt(suggest);
    add_remedy(f, remedy_set_lr(run.settings, suggest, "brings the median update to ~3e-3 of the weights"), true);
    f.suggestions.push_back("or measure it: athanor lr-find CONFIG");
    d.add(f, {"vanishing_gradients"});
    return;
  }
  // loss_at_chance: the labels' entropy H is the loss of the best model that ignores its
  // input. A model whose weights move normally but whose loss stays at H cannot use the
  // inputs: they do not determine the labels. Judged on runs of >= 100 steps whose loss sat
  // at >= 90% of H for the last half without moving (a healthy GPT passes its unigram
  // plateau well before that).
  // It must also never have learned: a loss that fell below H and came back is another
  // story (dead units, a divergence), and so is one whose gradients vanish before the
  // first layers.
  const bool vanishing = std::any_of(d.findings.begin(), d.findings.end(), [](const HealthEvent& f) { return f.kind == "vanishing_gradients"; });
  if (stuck_at_chance(run) && !vanishing) {
    const double h = run.label_entropy;
    const bool at_chance = true;
    const bool moving = !std::isfinite(med) || med >= 1e-4;
    // Stuck at the label frequencies while the gradients spike: the optimizer, not the data
    // (a GPT whose lr is too high stays on its unigram plateau).
    const HealthEvent* unstable = nullptr;
    for (const auto& e : run.events)
      if ((e.kind == "grad_spike" || e.kind == "loss_spike" || e.kind == "exploding_gradients" || e.kind == "loss_rise") &&
          !d.explained.count(e.kind)) {
        unstable = &e;
        break;
      }
    if (at_chance && moving && unstable) {
      HealthEvent f;
      f.kind = "lr_too_high";
      f.severity = "error";
      f.step = unstable->step;
      const double lr = lr_at(run, unstable->step) > 0 ? lr_at(run, unstable->step) : run.settings.number("optimizer.lr", 0);
      f.message = "the learning rate is too high: the loss stays at " + fmt(fin) + ", the entropy of the labels (" + fmt(h) +
                  " nats: predicting the label frequencies), and training was unstable (" + unstable->kind + " at step " +
                  std::to_string(unstable->step) + "): the updates are too large for the model to learn more than the label "
                  "frequencies; the lr was " + fmt(lr) + " there";
      f.details["label_entropy"] = fmt(h);
      f.details["onset_step"] = std::to_string(unstable->step);
      f.details["onset_lr"] = fmt(lr);
      add_remedy(f, remedy_set_lr(run.settings, round_125(lr / 10), "a tenth of the lr where training turned unstable"), true);
      f.suggestions.push_back("measure it: athanor lr-find CONFIG (a learning-rate range test)");
      if (run.settings.number("schedule.warmup_steps", 0) <= 0) add_remedy(f, remedy_warmup(run.settings), false);
      d.add(f, {"grad_spike", "loss_spike", "exploding_gradients", "loss_rise", "dead_relus"});
      return;
    }
    if (at_chance && moving) {
      HealthEvent f;
      f.kind = "loss_at_chance";
      f.severity = "error";
      f.step = last_step;
      f.message = "the model cannot learn from these inputs: check that labels match inputs. The loss stays at " + fmt(fin) +
                  ", the entropy of the labels (" + fmt(h) + " nats over " + std::to_string(run.label_classes) +
                  " classes: what predicting the label frequencies alone achieves), while the weights keep moving" +
                  (std::isfinite(med) ? " (median update " + fmt(med) + " of the weights)" : std::string());
      f.details["label_entropy"] = fmt(h);
      f.details["final_loss"] = fmt(fin);
      if (!run.evals.empty()) f.details["val_loss"] = fmt(run.evals.back().loss);
      f.suggestions.push_back("check that each input is paired with its own label (a shuffle applied to one but not the other, "
                              "an off-by-one between files, a wrong label column)");
      if (run.settings.flag("debug.shuffle_labels", false)) {
        f.suggestions.push_back("this run sets the TEST ONLY debug.shuffle_labels: true, which does exactly that: set it false");
        f.fix["debug.shuffle_labels"] = "false";
      }
      d.add(f, {"loss_rise", "dead_relus", "loss_spike", "grad_spike"});
    }
  }
}

void overfitting_finding(const RunRecord& run, Diagnosis& d) {
  std::vector<EvalMetrics> ev;
  for (const auto& e : run.evals)
    if (std::isfinite(e.loss)) ev.push_back(e);
  if (ev.size() < 3) return;
  size_t best = 0;
  for (size_t i = 1; i < ev.size(); ++i)
    if (ev[i].loss < ev[best].loss) best = i;
  const EvalMetrics& last = ev.back();
  // Rising by 5% (at least 0.02 nats, above evaluation noise) over two or more evaluations
  // after the best, while the training loss went on falling: memorizing, not learning.
  if (ev.size() - 1 - best < 2 || last.loss < ev[best].loss + std::max(0.05 * ev[best].loss, 0.02)) return;
  double train_at_best = std::nan(""), train_end = final_level(run);
  for (const auto& m : run.steps)
    if (m.step <= ev[best].step && std::isfinite(m.loss)) train_at_best = m.loss;
  if (std::isfinite(train_at_best) && std::isfinite(train_end) && train_end >= train_at_best) return;
  HealthEvent f;
  f.kind = "overfitting";
  f.severity = "warning";
  f.step = last.step;
  f.message = "overfitting: the validation loss was best at step " + std::to_string(ev[best].step) + " (" + fmt(ev[best].loss) +
              ") and rose to " + fmt(last.loss) + " by step " + std::to_string(last.step) + " while the training loss fell to " +
              fmt(train_end) + ": the model memorizes the training set";
  f.details["best_val_step"] = std::to_string(ev[best].step);
  f.details["best_val_loss"] = fmt(ev[best].loss);
  const double epochs = run.settings.number("trainer.epochs", 0);
  const int64_t last_step = run.steps.empty() ? last.step : run.steps.back().step;
  if (epochs > 0 && last_step > 0) {
    const double per_epoch = static_cast<double>(last_step) / epochs;
    const int64_t e = std::max<int64_t>(1, static_cast<int64_t>(std::llround(static_cast<double>(ev[best].step) / per_epoch)));
    if (e < epochs) {
      f.suggestions.push_back("stop where validation was best: trainer.epochs: " + std::to_string(e) + " (step " +
                              std::to_string(ev[best].step) + ")");
      f.fix["trainer.epochs"] = std::to_string(e);
    }
  } else {
    f.suggestions.push_back("stop where validation was best: trainer.max_steps: " + std::to_string(ev[best].step));
    f.fix["trainer.max_steps"] = std::to_string(ev[best].step);
  }
  if (run.settings.number("data.train_samples", 0) > 0)
    f.suggestions.push_back("train on more data: data.train_samples is " + run.settings.text("data.train_samples") +
                            "; 0 uses the whole training set");
  if (run.settings.number("optimizer.weight_decay", 0) <= 0) f.suggestions.push_back("regularize: optimizer.weight_decay: 0.1");
  if (run.settings.number("model.dropout", 0) <= 0) f.suggestions.push_back("regularize: model.dropout: 0.1");
  d.add(f, {});
}

void data_starved_finding(const RunRecord& run, Diagnosis& d) {
  if (run.steps.empty()) return;
  PhaseTotals t = run.steps.back().totals;
  if (t.steps == 0)  // older runs: the logged steps only
    for (const auto& m : run.steps)
      if (std::isfinite(m.step_seconds) && std::isfinite(m.data_seconds)) ++t.steps, t.step_s += m.step_seconds, t.data_s += m.data_seconds;
  // A pipeline that keeps up costs ~0 wait (the batch is ready); 20% is far above noise.
  if (t.steps < 10 || !(t.step_s > 0) || t.data_s / t.step_s < 0.2) return;
  // And on the typical step, not in bursts: loader threads descheduled on a busy machine
  // make a few steps wait long (the mean), a starved pipeline makes every step wait.
  std::vector<double> shares;
  for (const auto& m : run.steps)
    if (std::isfinite(m.data_seconds) && m.step_seconds > 0) shares.push_back(m.data_seconds / m.step_seconds);
  if (shares.size() >= 5 && median(shares) < 0.2) return;
  const double share = t.data_s / t.step_s;
  const double load = t.data_s / static_cast<double>(t.steps), compute = (t.step_s - t.data_s) / static_cast<double>(t.steps);
  const int64_t workers = static_cast<int64_t>(run.settings.number("data.num_workers", 0));
  const int64_t prefetch = static_cast<int64_t>(run.settings.number("data.prefetch", 4));
  // Workers needed to hide the load: the time a batch takes to build (its wait plus the
  // compute it overlapped, per worker) over the compute it must hide behind.
  const double build = workers > 0 ? static_cast<double>(workers) * (load + compute) : load;
  const int64_t want = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(build / std::max(compute, 1e-6))) + 1,
                                           std::max<int64_t>(2, 2 * workers), 32);
  HealthEvent f;
  f.kind = "data_starved";
  f.severity = "warning";
  f.step = run.steps.back().step;
  f.message = "the step waits for data " + pct(share) + " of the time (" + fmt(1e3 * load) + " ms per step against " +
              fmt(1e3 * compute) + " ms of compute, over all " + std::to_string(t.steps) + " steps)" +
              (workers == 0 ? ": batches are built in the training thread (data.num_workers: 0)" : "");
  f.details["data_share"] = pct(share);
  f.suggestions.push_back("load in parallel: data.num_workers: " + std::to_string(want) + " (now " + std::to_string(workers) + ")");
  f.fix["data.num_workers"] = std::to_string(want);
  if (prefetch < 2 * want) {
    f.suggestions.push_back("keep more batches ready: data.prefetch: " + std::to_string(2 * want) + " (now " + std::to_string(prefetch) + ")");
    f.fix["data.prefetch"] = std::to_string(2 * want);
  }
  f.suggestions.push_back("make each sample cheaper: pre-process once (decode, resize, tokenize) and store the result");
  d.add(f, {});
}

void straggler_finding(const RunRecord& run, Diagnosis& d) {
  const StepMetrics* last = nullptr;
  for (const auto& m : run.steps)
    if (m.rank_compute_seconds.size() >= 2) last = &m;
  if (!last || last->totals.steps < 5 || !(last->totals.step_s > 0)) return;
  const auto& c = last->rank_compute_seconds;
  const size_t slow = static_cast<size_t>(std::max_element(c.begin(), c.end()) - c.begin());
  std::vector<double> others;
  for (size_t r = 0; r < c.size(); ++r)
    if (r != slow) others.push_back(c[r]);
  const double rest = median(others);
  const double steps = static_cast<double>(last->totals.steps), step = last->totals.step_s / steps;
  // Ranks do the same work: 30% more, and at least a tenth of the step, is not noise.
  if (!(rest > 0) || c[slow] < 1.3 * rest || (c[slow] - rest) / steps < 0.1 * step) return;
  HealthEvent f;
  f.kind = "straggler";
  f.severity = "warning";
  f.step = last->step;
  f.message = "rank " + std::to_string(slow) + " is a straggler: it computes for " + fmt(1e3 * c[slow] / steps) + " ms of each " +
              fmt(1e3 * step) + " ms step (" + pct(c[slow] / steps / step) + " of the step), the other ranks " +
              fmt(1e3 * rest / steps) + " ms (" + pct(rest / steps / step) +
              "); they wait for it in every gradient all-reduce";
  f.details["rank"] = std::to_string(slow);
  f.details["rank_share"] = pct(c[slow] / steps / step);
  f.details["others_share"] = pct(rest / steps / step);
  f.suggestions = {"look at what else runs where rank " + std::to_string(slow) + " runs (other jobs, CPU frequency, thermal limits)",
                   "pin ranks to cores (mpirun --bind-to core) so that they do not share cores",
                   "check that rank's data path (a slower disk or network share)"};
  if (run.settings.number("debug.slow_rank", -1) >= 0)
    f.suggestions.push_back("this run sets the TEST ONLY debug.slow_rank: " + run.settings.text("debug.slow_rank") +
                            " (debug.slow_rank_delay_ms " + run.settings.text("debug.slow_rank_delay_ms") + ")");
  d.add(f, {});
}

// Same model and data as the baseline, a larger global batch at the same effective lr, and
// less progress at the same number of samples: the lr was not scaled with the batch.
void batch_scaling_finding(const RunRecord& run, const RunRecord* base, Diagnosis& d) {
  if (!base || run.global_batch <= 0 || base->global_batch <= 0 || run.steps.empty() || base->steps.empty()) return;
  for (const auto& [k, v] : run.settings.values())
    if ((k.rfind("model.", 0) == 0 || k == "data.type" || k == "optimizer.type") && base->settings.text(k) != v) return;
  const double ratio = static_cast<double>(run.global_batch) / static_cast<double>(base->global_batch);
  const double lr = run.settings.number("optimizer.lr", 0), base_lr = base->settings.number("optimizer.lr", 0);
  const bool scaled = run.settings.number("optimizer.lr_scaling_base_batch", 0) > 0;
  if (ratio < 2 || scaled || !(lr > 0) || std::fabs(lr - base_lr) > 0.01 * base_lr) return;
  // The loss at the same number of samples seen: this run's end, the baseline's step with as
  // many samples (or its end, when it saw fewer).
  const double samples = static_cast<double>(run.steps.back().step) * static_cast<double>(run.global_batch);
  const double mine = final_level(run);
  double theirs = std::nan("");
  std::vector<StepMetrics> upto;
  for (const auto& m : base->steps)
    if (static_cast<double>(m.step) * static_cast<double>(base->global_batch) <= samples * 1.0001) upto.push_back(m);
  if (upto.size() >= 3) theirs = median_loss(upto, upto.size() - std::max<size_t>(3, upto.size() / 10), upto.size());
  const double start = median_loss(base->steps, 0, std::max<size_t>(1, base->steps.size() / 10));
  if (!std::isfinite(mine) || !std::isfinite(theirs) || !std::isfinite(start)) return;
  // 5% of the baseline's progress: beyond the noise of a median over logged steps.
  if (mine - theirs < 0.05 * (start - theirs)) return;
  HealthEvent f;
  f.kind = "batch_lr_not_scaled";
  f.severity = "warning";
  f.step = run.steps.back().step;
  f.message = "slower progress per sample than the baseline " + base->dir + ": after " + fmt(samples) + " samples the loss is " +
              fmt(mine) + " against " + fmt(theirs) + "; the global batch is " + fmt(ratio) + "x the baseline's (" +
              std::to_string(run.global_batch) + " vs " + std::to_string(base->global_batch) + ") at the same lr " + fmt(lr) +
              ", so each sample moves the weights " + fmt(ratio) + "x less";
  f.details["global_batch"] = std::to_string(run.global_batch);
  f.details["baseline_global_batch"] = std::to_string(base->global_batch);
  f.suggestions.push_back("scale the lr with the batch (the linear scaling rule, Goyal et al. 2017): optimizer.lr_scaling_base_batch: " +
                          std::to_string(base->global_batch) + " (lr x " + fmt(ratio) + "), with a warm-up");
  f.fix["optimizer.lr_scaling_base_batch"] = std::to_string(base->global_batch);
  d.add(f, {});
}

}  // namespace

std::vector<HealthEvent> find_causes(const RunRecord& run, const RunRecord* baseline) {
  Diagnosis d;
  data_findings(run, d);
  exploding_finding(run, d);
  lr_high_findings(run, d);
  learning_findings(run, d);
  overfitting_finding(run, d);
  data_starved_finding(run, d);
  straggler_finding(run, d);
  batch_scaling_finding(run, baseline, d);
  // Events no cause explains, once per kind (the first), as they are.
  std::set<std::string> reported;
  for (const auto& e : run.events) {
    if (d.explained.count(e.kind) || reported.count(e.kind) || e.severity == "info") continue;
    reported.insert(e.kind);
    HealthEvent f = e;
    int64_t count = 0;
    for (const auto& o : run.events) count += o.kind == e.kind;
    if (count > 1) f.details["occurrences"] = std::to_string(count);
    d.findings.push_back(f);
  }
  for (auto& f : d.findings) {  // each suggestion once, in its first place
    std::vector<std::string> seen;
    for (const auto& sg : f.suggestions)
      if (std::find(seen.begin(), seen.end(), sg) == seen.end()) seen.push_back(sg);
    f.suggestions = std::move(seen);
  }
  std::stable_sort(d.findings.begin(), d.findings.end(),
                   [&](const HealthEvent& a, const HealthEvent& b) { return priority(a.kind, d.diverged) < priority(b.kind, d.diverged); });
  return d.findings;
}

}  // namespace athanor::observe::detail
