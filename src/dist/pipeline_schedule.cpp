// Pipeline schedules as per-rank action lists, their theory, and a simulator that checks a
// set of lists cannot deadlock (contract in include/athanor/dist/pipeline_schedule.h).
#include "athanor/dist/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "athanor/core/error.h"

namespace athanor::dist {

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::gpipe: return "gpipe";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::interleaved: return "interleaved";
    case ScheduleKind::zero_bubble: return "zb-h1";
  }
  return "?";
}

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::gpipe;
  if (name == "1f1b" || name == "one_f_one_b") return ScheduleKind::one_f_one_b;
  if (name == "interleaved" || name == "interleaved_1f1b") return ScheduleKind::interleaved;
  if (name == "zb-h1" || name == "zbh1" || name == "zero_bubble") return ScheduleKind::zero_bubble;
  ATH_FAIL("pipeline", "unknown pipeline schedule '", name, "'",
           Hint{"choose gpipe, 1f1b, interleaved (with dist.virtual_stages > 1) or zb-h1"});
}

const char* action_name(ActionKind k) {
  switch (k) {
    case ActionKind::forward: return "forward";
    case ActionKind::backward: return "backward";
    case ActionKind::backward_input: return "backward_input";
    case ActionKind::backward_weight: return "backward_weight";
    case ActionKind::recv_activation: return "recv_activation";
    case ActionKind::send_activation: return "send_activation";
    case ActionKind::recv_grad: return "recv_grad";
    case ActionKind::send_grad: return "send_grad";
  }
  return "?";
}

std::string to_string(const Action& a) {
  static const char* const abbrev[] = {"F", "B", "I", "W", "rA", "sA", "rG", "sG"};
  std::string s = abbrev[static_cast<int>(a.kind)] + std::to_string(a.mb);
  if (a.chunk > 0) s += "." + std::to_string(a.chunk);
  return s;
}

void check_schedule(ScheduleKind kind, int pp, int m, int v) {
  const char* op = "pipeline schedule";
  ATH_CHECK(pp >= 1, op, "the pipeline needs at least one stage, got pp = ", pp);
  ATH_CHECK(m >= 1, op, "the schedule needs at least one micro-batch, got ", m, Hint{"set trainer.accum_steps >= 1"});
  ATH_CHECK(v >= 1, op, "dist.virtual_stages must be >= 1, got ", v);
  ATH_CHECK(v == 1 || kind == ScheduleKind::interleaved, op, "dist.virtual_stages ", v, " is for the interleaved schedule, not ",
            schedule_name(kind), Hint{"set dist.pp_schedule: interleaved, or dist.virtual_stages: 1"});
  if (kind == ScheduleKind::interleaved)
    ATH_CHECK(m % pp == 0, op, "the interleaved schedule sends micro-batches round the ", pp,
              " stages in groups of pp, so trainer.accum_steps (", m, " micro-batches) must be a multiple of dist.pp (", pp, ")",
              Hint{"set trainer.accum_steps to a multiple of " + std::to_string(pp) + ", or use dist.pp_schedule: 1f1b"});
}

namespace {

// The compute actions of rank r, in order (the transfers are added around them below).
std::vector<Action> compute_order(ScheduleKind kind, int p, int r, int m, int v) {
  std::vector<Action> out;
  auto F = [&](int mb, int c = 0) { out.push_back({ActionKind::forward, mb, c}); };
  auto B = [&](int mb, int c = 0) { out.push_back({ActionKind::backward, mb, c}); };
  switch (kind) {
    case ScheduleKind::gpipe:
      for (int i = 0; i < m; ++i) F(i);
      for (int i = 0; i < m; ++i) B(i);
      break;
    case ScheduleKind::one_f_one_b: {
      const int warmup = std::min(p - r - 1, m);
      for (int i = 0; i < warmup; ++i) F(i);
      for (int i = 0; i < m - warmup; ++i) {
        F(warmup + i);
        B(i);
      }
      for (int i = m - warmup; i < m; ++i) B(i);
      break;
    }
    case ScheduleKind::interleaved: {
      // Megatron-LM's order: the k-th chunk forward of this rank is chunk (k mod pv) / p of
      // micro-batch (k / pv)·p + k mod p; backwards go through the chunks in reverse.
      const int total = m * v, group = p * v;
      auto chunk_of = [&](int k, bool forward) {
        const int c = (k % group) / p;
        return forward ? c : v - 1 - c;
      };
      auto mb_of = [&](int k) { return (k / group) * p + k % p; };
      const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
      for (int k = 0; k < warmup; ++k) F(mb_of(k), chunk_of(k, true));
      for (int k = 0; k < total - warmup; ++k) {
        F(mb_of(warmup + k), chunk_of(warmup + k, true));
        B(mb_of(k), chunk_of(k, false));
      }
      for (int k = total - warmup; k < total; ++k) B(mb_of(k), chunk_of(k, false));
      break;
    }
    case ScheduleKind::zero_bubble: {
      // ZB-H1: 1F1B's forwards and input passes; the weight passes wait r micro-batches
      // (oldest first), then one follows each input pass; the last r close the step.
      const int warmup = std::min(p - r - 1, m);
      int next_w = 0, inputs = 0;
      auto I = [&](int mb) {
        out.push_back({ActionKind::backward_input, mb, 0});
        if (++inputs > r) out.push_back({ActionKind::backward_weight, next_w++, 0});
      };
      for (int i = 0; i < warmup; ++i) F(i);
      for (int i = 0; i < m - warmup; ++i) {
        F(warmup + i);
        I(i);
      }
      for (int i = m - warmup; i < m; ++i) I(i);
      while (next_w < m) out.push_back({ActionKind::backward_weight, next_w++, 0});
      break;
    }
  }
  return out;
}

}  // namespace

