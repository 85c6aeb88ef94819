#pragma once
// The doctor's view of one run directory (internal to observe/doctor*.cpp): its settings,
// logged steps and evaluations as records, the health events (recorded, or recomputed
// from the logged steps for runs without run.json), and the facts in run.json.
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "athanor/observe/metrics.h"
#include "athanor/observe/run_settings.h"

namespace athanor::observe::detail {

// A number as the doctor prints it: 4 significant digits, "nan" / "inf" spelled out.
inline std::string fmt(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : "inf";
  std::ostringstream o;
  o.precision(4);
  o << v;
  return o.str();
}

struct RunRecord {
  std::string dir;
  RunSettings settings;
  std::vector<StepMetrics> steps;   // logged steps, in order
  std::vector<EvalMetrics> evals;
  std::vector<HealthEvent> events;  // by step; one per (kind, step)
  bool has_run_info = false;        // run.json: the online monitor saw every step
  double label_entropy = -1;
  int64_t label_classes = 0;
  int64_t global_batch = 0;
  int64_t world_size = 1;
  bool truncated = false;           // the last line of metrics.jsonl or health.jsonl was cut off
  std::string truncated_file;
};

// Reads a run directory (metrics.jsonl required). Raises athanor::Error naming the file and
// line when it is missing or corrupt (a cut-off last line is tolerated).
RunRecord read_run(const std::string& run_dir);

// The doctor's findings: causes, most likely first, each absorbing the events it explains
// (doctor_findings.cpp). `baseline` (may be null) is a run of the same model to compare
// progress per sample with.
std::vector<HealthEvent> find_causes(const RunRecord& run, const RunRecord* baseline);

// Median of the finite losses of the logged steps in [begin, end).
double median_loss(const std::vector<StepMetrics>& steps, size_t begin, size_t end);

}  // namespace athanor::observe::detail
