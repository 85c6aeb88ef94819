#pragma once
// CUDA paths written without a GPU at hand ("candidates"): each is off until a GPU run has
// proven it, then made the default and its switch removed. ATHANOR_CUDA_CANDIDATES turns them
// on: "all", "none" (or unset), or a comma-separated list of names (candidate_name).
// scripts/gpu_check.sh runs the gpu tests once more with "all", and its speed step times the
// step with and without them, so one device call decides every candidate at once.
//
// Invariants:
//  - a candidate computes what the established path computes, bit for bit unless its header
//    says otherwise: the gpu tests compare the two in one process (CandidateOverride);
//  - the environment is read on first use: an unknown name is an Error at the first query,
//    naming the variable and the known names.
#include <cstdint>

namespace athanor::cuda {

enum class Candidate : uint8_t {
  pointwise_vectorized,  // pointwise.cu: contiguous operands in 16-byte vectors, dtypes as template parameters
  lowp_copies,           // the optimizer's bf16/f16 weight copies and layer_norm's autocast output written in-kernel
  cross_entropy_vectorized,  // cross_entropy_vec.h: rows read and written 16 bytes at a time
  norm_vectorized,           // norm_rows_vec.h: layer_norm / rms_norm forward and backward, a warp per row
  attention_cudnn,           // attention_cudnn.h: cuDNN's fused flash attention (forward and backward)
  norm_accumulate_dx,        // layer_norm / rms_norm backward add dx into the gradient waiting at x (the residual stream's)
  count
};

const char* candidate_name(Candidate c);
// The set "all", "none", "" or "a,b" names, as a bit mask over Candidate; an unknown name is an Error.
uint32_t parse_candidates(const char* value);
bool candidate_enabled(Candidate c);

// Sets the enabled set for the scope (tests: the candidate against the established path in one
// process); restores the previous set on exit. Not thread-safe against concurrent kernels' queries
// of the same candidate (the tests set it between steps).
class CandidateOverride {
 public:
  CandidateOverride(Candidate c, bool enabled);
  ~CandidateOverride();
  CandidateOverride(const CandidateOverride&) = delete;
  CandidateOverride& operator=(const CandidateOverride&) = delete;

 private:
  uint32_t prev_;
};

}  // namespace athanor::cuda
