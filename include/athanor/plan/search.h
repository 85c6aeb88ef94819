#pragma once
// The strategy search behind `athanor plan`: enumerate the layouts of a model on a cluster,
// prune them with the decision tree (fit in memory first, then communication, then the rest),
// rank what fits by predicted step time.
//
// The tree, as it runs:
//   1. the model fits on one device (tp = pp = 1, ZeRO-0) → data parallel only;
//   2. its model states do not → ZeRO-1/2/3 on the data-parallel dimension;
//   3. a layer does not fit (or ZeRO-3's traffic is too high) → tensor parallel within a node;
//   4. the layers do not fit across the node's devices → pipeline parallel across nodes;
//   5. long context (activations dominate) → sequence parallelism or recompute.
// A layout past a step the tree did not need (tp > 1 when data parallel alone fits) is pruned,
// with that reason; tensor parallelism across nodes is pruned always.
#include <string>
#include <vector>

#include "athanor/plan/cluster.h"
#include "athanor/plan/memory_model.h"
#include "athanor/plan/spec.h"
#include "athanor/plan/time_model.h"

namespace athanor::plan {

struct Candidate {
  Layout layout;
  std::vector<StageMemory> stages;
  int worst_stage = 0;  // the stage with the largest peak
  double peak = 0;      // bytes, the worst stage
  StepTime time;
  std::string rejected;  // "" = fits; else the reason in one line
};

struct SearchOptions {
  int64_t global_batch = 0;  // 0 = the config's (micro × accum × dp of the config's layout, or micro × accum)
  int top = 5;
  bool prune_with_tree = true;
};

struct PlanResult {
  std::vector<Candidate> ranked;    // fits, fastest first
  std::vector<Candidate> rejected;  // the layouts a user would think of, with the reason
  std::vector<std::string> tree;    // the decision tree's path for the best layout
  int64_t global_batch = 0;
  size_t enumerated = 0;
};

Candidate evaluate(const TrainSpec& spec, const Layout& l, const Cluster& c);
// All layouts of the cluster's devices; an Error naming the smallest cluster that would hold
// the model when none fits.
PlanResult search(const TrainSpec& spec, const Cluster& c, const SearchOptions& opts);
// The smallest node count (of the cluster's kind) on which some layout fits; 0 if none up to 65536 nodes.
int smallest_fitting_nodes(const TrainSpec& spec, const Cluster& c, int64_t global_batch);

std::string format_bytes(double bytes);  // "11.2 GiB"
// The ranked table, the rejected layouts and the tree's path, as `athanor plan` prints them.
std::string format_plan(const TrainSpec& spec, const Cluster& c, const PlanResult& r);
std::string format_memory(const TrainSpec& spec, const Candidate& cand);  // per stage, per category, activations in detail
// The best layout as the `dist`/`trainer`/`model` overrides of a training config.
std::string layout_yaml(const TrainSpec& spec, const Layout& l);

}  // namespace athanor::plan
