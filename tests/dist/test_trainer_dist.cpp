// Checker for the data-parallel Trainer tests (tests/dist/trainer_dist.cmake runs
// `athanor train` under mpirun with several world sizes and ZeRO stages, then calls this):
//
//   test_trainer_dist compare RUN_A RUN_B RTOL ATOL
//   test_trainer_dist compare_loss RUN_A RUN_B RTOL        every step's loss within RTOL (relative), nothing else
//   test_trainer_dist compare_weights FILE_A FILE_B RTOL ATOL   two safetensors files, tensor by tensor
//   test_trainer_dist traffic RUN DIMENSION BYTES          every step's "comm".DIMENSION.bytes == BYTES exactly
//
// The reference run is an independent 1-process run (dist.backend none) with the
// micro-batch × world of the other, so both train on the same global batches.
// Compares, step by step, the loss, target count and grad norm of metrics.jsonl, the
// final val_loss, and every tensor of model.safetensors: |a - b| <= ATOL + RTOL·|b|.
// Exits 1 naming the first mismatches. Why a tolerance: the ranks' gradients are summed in
// another order than one process sums its batch (f32 rounding), nothing else differs.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include "athanor/ckpt/safetensors.h"
#include "athanor/core/tensor.h"

namespace fs = std::filesystem;
using namespace athanor;

namespace {
struct Record {
  double loss = NAN, grad_norm = NAN, targets = NAN;
};
struct RunLog {
  std::map<long, Record> steps;
  std::map<long, double> val_loss;
};

double field(const std::string& line, const std::string& key) {
  const auto at = line.find("\"" + key + "\":");
  if (at == std::string::npos) return NAN;
  return std::strtod(line.c_str() + at + key.size() + 3, nullptr);
}

RunLog read_log(const fs::path& run) {
  RunLog log;
  std::ifstream in(run / "metrics.jsonl");
  if (!in) {
    std::cerr << "cannot read " << (run / "metrics.jsonl") << "\n";
    std::exit(1);
  }
  std::string line;
  while (std::getline(in, line)) {
    const long step = static_cast<long>(field(line, "step"));
    if (line.find("\"val_loss\":") != std::string::npos) log.val_loss[step] = field(line, "val_loss");
    else if (line.find("\"loss\":") != std::string::npos)
      log.steps[step] = {field(line, "loss"), field(line, "grad_norm"), field(line, "targets")};
  }
  return log;
}

int failures = 0;

// {"comm": {"tp": {"ops": …, "bytes": B, …}}}: B for `dim` in a step line, NaN if absent.
double comm_bytes(const std::string& line, const std::string& dim) {
  const auto c = line.find("\"comm\":");
  if (c == std::string::npos) return NAN;
  const auto d = line.find("\"" + dim + "\":", c);
  if (d == std::string::npos) return NAN;
  const auto b = line.find("\"bytes\":", d);
  return b == std::string::npos ? NAN : std::strtod(line.c_str() + b + 8, nullptr);
}
void check(const std::string& what, double a, double b, double rtol, double atol) {
  if (std::isfinite(a) && std::isfinite(b) && std::fabs(a - b) <= atol + rtol * std::fabs(b)) return;
  if (++failures <= 20) std::printf("MISMATCH %s: %.9g vs %.9g (|diff| %.3g)\n", what.c_str(), a, b, std::fabs(a - b));
}
}  // namespace

int compare_weights(const fs::path& a, const fs::path& b, double rtol, double atol);

int compare_loss(const fs::path& a, const fs::path& b, double rtol) {
  const RunLog la = read_log(a), lb = read_log(b);
  if (la.steps.size() != lb.steps.size() || la.steps.empty()) {
    std::printf("MISMATCH: %zu step records vs %zu\n", la.steps.size(), lb.steps.size());
    return 1;
  }
  double worst = 0;
  for (const auto& [step, ra] : la.steps) {
    if (!lb.steps.count(step)) {
      std::printf("MISMATCH: step %ld only in %s\n", step, a.c_str());
      return 1;
    }
    const double want = lb.steps.at(step).loss;
    worst = std::max(worst, std::fabs(ra.loss - want) / std::fabs(want));
    check("step " + std::to_string(step) + " loss", ra.loss, want, rtol, 0);
  }
  std::printf("%s vs %s: %zu steps, max relative loss difference %.3g (allowed %g), %d mismatches\n", a.c_str(), b.c_str(),
              la.steps.size(), worst, rtol, failures);
  return failures ? 1 : 0;
}

