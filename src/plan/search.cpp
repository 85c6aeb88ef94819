// The layout search and its decision tree (plan/search.h).
#include "athanor/plan/search.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <sstream>

#include "athanor/core/error.h"

namespace athanor::plan {

std::string format_bytes(double b) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1);
  const double a = std::fabs(b);
  if (a >= 1024.0 * 1024 * 1024 * 1024) o << b / (1024.0 * 1024 * 1024 * 1024) << " TiB";
  else if (a >= 1024.0 * 1024 * 1024) o << b / (1024.0 * 1024 * 1024) << " GiB";
  else if (a >= 1024.0 * 1024) o << b / (1024.0 * 1024) << " MiB";
  else o << b / 1024.0 << " KiB";
  return o.str();
}

namespace {

std::vector<int> divisors(int64_t n, int64_t cap) {
  std::vector<int> d;
  for (int64_t i = 1; i <= std::min(n, cap); ++i)
    if (n % i == 0) d.push_back(static_cast<int>(i));
  return d;
}

double category(const StageMemory& s, const std::string& name) {
  if (name == "activations") return s.activations;
  if (name == "parameters") return s.params;
  if (name == "gradients") return s.grads;
  if (name == "optimizer states") return s.optimizer;
  if (name == "workspace") return s.workspace;
  if (name == "packed weights") return s.derived;
  return s.comm;
}

std::vector<Layout> enumerate(const TrainSpec& spec, int world, int64_t global_batch, const Cluster& c) {
  const ModelSpec& m = spec.model;
  std::vector<Layout> out;
  for (int tp : divisors(m.tp_heads(), world)) {
    for (int pp : divisors(m.n_layer, world / tp)) {
      if (world % (tp * pp) != 0) continue;
      const int dp = world / (tp * pp);
      if (global_batch % dp != 0) continue;
      const int64_t per_rank = global_batch / dp;
      for (int64_t mb = 1; mb <= std::min<int64_t>(per_rank, 64); mb *= 2) {
        if (per_rank % mb != 0) continue;
        const int64_t accum = per_rank / mb;
        std::vector<std::pair<Schedule, int>> schedules = {{Schedule::one_f_one_b, 1}};
        if (pp > 1) {
          schedules.push_back({Schedule::zb_h1, 1});
          schedules.push_back({Schedule::gpipe, 1});
          if (m.n_layer % (2 * pp) == 0 && accum % pp == 0) schedules.push_back({Schedule::interleaved, 2});
        }
        for (auto [sched, v] : schedules)
          for (int zero = 0; zero <= (dp == 1 ? 0 : (pp > 1 ? 1 : 3)); ++zero)
            for (int rc = 0; rc < 2; ++rc)
              for (int sp = 0; sp < (tp > 1 && m.seq % tp == 0 ? 2 : 1); ++sp) {
                Layout l;
                l.dp = dp, l.tp = tp, l.pp = pp, l.virtual_stages = v, l.schedule = sched, l.zero = zero;
                l.micro_batch = mb, l.accum = accum, l.recompute = rc == 1, l.sequence_parallel = sp == 1;
                if (layout_problem(spec, l).empty()) out.push_back(l);
              }
      }
    }
  }
  (void)c;
  return out;
}

}  // namespace

