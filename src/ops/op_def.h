#pragma once
// What an op file needs to define its registry entry (athanor/ops/registry.h) and the
// harness's inputs (athanor/ops/op_harness.h). Not public API.
#include <array>
#include <functional>
#include <string>
#include <vector>

#include "athanor/autograd/function.h"
#include "athanor/ops/op_harness.h"
#include "athanor/ops/registry.h"

namespace athanor::detail {

using Grads = std::vector<Tensor>;
using Inputs = std::vector<Tensor>;

// The kernels of an op that runs on the CPU only (the CUDA slot left empty).
inline std::array<OpKernels, kDeviceTypes> cpu_kernels(ForwardFn forward, BackwardFn backward) {
  std::array<OpKernels, kDeviceTypes> k{};
  k[device_slot(DeviceType::cpu)] = OpKernels{forward, backward};
  return k;
}

inline const std::vector<DType> kFloatDTypes = {DType::f32, DType::f64, DType::bf16, DType::f16};

// Saved state of the common shapes: one or two saved tensors.
struct SavedOne : OpSaved {
  SavedTensor t;
};
struct SavedTwo : OpSaved {
  SavedTensor a, b;
};

// A contiguous f64 copy of a floating tensor (the references compute in double).
Tensor ref64(const Tensor& t);

// A reference for ops that move elements (views, slices): out[oc] = x[in_coord(oc)] for
// every coordinate oc of out_shape, by plain index arithmetic on x's logical values, in f64.
Tensor ref_gather(const Tensor& x, const Shape& out_shape, const std::function<Shape(const Shape&)>& in_coord);

// The usual harness cases of an elementwise op of one input: a 0-d tensor, 1-D, a transposed
// 2-D and a strided 3-D one, with values uniform in [lo, hi) kept `gap` away from `kinks`.
// `scale` multiplies the leading sizes (perf mode).
std::vector<OpCase> unary_cases(int scale, const ApiCall& call, double lo, double hi,
                                const std::vector<double>& kinks = {}, double gap = 0.05);

// The harness cases of a linear-shaped op fn(x, W, b) (linear, gelu_linear, linear_relu).
std::vector<OpCase> linear_like_cases(int scale, Tensor (*fn)(const Tensor&, const Tensor&, const Tensor&));

}  // namespace athanor::detail

namespace athanor::ops {
// Every op's registry entry, one getter per op, defined beside the op (registry.cpp lists them).
const OpDef& add_op();
const OpDef& sub_op();
const OpDef& mul_op();
const OpDef& div_op();
const OpDef& neg_op();
const OpDef& exp_op();
const OpDef& log_op();
const OpDef& sqrt_op();
const OpDef& rsqrt_op();
const OpDef& abs_op();
const OpDef& square_op();
const OpDef& pow_op();
const OpDef& clamp_op();
const OpDef& where_op();
const OpDef& masked_fill_op();
const OpDef& tanh_op();
const OpDef& sigmoid_op();
const OpDef& relu_op();
const OpDef& gelu_op();
const OpDef& silu_op();
const OpDef& sum_op();
const OpDef& mean_op();
const OpDef& max_op();
const OpDef& min_op();
const OpDef& var_op();
const OpDef& view_op();
const OpDef& permute_op();
const OpDef& expand_op();
const OpDef& unsqueeze_op();
const OpDef& clone_op();
const OpDef& cast_op();
const OpDef& slice_op();
const OpDef& split_op();
const OpDef& cat_op();
const OpDef& index_select_op();
const OpDef& gather_op();
const OpDef& embedding_op();
const OpDef& matmul_op();
const OpDef& linear_op();
const OpDef& gelu_linear_op();
const OpDef& linear_relu_op();
const OpDef& layer_norm_op();
const OpDef& rms_norm_op();
const OpDef& batch_norm_op();
const OpDef& softmax_op();
const OpDef& log_softmax_op();
const OpDef& cross_entropy_op();
const OpDef& mse_loss_op();
const OpDef& dropout_op();
const OpDef& scaled_dot_product_attention_op();
const OpDef& causal_self_attention_op();
const OpDef& rope_op();
const OpDef& swiglu_op();
const OpDef& conv2d_op();
const OpDef& max_pool2d_op();
const OpDef& avg_pool2d_op();
}  // namespace athanor::ops
