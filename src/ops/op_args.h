#pragma once
// Argument structs of ops whose kernels live in more than one file (the CPU op file and its
// CUDA twin in src/ops/cuda/): OpCall::args<A>() matches the type exactly, so both files
// must name the same struct. Not public API.
#include <cstdint>
#include <optional>
#include <vector>

#include "athanor/core/rng.h"
#include "athanor/core/tensor.h"
#include "athanor/ops/conv.h"
#include "athanor/ops/loss.h"
#include "backend/cpu/conv.h"
#include "backend/cpu/pool.h"

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
struct MseArgs {
  Reduction reduction = Reduction::mean;
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

// conv2d, max_pool2d / avg_pool2d, batch_norm; and the geometry the CPU op derives from its
// arguments, with its checks (src/ops/conv.cpp, pool.cpp), which the CUDA op reuses.
struct ConvArgs {
  Pair stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};
struct PoolArgs {
  Pair kernel{1, 1}, stride{0, 0}, padding{0, 0};
};
struct BatchNormArgs {
  bool training = true;
  double momentum = 0.1, eps = 1e-5;
};
cpu::Conv2dGeom conv2d_geometry(const Tensor& x, const Tensor& w, const Tensor& b, Pair stride, Pair padding, Pair dilation,
                                int64_t groups);
cpu::Pool2dGeom pool2d_geometry(const char* op, const Tensor& x, Pair kernel, Pair stride, Pair padding);

}  // namespace athanor::detail