Candidate evaluate(const TrainSpec& spec, const Layout& l, const Cluster& c) {
  Candidate r;
  r.layout = l;
  r.stages = memory_per_stage(spec, l);
  for (const auto& s : r.stages)
    if (s.peak() > r.peak) {
      r.peak = s.peak();
      r.worst_stage = s.stage;
    }
  r.time = step_time(spec, l, c);
  const StageMemory& w = r.stages[r.worst_stage];
  const double need = w.needs(kFragmentationMargin) * c.memory_calibration;
  if (need > c.memory_bytes) {
    std::ostringstream o;
    const std::string big = w.largest();
    std::string cat = big.substr(0, big.find(" of "));
    o << "OOM on stage " << w.stage << " by " << format_bytes(need - c.memory_bytes) << ": " << big << " ("
      << format_bytes(category(w, cat)) << " of " << format_bytes(need) << " with the " << static_cast<int>(kFragmentationMargin * 100)
      << "% margin)";
    r.rejected = o.str();
  }
  if (r.rejected.empty() && l.tp > c.devices_per_node)
    r.rejected = "tensor parallelism across nodes (tp " + std::to_string(l.tp) + " > " + std::to_string(c.devices_per_node) +
                 " devices per node): 4 all-reduces per layer on the inter-node link";
  return r;
}

int smallest_fitting_nodes(const TrainSpec& spec, const Cluster& c, int64_t global_batch) {
  for (int nodes = 1; nodes <= 65536; nodes *= 2) {
    Cluster k = c;
    k.nodes = nodes;
    const int world = k.devices();
    int64_t b = std::max<int64_t>(global_batch, world);  // at least one sample per data-parallel rank
    for (const auto& l : enumerate(spec, world, b, k))
      if (evaluate(spec, l, k).rejected.empty()) return nodes;
  }
  return 0;
}

