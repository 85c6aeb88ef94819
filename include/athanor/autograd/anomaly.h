#pragma once
// What anomaly mode found: the first op (forward or backward) whose output held
// a NaN or Inf, with its inputs, so the doctor can report it and save the
// inputs for offline replay.
//
//   clear_anomaly();
//   try { AnomalyModeGuard on; loss = model(batch); loss.backward(); }
//   catch (const Error&) { if (auto a = last_anomaly()) … a->op, a->module_path, a->inputs … }
//
// check_finite() (autograd/function.h) fills the record just before it raises.
// The record is thread-local and keeps only the first anomaly since the last
// clear_anomaly(), so a cascade of NaNs reports its origin.
#include <optional>
#include <string>
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor {

struct AnomalyReport {
  std::string phase;        // "forward" or "backward"
  std::string op;           // op name as in the op table ("linear", "layer_norm", …)
  std::string module_path;  // "transformer.h.7.attn" ('' outside any module)
  size_t output_index = 0;  // which output of the op was non-finite
  std::vector<Tensor> inputs;  // the op's inputs (for backward: the incoming gradients), detached
  Tensor output;               // the offending output, detached
  std::vector<std::string> input_shapes;  // "[8, 128, 512] f32" per input ('undefined' if absent)
  std::vector<std::string> input_stats;   // tensor_stats() of each input
  std::string output_stats;
  std::string message;      // the text of the Error that was raised
};

std::optional<AnomalyReport> last_anomaly();
void clear_anomaly();

}  // namespace athanor
