#pragma once
// report.html: one self-contained page (inline SVG and CSS, no scripts, no network)
// for a run directory: a summary, charts of metrics.jsonl, the health events of
// health.jsonl and the resolved config.yaml. Lines that cannot be read (older runs,
// a crash mid-line) are skipped and counted on the page.
#include <string>

namespace athanor::observe {

// Reads <run_dir>/metrics.jsonl (required), health.jsonl and config.yaml (optional),
// writes <run_dir>/report.html and returns its path. Throws athanor::Error when
// run_dir or its metrics.jsonl is missing or report.html cannot be written.
std::string write_report(const std::string& run_dir);

}  // namespace athanor::observe
