#pragma once
// The pipeline section of report.html (pipeline-parallel runs): the action timeline of one
// step, one row per rank (from <run_dir>/pipeline_timeline.json, written by the Trainer from
// its own clocks), and the measured bubble fraction next to the schedule's theory.
#include <string>
#include <vector>

namespace athanor::observe {

struct PipelineStepRow {
  double step = 0, bubble = 0, theory = 0;
  std::string schedule;
};

// "" when the run has neither a timeline nor pipeline step records.
std::string pipeline_html(const std::string& run_dir, const std::vector<PipelineStepRow>& steps);

}  // namespace athanor::observe