PlanResult search(const TrainSpec& spec, const Cluster& c, const SearchOptions& opts) {
  check_model(spec.model);
  PlanResult r;
  const int world = c.devices();
  r.global_batch = opts.global_batch > 0 ? opts.global_batch : spec.micro_batch * spec.accum;
  ATH_CHECK(r.global_batch >= 1, "plan", "the global batch must be >= 1, got ", r.global_batch, Hint{"pass --global-batch B"});
  const auto layouts = enumerate(spec, world, r.global_batch, c);
  r.enumerated = layouts.size();
  ATH_CHECK(!layouts.empty(), "plan", "no layout of ", world, " devices divides the model and the global batch ", r.global_batch,
            " (n_head ", spec.model.tp_heads(), spec.model.llama() ? ", n_kv_head " + std::to_string(spec.model.kv_heads()) : std::string(),
            ", n_layer ", spec.model.n_layer, ")",
            Hint{"choose --global-batch a multiple of the device count, or --nodes so that the devices divide it"});
  std::vector<Candidate> all;
  all.reserve(layouts.size());
  for (const auto& l : layouts) all.push_back(evaluate(spec, l, c));

  // Tree step 1: plain data parallelism (tp = pp = 1, ZeRO-0) fits → nothing else is needed.
  const Candidate* plain_dp = nullptr;
  for (const auto& cand : all)
    if (cand.layout.tp == 1 && cand.layout.pp == 1 && cand.layout.zero == 0 && cand.rejected.empty() &&
        (!plain_dp || cand.time.total < plain_dp->time.total))
      plain_dp = &cand;
  if (opts.prune_with_tree && plain_dp) {
    const std::string why = "pruned: data parallelism alone fits (" + plain_dp->layout.str() + "), tp and pp only add communication";
    for (auto& cand : all)
      if (cand.rejected.empty() && (cand.layout.tp > 1 || cand.layout.pp > 1)) cand.rejected = why;
  }

  for (const auto& cand : all)
    if (cand.rejected.empty()) r.ranked.push_back(cand);
  std::stable_sort(r.ranked.begin(), r.ranked.end(), [](const Candidate& a, const Candidate& b) {
    if (a.time.total != b.time.total) return a.time.total < b.time.total;
    return a.peak < b.peak;
  });

  // The rejected layouts a user would think of: for each (tp, pp), its most frugal variant
  // (the smallest peak) when none of its variants fits or the tree pruned them.
  std::map<std::pair<int, int>, const Candidate*> frugal;
  std::map<std::pair<int, int>, bool> any_fits;
  for (const auto& cand : all) {
    const auto key = std::make_pair(cand.layout.tp, cand.layout.pp);
    if (cand.rejected.empty()) any_fits[key] = true;
    if (!frugal.count(key) || cand.peak < frugal[key]->peak) frugal[key] = &cand;
  }
  for (const auto& cand : all)  // plain data parallelism first: the layout everyone tries first
    if (cand.layout.tp == 1 && cand.layout.pp == 1 && cand.layout.zero == 0 && cand.layout.micro_batch == 1 &&
        !cand.layout.recompute && !cand.rejected.empty()) {
      r.rejected.push_back(cand);
      break;
    }
  for (const auto& [key, cand] : frugal)
    if (!any_fits[key] && r.rejected.size() < 12) r.rejected.push_back(*cand);

  if (r.ranked.empty()) {
    const int n = smallest_fitting_nodes(spec, c, r.global_batch);
    const Candidate& best = *std::min_element(all.begin(), all.end(), [](auto& a, auto& b) { return a.peak < b.peak; });
    std::ostringstream hint;
    if (n > 0)
      hint << "the smallest " << c.name << " cluster that holds it has " << n << " node" << (n > 1 ? "s" : "") << " ("
           << n * c.devices_per_node << " devices): athanor plan … --nodes " << n;
    else
      hint << "no cluster of up to 65536 " << c.name << " nodes holds it: the model is too large for this device";
    ATH_FAIL("plan", "no layout of ", spec.model.name, " (", spec.model.total_params() / 1e6, "M parameters) fits on ", world, " ",
             c.name, " devices of ", format_bytes(c.memory_bytes), ": the most frugal, ", best.layout.str(), ", needs ",
             format_bytes(best.stages[best.worst_stage].needs(kFragmentationMargin)), " per device (", best.rejected, ")",
             Hint{hint.str()});
  }
  if (static_cast<int>(r.ranked.size()) > std::max(opts.top, 1) && opts.top > 0) r.ranked.resize(std::max(opts.top, 1));

  // The tree's path for the best layout.
  const Candidate& best = r.ranked.front();
  const Layout& b = best.layout;
  auto fmt_s = [](double s) {
    std::ostringstream o;
    o << std::setprecision(3) << s << " s";
    return o.str();
  };
  {
    // 1. one device?
    Layout one;
    one.micro_batch = 1;
    one.accum = 1;
    const Candidate c1 = evaluate(spec, one, Cluster{c});
    r.tree.push_back(std::string("1. the model on one device (ZeRO-0, micro-batch 1): ") + format_bytes(c1.stages[0].needs(kFragmentationMargin)) +
                     " of " + format_bytes(c.memory_bytes) +
                     (c1.rejected.empty() ? " → fits: data parallelism" : " → does not fit"));
    if (!c1.rejected.empty() || b.zero > 0) {
      const double states = c1.stages[0].params + c1.stages[0].grads + c1.stages[0].optimizer + c1.stages[0].comm;
      r.tree.push_back("2. model states on one device: " + format_bytes(states) +
                       (b.zero > 0 ? " → ZeRO-" + std::to_string(b.zero) + " over dp " + std::to_string(b.dp) +
                                         (b.pp > 1 ? " (ZeRO-2/3 are refused with pipelines)" : "")
                                   : " → ZeRO-0 (the states fit once tp/pp split them)"));
    }
    if (b.tp > 1) {
      const Candidate* z3 = nullptr;
      for (const auto& cand : all)
        if (cand.layout.tp == 1 && cand.layout.pp == 1 && cand.rejected.empty() && (!z3 || cand.time.total < z3->time.total)) z3 = &cand;
      r.tree.push_back("3. tensor parallelism within a node: tp " + std::to_string(b.tp) + " of " + std::to_string(c.devices_per_node) +
                       " devices per node; " +
                       (z3 ? "the best data-parallel-only layout (" + z3->layout.str() + ") takes " + fmt_s(z3->time.total) +
                                 " a step (dp traffic " + fmt_s(z3->time.dp_comm) + ")"
                           : std::string("no data-parallel-only layout fits (even with ZeRO-3)")));
    }
    if (b.pp > 1) {
      const Candidate* np = nullptr;
      for (const auto& cand : all)
        if (cand.layout.pp == 1 && cand.layout.tp == b.tp && (!np || cand.peak < np->peak || (cand.rejected.empty() && !np->rejected.empty())))
          np = &cand;
      r.tree.push_back("4. pipeline across nodes: pp " + std::to_string(b.pp) + " (" + schedule_name(b.schedule) +
                       (b.virtual_stages > 1 ? " with " + std::to_string(b.virtual_stages) + " virtual stages" : std::string()) + ", " +
                       std::to_string(b.accum) + " micro-batches, bubble " + fmt_s(best.time.bubble) + "); " +
                       (np ? (np->rejected.empty() ? "without it (" + np->layout.str() + ") a step takes " + fmt_s(np->time.total)
                                                   : "without it: " + np->rejected)
                           : std::string("")));
    }
    const StageMemory& w = best.stages[best.worst_stage];
    const double acts = w.activation_per_micro_batch * in_flight(b, w.stage);
    const double share = acts / std::max(w.peak(), 1.0);
    std::ostringstream o;
    o << "5. activations (" << format_bytes(acts) << " in flight) are " << std::fixed << std::setprecision(0) << 100 * share
      << "% of the peak on stage " << w.stage << " → ";
    if (b.recompute || b.sequence_parallel)
      o << (b.recompute ? "recompute" : "") << (b.recompute && b.sequence_parallel ? " + " : "")
        << (b.sequence_parallel ? "sequence parallelism" : "");
    else
      o << (spec.model.llama() ? "recompute is not needed (the plan does not model the Llama's sequence parallelism)"
                               : "neither recompute nor sequence parallelism is needed");
    r.tree.push_back(o.str());
  }
  return r;
}

