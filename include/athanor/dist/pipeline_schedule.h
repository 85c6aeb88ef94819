#pragma once
// Pipeline schedules: for each rank of a pipeline, the list of actions it runs in one
// training step. One executor (pipeline_executor.h) runs every schedule; a schedule is data.
//
//   auto acts = dist::make_schedule(dist::ScheduleKind::one_f_one_b, /*pp=*/4, /*rank=*/1, /*m=*/8);
//   for (const auto& a : acts) std::cout << to_string(a) << " ";   // F0 sA0 F1 sA1 F2 sA2 rG0 B0 sG0 …
//
// Terms: p ranks (stages), m micro-batches, v model chunks per rank (interleaved only), so
// S = p·v virtual stages; rank r's chunk c is virtual stage s = c·p + r (Megatron's
// placement: the model goes round the ranks v times). Virtual stage 0 holds the embedding,
// S - 1 the head and the loss.
//
// The schedules:
//  - gpipe: every forward, then every backward (GPipe, Huang et al. 2019). Holds m micro-
//    batches' activations.
//  - one_f_one_b: PipeDream-Flush (Narayanan et al. 2021): rank r runs p - r - 1 forwards,
//    then alternates one forward and one backward, then the remaining backwards. Holds at
//    most p - r micro-batches.
//  - interleaved: Megatron-LM's interleaved 1F1B (Narayanan et al. 2021) with v chunks per
//    rank; forwards go round the chunks in groups of p micro-batches, so m must be a multiple
//    of p. Rank r warms up with 2(p - r - 1) + (v - 1)p chunk forwards.
//  - zero_bubble: ZB-H1 (Qi et al. 2023): 1F1B with each backward split into an input pass
//    (backward_input: the gradient the previous stage waits for) and a weight pass
//    (backward_weight). Rank r delays its weight passes by r micro-batches, so they fill the
//    time it would otherwise wait for gradients at the end of the step, while it holds at
//    most p micro-batches (1F1B's peak, on rank 0).
//
// Each compute action is preceded by the receive it needs and followed by the send it
// produces: recv_activation before a forward (not on virtual stage 0), send_activation after
// it (not on S - 1); recv_grad before a backward/backward_input (not on S - 1), send_grad
// after it (not on 0). A send never waits for its receiver (the executor posts it and moves
// on), so a schedule can stop only at a receive whose message has not been sent: simulate()
// checks that this never happens for a set of lists.
//
// Errors (before any work, naming the numbers): p < 1, m < 1, v < 1, rank outside [0, p), v
// > 1 for a schedule other than interleaved, interleaved with m not a multiple of p.
#include <cstdint>
#include <string>
#include <vector>

namespace athanor::dist {

enum class ScheduleKind { gpipe, one_f_one_b, interleaved, zero_bubble };

// "gpipe", "1f1b", "interleaved", "zb-h1"; parse_schedule also accepts "zero_bubble"/"zbh1"/"one_f_one_b".
const char* schedule_name(ScheduleKind k);
ScheduleKind parse_schedule(const std::string& name);

enum class ActionKind {
  forward,
  backward,         // input and weight gradients in one pass
  backward_input,   // the input gradient only (zero_bubble)
  backward_weight,  // the weight gradients of an earlier backward_input (zero_bubble)
  recv_activation,
  send_activation,
  recv_grad,
  send_grad,
};
const char* action_name(ActionKind k);  // "forward", …

struct Action {
  ActionKind kind;
  int mb = 0;     // micro-batch
  int chunk = 0;  // this rank's model chunk (0 unless interleaved)
  bool operator==(const Action&) const = default;
  bool is_compute() const { return kind == ActionKind::forward || kind == ActionKind::backward ||
                                   kind == ActionKind::backward_input || kind == ActionKind::backward_weight; }
};
std::string to_string(const Action& a);  // "F3", "B3", "I3", "W3", "rA3", "sA3", "rG3", "sG3"; chunk c > 0 adds ".c"

// Checks (p, m, v) for `kind` and throws an Error naming what is wrong.
void check_schedule(ScheduleKind kind, int pp, int m, int v);
// Rank `rank`'s actions for one step.
std::vector<Action> make_schedule(ScheduleKind kind, int pp, int rank, int m, int v = 1);
// Every rank's list.
std::vector<std::vector<Action>> make_schedules(ScheduleKind kind, int pp, int m, int v = 1);

// The bubble fraction the schedule's theory gives for equal stages: (p-1)/(m+p-1) for gpipe
// and 1F1B, (p-1)/(v·m+p-1) for interleaved; for zero_bubble the simulated value with equal
// forward, input-backward and weight-backward times (the paper's (p-1)(F+B-W) idle per rank).
double theoretical_bubble(ScheduleKind kind, int pp, int m, int v = 1);

// Runs the lists of every rank with the given durations per chunk (a full backward costs
// backward_input + backward_weight) and no transfer time, sends completing at once.
struct SimulationCosts {
  double forward = 1.0, backward_input = 1.0, backward_weight = 1.0;
};
struct SimulatedRank {
  double busy = 0;           // time computing
  double start = 0, end = 0; // first action's start, last action's end
  int peak_in_flight = 0;    // chunk micro-batches forwarded whose weight gradients are not done yet
};
struct Simulation {
  bool deadlock = false;
  std::string stuck;         // when deadlocked: each rank's next action
  double makespan = 0;
  std::vector<SimulatedRank> ranks;
  double bubble() const;     // mean over ranks of 1 - busy / makespan
};
Simulation simulate(const std::vector<std::vector<Action>>& lists, int pp, int v = 1, SimulationCosts costs = {});

}  // namespace athanor::dist
