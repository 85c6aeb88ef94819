#pragma once
// `athanor doctor RUN_DIR`: reads a run directory after the fact (finished,
// stopped or crashed) and says what went wrong and what to try.
//
// Reads config.yaml, metrics.jsonl and health.jsonl (metrics.jsonl is required;
// a truncated last line, as a crash leaves it, is tolerated), re-runs the
// HealthMonitor over the step lines with the run's health.* settings, merges
// its findings with the recorded health events (one per kind and step), and
// prints the run status (finished / stopped early vs trainer.max_steps), the
// loss trend, and each problem with its step, diagnosis and suggestions — or
// "no problems found".
#include <string>
#include <vector>

#include "athanor/observe/metrics.h"

namespace athanor::observe {

struct DoctorReport {
  std::string text;                  // what `athanor doctor` prints
  std::vector<HealthEvent> problems; // merged, by step
  int errors = 0;                    // problems of severity "error"
  bool finished = false;             // last step reached trainer.max_steps
};

// Raises athanor::Error when the directory or its metrics.jsonl is missing or
// unreadable, or a line other than the last is not JSON.
DoctorReport diagnose(const std::string& run_dir);
inline std::string diagnose_run(const std::string& run_dir) { return diagnose(run_dir).text; }

}  // namespace athanor::observe
