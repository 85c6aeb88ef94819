#pragma once
// The files of a run (DESIGN.md, "Files a run writes"), under <out_dir>/<name>/: config.yaml
// (resolved), metrics.jsonl, report.html, trace.json (profiling), pipeline_timeline.json
// (pipeline parallelism) and the checkpoints/ folder (checkpointer.h). health.jsonl is the
// health monitor's (trainer_health.cpp). Only the process that writes (rank 0 of a run with
// files) touches the disk; the others' calls do nothing.
//
// metrics.jsonl of a fresh run is started anew by its first line; a resumed run keeps the
// lines up to its checkpoint's step (keep_until), so the log reads as one run.
#include <cstdint>
#include <string>

namespace athanor::train {

class RunFiles {
 public:
  RunFiles(std::string run_dir, bool writes);
  const std::string& dir() const { return dir_; }
  bool writes() const { return writes_; }
  std::string path(const std::string& name) const;  // <run_dir>/<name>
  // Creates the directory and writes config.yaml; metrics.jsonl is created empty if absent.
  void create(const std::string& resolved_config);
  void append_metrics(const std::string& json_line);
  // metrics.jsonl and health.jsonl keep only the lines of steps <= step.
  void keep_until(int64_t step);
  void write_text(const std::string& name, const std::string& text);  // replaced atomically enough for a report
  std::string write_report() const;  // report.html from the files; returns its path

 private:
  std::string dir_;
  bool writes_;
  bool metrics_started_ = false;
};

}  // namespace athanor::train