std::vector<Action> make_schedule(ScheduleKind kind, int pp, int rank, int m, int v) {
  check_schedule(kind, pp, m, v);
  ATH_CHECK(rank >= 0 && rank < pp, "pipeline schedule", "rank ", rank, " is not a stage of a ", pp, "-stage pipeline");
  const int S = pp * v;
  std::vector<Action> out;
  for (const Action& a : compute_order(kind, pp, rank, m, v)) {
    const int s = a.chunk * pp + rank;  // the virtual stage
    const bool fwd = a.kind == ActionKind::forward;
    const bool bwd = a.kind == ActionKind::backward || a.kind == ActionKind::backward_input;
    if (fwd && s > 0) out.push_back({ActionKind::recv_activation, a.mb, a.chunk});
    if (bwd && s < S - 1) out.push_back({ActionKind::recv_grad, a.mb, a.chunk});
    out.push_back(a);
    if (fwd && s < S - 1) out.push_back({ActionKind::send_activation, a.mb, a.chunk});
    if (bwd && s > 0) out.push_back({ActionKind::send_grad, a.mb, a.chunk});
  }
  return out;
}

std::vector<std::vector<Action>> make_schedules(ScheduleKind kind, int pp, int m, int v) {
  std::vector<std::vector<Action>> all;
  for (int r = 0; r < pp; ++r) all.push_back(make_schedule(kind, pp, r, m, v));
  return all;
}

double Simulation::bubble() const {
  if (ranks.empty() || makespan <= 0) return 0;
  double idle = 0;
  for (const auto& r : ranks) idle += 1.0 - r.busy / makespan;
  return idle / static_cast<double>(ranks.size());
}

Simulation simulate(const std::vector<std::vector<Action>>& lists, int pp, int v, SimulationCosts costs) {
  ATH_CHECK(static_cast<int>(lists.size()) == pp, "pipeline simulate", "got ", lists.size(), " lists for ", pp, " ranks");
  Simulation sim;
  sim.ranks.resize(pp);
  std::vector<size_t> next(pp, 0);
  std::vector<double> clock(pp, 0.0);
  std::vector<int> in_flight(pp, 0);
  std::vector<bool> started(pp, false);
  // (is gradient, receiving virtual stage, micro-batch) -> the time it was sent
  std::map<std::tuple<int, int, int>, double> sent;
  for (;;) {
    bool progress = false, done = true;
    for (int r = 0; r < pp; ++r) {
      bool blocked = false;
      while (!blocked && next[r] < lists[r].size()) {
        const Action& a = lists[r][next[r]];
        const int s = a.chunk * pp + r;
        double dur = 0;
        switch (a.kind) {
          case ActionKind::recv_activation:
          case ActionKind::recv_grad: {
            const bool grad = a.kind == ActionKind::recv_grad;
            auto it = sent.find({grad, s, a.mb});
            if (it == sent.end()) {  // its message is not sent yet
              blocked = true;
              continue;
            }
            clock[r] = std::max(clock[r], it->second);
            sent.erase(it);
            break;
          }
          case ActionKind::send_activation: sent[{0, s + 1, a.mb}] = clock[r]; break;
          case ActionKind::send_grad: sent[{1, s - 1, a.mb}] = clock[r]; break;
          case ActionKind::forward:
            dur = costs.forward;
            sim.ranks[r].peak_in_flight = std::max(sim.ranks[r].peak_in_flight, ++in_flight[r]);
            break;
          case ActionKind::backward:
            dur = costs.backward_input + costs.backward_weight;
            --in_flight[r];
            break;
          case ActionKind::backward_input: dur = costs.backward_input; break;
          case ActionKind::backward_weight:
            dur = costs.backward_weight;
            --in_flight[r];
            break;
        }
        if (dur > 0) {
          if (!started[r]) sim.ranks[r].start = clock[r];
          started[r] = true;
          clock[r] += dur;
          sim.ranks[r].busy += dur;
          sim.ranks[r].end = clock[r];
        }
        ++next[r];
        progress = true;
      }
      if (blocked) done = false;
    }
    if (done) break;
    if (!progress) {
      sim.deadlock = true;
      std::ostringstream o;
      for (int r = 0; r < pp; ++r)
        o << (r ? ", " : "") << "rank " << r << " at " << (next[r] < lists[r].size() ? to_string(lists[r][next[r]]) : "end");
      sim.stuck = o.str();
      return sim;
    }
  }
  for (const auto& r : sim.ranks) sim.makespan = std::max(sim.makespan, r.end);
  return sim;
}

double theoretical_bubble(ScheduleKind kind, int pp, int m, int v) {
  check_schedule(kind, pp, m, v);
  const double p = pp;
  switch (kind) {
    case ScheduleKind::gpipe:
    case ScheduleKind::one_f_one_b: return (p - 1) / (m + p - 1);
    case ScheduleKind::interleaved: return (p - 1) / (static_cast<double>(v) * m + p - 1);
    case ScheduleKind::zero_bubble: return simulate(make_schedules(kind, pp, m, v), pp, v).bubble();
  }
  return 0;
}

}  // namespace athanor::dist
