#pragma once
// Argument structs of ops whose kernels live in more than one file (the CPU op file and its
// CUDA twin in src/ops/cuda/): OpCall::args<A>() matches the type exactly, so both files
// must name the same struct. Not public API.
#include <cstdint>
#include <optional>
#include <vector>

#include "athanor/core/rng.h"
#include "athanor/core/tensor.h"
#include "athanor/ops/loss.h"

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
struct RmsNormArgs {
  Shape normalized_shape;
  double eps = 1e-6;
};
// sum and mean.
struct ReduceArgs {
  std::vector<int64_t> dims;
  bool keepdim = false;
};
struct CrossEntropyArgs {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  Reduction reduction = Reduction::mean;
};

// scaled_dot_product_attention and causal_self_attention.
struct SdpaArgs {
  bool is_causal = false;
  std::optional<double> scale;
  bool enable_gqa = false;
};
struct CsaArgs {
  int64_t n_head = 1;
  std::optional<double> scale;
};

struct DropoutArgs {
  double p = 0.5;
  Generator* gen = nullptr;
};

}  // namespace athanor::detail