int traffic(const fs::path& run, const std::string& dim, double bytes) {
  std::ifstream in(run / "metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"loss\":") == std::string::npos || line.find("\"val_loss\":") != std::string::npos) continue;
    ++steps;
    check("step " + std::to_string(static_cast<long>(field(line, "step"))) + " " + dim + " bytes", comm_bytes(line, dim), bytes, 0, 0);
  }
  std::printf("%s: %d steps, %s bytes per step expected %.17g, %d mismatches\n", run.c_str(), steps, dim.c_str(), bytes, failures);
  return failures || steps == 0 ? 1 : 0;
}

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "compare_loss" && argc == 5) return compare_loss(argv[2], argv[3], std::atof(argv[4]));
  if (cmd == "compare_weights" && argc == 6) return compare_weights(argv[2], argv[3], std::atof(argv[4]), std::atof(argv[5]));
  if (cmd == "traffic" && argc == 5) return traffic(argv[2], argv[3], std::atof(argv[4]));
  if (argc != 6 || cmd != "compare") {
    std::cerr << "usage: " << argv[0] << " compare RUN_A RUN_B RTOL ATOL | compare_loss RUN_A RUN_B RTOL | "
              << "compare_weights FILE_A FILE_B RTOL ATOL | traffic RUN DIMENSION BYTES\n";
    return 2;
  }
  const fs::path a = argv[2], b = argv[3];
  const double rtol = std::atof(argv[4]), atol = std::atof(argv[5]);
  const RunLog la = read_log(a), lb = read_log(b);
  if (la.steps.size() != lb.steps.size() || la.steps.empty()) {
    std::printf("MISMATCH: %zu step records vs %zu\n", la.steps.size(), lb.steps.size());
    return 1;
  }
  for (const auto& [step, ra] : la.steps) {
    if (!lb.steps.count(step)) {
      std::printf("MISMATCH: step %ld only in %s\n", step, a.c_str());
      return 1;
    }
    const Record& rb = lb.steps.at(step);
    check("step " + std::to_string(step) + " loss", ra.loss, rb.loss, rtol, atol);
    check("step " + std::to_string(step) + " grad_norm", ra.grad_norm, rb.grad_norm, rtol, atol);
    check("step " + std::to_string(step) + " targets", ra.targets, rb.targets, 0, 0);
  }
  for (const auto& [step, v] : lb.val_loss)
    if (la.val_loss.count(step)) check("val_loss at step " + std::to_string(step), la.val_loss.at(step), v, rtol, atol);
  // A resumed run also keeps the evaluation its first part ended with: require the final one in both.
  if (lb.val_loss.empty() || !la.val_loss.count(lb.val_loss.rbegin()->first)) {
    std::printf("MISMATCH: the final evaluation is missing (%zu eval records vs %zu)\n", la.val_loss.size(), lb.val_loss.size());
    ++failures;
  }

  const int weights = compare_weights(a / "model.safetensors", b / "model.safetensors", rtol, atol);
  std::printf("%s vs %s: %zu steps, %d mismatches (rtol %g, atol %g)\n", a.c_str(), b.c_str(), la.steps.size(), failures, rtol, atol);
  return failures || weights ? 1 : 0;
}

int compare_weights(const fs::path& a, const fs::path& b, double rtol, double atol) {
  const auto wa = ckpt::load_safetensors(a.string());
  const auto wb = ckpt::load_safetensors(b.string());
  std::map<std::string, Tensor> tb(wb.tensors.begin(), wb.tensors.end());
  if (wa.tensors.size() != tb.size() || tb.empty()) {
    std::printf("MISMATCH: %zu tensors vs %zu\n", wa.tensors.size(), tb.size());
    return 1;
  }
  double max_diff = 0;
  for (const auto& [name, ta] : wa.tensors) {
    if (!tb.count(name)) {
      std::printf("MISMATCH: tensor %s only in %s\n", name.c_str(), a.c_str());
      return 1;
    }
    const auto va = ta.to_vector(), vb = tb.at(name).to_vector();
    if (va.size() != vb.size()) {
      std::printf("MISMATCH: %s has %zu elements vs %zu\n", name.c_str(), va.size(), vb.size());
      return 1;
    }
    for (size_t i = 0; i < va.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(va[i] - vb[i]));
      check(name + "[" + std::to_string(i) + "]", va[i], vb[i], rtol, atol);
    }
  }
  std::printf("%s vs %s: %zu tensors, max |weight diff| %.3g, %d mismatches (rtol %g, atol %g)\n", a.c_str(), b.c_str(),
              wa.tensors.size(), max_diff, failures, rtol, atol);
  return failures ? 1 : 0;
}
