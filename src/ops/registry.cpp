// The registry's one list of ops (the order `athanor ops` prints them in), the functional
// API's functions that are not ops of their own, and helpers shared by the op definitions.
#include <algorithm>

#include "athanor/ops/registry.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {

const std::vector<const OpDef*>& op_registry() {
  static const std::vector<const OpDef*> ops = {
      // elementwise arithmetic (binary.cpp)
      &ops::add_op(),
      &ops::sub_op(),
      &ops::mul_op(),
      &ops::div_op(),
      &ops::neg_op(),
      // unary math (unary.cpp, where.cpp)
      &ops::exp_op(),
      &ops::log_op(),
      &ops::sqrt_op(),
      &ops::rsqrt_op(),
      &ops::abs_op(),
      &ops::square_op(),
      &ops::pow_op(),
      &ops::clamp_op(),
      &ops::where_op(),
      &ops::masked_fill_op(),
      // activations (activation.cpp)
      &ops::tanh_op(),
      &ops::sigmoid_op(),
      &ops::relu_op(),
      &ops::gelu_op(),
      &ops::silu_op(),
      // reductions (sum.cpp, minmax.cpp, var.cpp)
      &ops::sum_op(),
      &ops::mean_op(),
      &ops::max_op(),
      &ops::min_op(),
      &ops::var_op(),
      // views and copies (shape_views.cpp, slicing.cpp, concat.cpp)
      &ops::view_op(),
      &ops::permute_op(),
      &ops::expand_op(),
      &ops::unsqueeze_op(),
      &ops::clone_op(),
      &ops::cast_op(),
      &ops::slice_op(),
      &ops::split_op(),
      &ops::cat_op(),
      // indexing (indexing.cpp, embedding.cpp)
      &ops::index_select_op(),
      &ops::gather_op(),
      &ops::embedding_op(),
      // linear algebra (linalg.cpp, gelu_linear.cpp, linear_relu.cpp)
      &ops::matmul_op(),
      &ops::linear_op(),
      &ops::gelu_linear_op(),
      &ops::linear_relu_op(),
      &ops::swiglu_op(),  // swiglu.cpp
      // normalization (layer_norm.cpp, rms_norm.cpp, batch_norm.cpp)
      &ops::layer_norm_op(),
      &ops::rms_norm_op(),
      &ops::batch_norm_op(),
      // softmax, losses, dropout (softmax.cpp, cross_entropy.cpp, mse_loss.cpp, dropout.cpp)
      &ops::softmax_op(),
      &ops::log_softmax_op(),
      &ops::cross_entropy_op(),
      &ops::mse_loss_op(),
      &ops::dropout_op(),
      // attention, convolution, pooling (attention.cpp, conv.cpp, pool.cpp)
      &ops::scaled_dot_product_attention_op(),
      &ops::causal_self_attention_op(),
      &ops::rope_op(),  // rope.cpp
      &ops::conv2d_op(),
      &ops::max_pool2d_op(),
      &ops::avg_pool2d_op(),
  };
  return ops;
}

const OpDef* find_op(std::string_view name) {
  for (const OpDef* op : op_registry())
    if (op->name == name) return op;
  return nullptr;
}

const std::vector<ApiFunction>& api_functions() {
  static const std::vector<ApiFunction> fns = {
      // scalar forms and reversed operands of the binary ops
      {"rsub", "sub"},
      {"rdiv", "div"},
      // shape helpers built from the view ops (a copy when a view is impossible)
      {"sum_to", "sum, view"},
      {"reshape", "view, clone"},
      {"flatten", "view, clone"},
      {"transpose", "permute"},
      {"squeeze", "view, clone"},
      {"contiguous", "clone"},
      {"narrow", "slice"},
      {"stack", "unsqueeze, cat"},
      // no gradient: comparisons and indices
      {"eq", ""},
      {"gt", ""},
      {"lt", ""},
      {"argmax", ""},
      {"broadcast_shapes", ""},
  };
  return fns;
}

namespace detail {

Tensor ref64(const Tensor& t) { return t.defined() && is_floating(t.dtype()) ? to_raw(t, DType::f64) : t; }

Tensor ref_gather(const Tensor& x_in, const Shape& out_shape, const std::function<Shape(const Shape&)>& in_coord) {
  const Tensor x = detail::ref64(x_in);
  const std::vector<double> xv = x.to_vector();
  const Shape xst = contiguous_strides(x.sizes());
  std::vector<double> out(static_cast<size_t>(shape_numel(out_shape)));
  Shape oc(out_shape.size(), 0);
  for (size_t k = 0; k < out.size(); ++k) {
    const Shape ic = in_coord(oc);
    int64_t at = 0;
    for (size_t d = 0; d < ic.size(); ++d) at += ic[d] * xst[d];
    out[k] = xv[static_cast<size_t>(at)];
    for (int64_t d = static_cast<int64_t>(oc.size()) - 1; d >= 0; --d) {  // next coordinate, row-major
      if (++oc[d] < out_shape[d]) break;
      oc[d] = 0;
    }
  }
  return from_vector(out, out_shape, TensorOptions(DType::f64));
}
std::vector<OpCase> unary_cases(int scale, const ApiCall& call, double lo, double hi, const std::vector<double>& kinks,
                                double gap) {
  const int64_t s = std::max(scale, 1);
  auto in = [&](const Shape& shape, uint64_t seed, CaseLayout l) {
    return kinks.empty() ? case_uniform(shape, lo, hi, seed, l) : case_away_from(shape, lo, hi, kinks, gap, seed, l);
  };
  return {
      make_case("x [] (0-d)", {in({}, 1, CaseLayout::contiguous)}, call),
      make_case("x [" + std::to_string(7 * s) + "]", {in({7 * s}, 2, CaseLayout::contiguous)}, call),
      make_case("x [" + std::to_string(3 * s) + ", 5] transposed", {in({3 * s, 5}, 3, CaseLayout::transposed)}, call),
      make_case("x [" + std::to_string(2 * s) + ", 3, 4] strided", {in({2 * s, 3, 4}, 4, CaseLayout::strided)}, call),
  };
}

}  // namespace detail
}  // namespace athanor