std::string format_memory(const TrainSpec& spec, const Candidate& cand) {
  std::ostringstream o;
  o << "  stage  params    grads     optim     activ.    workspace packed    comm      peak      +" << static_cast<int>(kFragmentationMargin * 100)
    << "% margin\n";
  for (const auto& s : cand.stages) {
    o << "  " << std::left << std::setw(7) << s.stage;
    for (double v : {s.params, s.grads, s.optimizer, s.activations, s.workspace, s.derived, s.comm, s.peak(), s.needs(kFragmentationMargin)})
      o << std::setw(10) << format_bytes(v);
    o << "\n";
  }
  const Layout& l = cand.layout;
  o << "  activations of one layer, one micro-batch (" << l.micro_batch << " x " << spec.model.seq << " tokens), this rank: "
    << format_bytes(activation_bytes_per_layer(spec, l)) << ", from the tensors athanor saves:\n";
  for (const auto& t : activation_tensors(spec, l))
    o << "    " << std::setw(10) << format_bytes(t.bytes * static_cast<double>(l.micro_batch * spec.model.seq)) << " " << t.what << "\n";
  const Korthikanti k = korthikanti_bytes_per_layer(spec.model, l.micro_batch, l.tp);
  o << "  Korthikanti et al. (16-bit, sbh(34 + 5as/h)" << (spec.model.llama() ? ", a GPT block's formula" : "") << "): " << format_bytes(k.none) << " without parallelism; tp " << l.tp << ": "
    << format_bytes(k.tp) << "; tp + sp: " << format_bytes(k.tp_sp) << "; full recompute: " << format_bytes(k.recompute) << "\n";
  return o.str();
}

