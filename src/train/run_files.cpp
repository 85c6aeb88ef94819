// The files of a run (contract in include/athanor/train/run_files.h).
#include "athanor/train/run_files.h"

#include <filesystem>
#include <fstream>

#include "athanor/core/error.h"
#include "athanor/observe/report.h"

namespace athanor::train {
namespace fs = std::filesystem;

RunFiles::RunFiles(std::string run_dir, bool writes) : dir_(std::move(run_dir)), writes_(writes) {}

std::string RunFiles::path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

void RunFiles::create(const std::string& resolved_config) {
  if (!writes_) return;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  ATH_CHECK(!ec, "trainer", "cannot create the run directory '", dir_, "': ", ec.message(), Hint{"check out_dir and the permissions"});
  std::ofstream(path("config.yaml")) << resolved_config;
  // metrics.jsonl is truncated by the first line written, unless a resume keeps it up to the checkpoint.
  std::ofstream(path("metrics.jsonl"), std::ios::app);
}

void RunFiles::append_metrics(const std::string& line) {
  if (!writes_) return;
  if (!metrics_started_) std::ofstream(path("metrics.jsonl"), std::ios::trunc);
  metrics_started_ = true;
  std::ofstream(path("metrics.jsonl"), std::ios::app) << line << "\n";
}

void RunFiles::keep_until(int64_t step) {
  if (!writes_) return;
  for (const char* log : {"metrics.jsonl", "health.jsonl"}) {
    const fs::path mp = path(log);
    if (!fs::exists(mp)) continue;
    std::ifstream in(mp);
    std::string line, kept;
    while (std::getline(in, line)) {
      const auto at = line.find("\"step\":");
      if (at != std::string::npos && std::strtoll(line.c_str() + at + 7, nullptr, 10) > step) continue;
      kept += line + "\n";
    }
    in.close();
    std::ofstream(mp, std::ios::trunc) << kept;
  }
  metrics_started_ = true;
}

void RunFiles::write_text(const std::string& name, const std::string& text) {
  if (!writes_) return;
  const std::string tmp = path(name + ".tmp");
  std::ofstream(tmp) << text;
  fs::rename(tmp, path(name));
}

std::string RunFiles::write_report() const { return observe::write_report(dir_); }

}  // namespace athanor::train
