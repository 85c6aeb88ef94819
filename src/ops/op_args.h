#pragma once
// Argument structs of ops whose kernels live in more than one file (the CPU op file and its
// CUDA twin in src/ops/cuda/): OpCall::args<A>() matches the type exactly, so both files
// must name the same struct. Not public API.
#include <cstdint>
#include <optional>

#include "athanor/core/rng.h"
#include "athanor/core/tensor.h"

namespace athanor::detail {

struct SoftmaxArgs {
  int64_t dim = -1;
};
struct LayerNormArgs {
  Shape normalized_shape;
  double eps = 1e-5;
};

struct EmbeddingArgs {
  std::optional<int64_t> padding_idx;
};
struct DropoutArgs {
  double p = 0.5;
  Generator* gen = nullptr;
};

}  // namespace athanor::detail