std::string format_plan(const TrainSpec& spec, const Cluster& c, const PlanResult& r) {
  std::ostringstream o;
  const ModelSpec& m = spec.model;
  o << m.name << ": " << family_name(m.family) << ", " << std::fixed << std::setprecision(1) << m.total_params() / 1e6
    << "M parameters (" << m.n_layer << " layers, " << m.n_head << " heads";
  if (m.llama())
    o << " sharing " << m.kv_heads() << " key/value heads, SwiGLU width " << m.intermediate << ", "
      << (m.tie_embeddings ? "tied" : "untied") << " lm_head";
  o << ", width " << m.n_embd << ", seq " << m.seq << ", vocab " << m.vocab << "), " << precision_name(spec.precision) << ", "
    << spec.optimizer << "\n";
  o << "cluster: " << c.name << ", " << c.nodes << " x " << c.devices_per_node << " devices of " << format_bytes(c.memory_bytes) << ", "
    << std::setprecision(1) << c.peak(spec.precision) / 1e12 << " TFLOP/s " << precision_name(spec.precision) << " peak at "
    << std::setprecision(0) << c.efficiency_for(spec.precision) * 100 << "% efficiency; links " << std::setprecision(1) << c.intra.bytes_per_s / 1e9
    << " GB/s within a node, " << c.inter.bytes_per_s / 1e9 << " GB/s across (" << c.source << ")\n";
  o << "global batch " << r.global_batch << " x " << spec.model.seq << " tokens; " << r.enumerated << " layouts enumerated\n\n";
  o << "decision tree:\n";
  for (const auto& t : r.tree) o << "  " << t << "\n";
  o << "\n  #  layout                                              peak/rank  step       tokens/s     MFU    (params grads optim activ. ws packed comm)\n";
  int i = 1;
  for (const auto& cand : r.ranked) {
    const StageMemory& w = cand.stages[cand.worst_stage];
    o << "  " << std::left << std::setw(3) << i++ << std::setw(52) << cand.layout.str() << " " << std::right << std::setw(10)
      << format_bytes(cand.peak) << "  " << std::setw(9) << std::setprecision(4) << cand.time.total << "s  " << std::setw(11)
      << std::setprecision(0) << cand.time.tokens_per_s << "  " << std::setw(5) << std::setprecision(1) << 100 * cand.time.mfu << "%"
      << "  (" << format_bytes(w.params) << " " << format_bytes(w.grads) << " " << format_bytes(w.optimizer) << " "
      << format_bytes(w.activations) << " " << format_bytes(w.workspace) << " " << format_bytes(w.derived) << " "
      << format_bytes(w.comm) << ")\n";
  }
  if (!r.rejected.empty()) {
    o << "\nrejected:\n";
    for (const auto& cand : r.rejected) o << "  " << std::left << std::setw(52) << cand.layout.str() << " " << cand.rejected << "\n";
  }
  const Candidate& best = r.ranked.front();
  o << "\nbest: " << best.layout.str() << "\n" << format_memory(spec, best);
  o << "  step " << std::setprecision(4) << best.time.total << " s = compute " << best.time.compute << " + bubble " << best.time.bubble
    << " + dp " << best.time.dp_comm << " + tp " << best.time.tp_comm << " + pp " << best.time.pp_comm
    << " (dp reduction overlapped with the last micro-batch's backward; tp and pp transfers not overlapped)\n";
  return o.str();
}

std::string layout_yaml(const TrainSpec& spec, const Layout& l) {
  std::ostringstream o;
  o << "trainer:\n  batch_size: " << l.micro_batch << "\n  accum_steps: " << l.accum << "\n  precision: " << precision_name(spec.precision)
    << "\nmodel:\n  gradient_checkpointing: " << (l.recompute ? "true" : "false") << "\ndist:\n  tp: " << l.tp << "\n  pp: " << l.pp
    << "\n  zero_stage: " << l.zero << "\n  sequence_parallel: " << (l.sequence_parallel ? "true" : "false");
  if (l.pp > 1) o << "\n  pp_schedule: " << schedule_name(l.schedule) << "\n  virtual_stages: " << l.virtual_stages;
  o << "\n";
  return o.str();
}

}  // namespace athanor::plan
