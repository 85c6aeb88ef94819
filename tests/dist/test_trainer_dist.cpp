// Checker for the data-parallel Trainer tests (tests/dist/trainer_dist.cmake runs
// `athanor train` under mpirun with several world sizes and ZeRO stages, then calls this):
//
//   test_trainer_dist compare RUN_A RUN_B RTOL ATOL
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
void check(const std::string& what, double a, double b, double rtol, double atol) {
  if (std::isfinite(a) && std::isfinite(b) && std::fabs(a - b) <= atol + rtol * std::fabs(b)) return;
  if (++failures <= 20) std::printf("MISMATCH %s: %.9g vs %.9g (|diff| %.3g)\n", what.c_str(), a, b, std::fabs(a - b));
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 6 || std::string(argv[1]) != "compare") {
    std::cerr << "usage: " << argv[0] << " compare RUN_A RUN_B RTOL ATOL\n";
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

  const auto wa = ckpt::load_safetensors((a / "model.safetensors").string());
  const auto wb = ckpt::load_safetensors((b / "model.safetensors").string());
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
  std::printf("%s vs %s: %zu steps, %zu tensors, max |weight diff| %.3g, %d mismatches (rtol %g, atol %g)\n", a.c_str(), b.c_str(),
              la.steps.size(), wa.tensors.size(), max_diff, failures, rtol, atol);
  return failures ? 1 : 0;
}
