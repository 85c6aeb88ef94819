#pragma once
// Packed weight copies: a linear's weight kept, next to itself, in the blocked layout
// oneDNN's GEMM kernels read (backend/cpu/weight_packing.h), so the forward (x W^T) and
// input-gradient (dy W) GEMMs skip packing W on every call. Demand-driven:
//  - an op asks for the packed copy of the weight it is about to multiply by
//    (packed_weight); on a miss it runs its plain GEMM and the request is noted;
//  - the optimizer, right after its update pass, calls refresh_packed_weights on the
//    tensors it wrote (parameters and their low-precision copies): every requested
//    copy of them is repacked (one parallel region; each thread packs the rows it just
//    updated) and marked current at the tensor's new version;
//  - a weight seen twice at the same version with no current copy (frozen weights:
//    evaluation, inference, gradient accumulation) is packed by the op itself;
//  - a copy is current only while its tensor has the version it was packed at (every
//    in-place write bumps it): anything else misses and takes the plain path. A copy
//    no op asked for since the last refresh is dropped there (memory comes back).
// The copies belong to the weight: its storage holds them (athanor/core/derived.h, keyed by
// use and the weight's view), they go with it, and none is global. A bf16 persistent copy
// (the Optimizer's low-precision copies) is its own tensor with its own storage and version,
// and holds its own packed copies. Memory: one buffer per (weight, use), tagged
// packed_weights. Switched by the trainer's optimizer.packed_weights; ATHANOR_PACKED_WEIGHTS=0
// turns the whole path off (A/B timing).
#include <cstddef>
#include <vector>

#include "athanor/core/tensor.h"
#include "backend/cpu/weight_packing.h"

namespace athanor::detail {

enum class WeightUse : uint8_t {
  forward,     // y = x W^T: B = W^T
  input_grad,  // dx = dy W: B = W
};

struct PackedWeight {
  const void* data = nullptr;  // null: no current copy, take the plain path
  cpu::PackedLayout layout;
  explicit operator bool() const { return data != nullptr; }
};

// The current packed copy of `w` (2-D, contiguous, f32 or bf16) for `use`, or an empty
// PackedWeight. Call only where the GEMM would run on oneDNN's blocked kernels
// (cpu::gemm_prefers_packed_b): every call counts as a request.
PackedWeight packed_weight(const Tensor& w, WeightUse use);

// One packed copy to rewrite from a weight W [rows, cols] (row stride cols).
struct PackJob {
  cpu::PackedLayout layout;
  bool w_is_bt = false;  // W = B^T (forward), else W = B (input gradient)
  const void* w = nullptr;
  int64_t rows = 0, cols = 0;
  void* dst = nullptr;
  // Packs W's rows [r0, r1) (r0 a multiple of 16, as pack_weight_rows wants).
  void run(int64_t r0, int64_t r1) const { cpu::pack_weight_rows(layout, w_is_bt, w, cols, r0, r1, dst); }
};
// Rewrites the requested copies of these tensors (already written; their versions
// bumped), marks them current at those versions and drops the copies nobody asked for
// since the last refresh. One parallel region (cpu::for_each_chunk): thread t packs the
// t-th share of each weight's rows, the rows a multi-tensor pass wrote on it, in blocks
// the other threads may take over once their own are done.
void refresh_packed_weights(const std::vector<Tensor>& written);

// Drops the copies (and requests) of these tensors: the Optimizer does this for its
// parameters and low-precision copies when it goes away.
void drop_packed_weights(const std::vector<Tensor>& tensors);
std::size_t packed_weight_count(const Tensor& w);  // copies w's storage holds for w (tests, debugging)
struct PackedWeightStats {
  uint64_t hits = 0, misses = 0;  // packed_weight() calls that returned a copy / none
  uint64_t packs_in_ops = 0;      // copies packed by packed_weight() (second sight)
  uint64_t packs_in_refresh = 0;  // copies claimed by refreshes
};
PackedWeightStats packed_weight_stats();  // since the process started (tests)
// On by default. Off, no op packs or reads a copy, and a weight's copies are dropped at its
// next refresh or lookup (or when it goes). ATHANOR_PACKED_WEIGHTS=0 keeps it off for good.
void set_packed_weights_enabled(bool enabled);
bool packed_weights_enabled();

}  // namespace athanor::detail
