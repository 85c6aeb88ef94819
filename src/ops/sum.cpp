// sum and mean over a set of dims; backward broadcasts the gradient back.
#include "athanor/ops/elementwise.h"
#include "athanor/ops/reduction.h"
#include "athanor/ops/shape.h"
#include "backend/cpu/reduce.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

#include <cmath>

namespace athanor {
namespace {
using detail::Grads;
using detail::Inputs;

// Sum (times `scale`) of x over `dims` (sorted, unique), with keepdim semantics.
Tensor sum_kernel(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, double scale, const char* op) {
  detail::check_floating(x, op, "x");
  const Shape out_shape = detail::reduced_shape(x.sizes(), dims, keepdim);
  Tensor out = empty(out_shape, TensorOptions(x.dtype()));
  const auto [src, outer, r, inner] = detail::reduce_layout(x, dims);
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>)
      cpu::sum_3d<T>(static_cast<const T*>(src.raw_data()), static_cast<T*>(out.raw_data()), outer, r, inner, scale);
  });
  return out;
}

bool is_lowp(DType d) { return d == DType::bf16 || d == DType::f16; }

using detail::ReduceArgs;  // ops/op_args.h: shared with the CUDA kernel (src/ops/cuda/)
struct ReduceSaved : OpSaved {
  Shape in, kept;
  double scale = 1.0;
  DType x_dtype = DType::f32;
  bool lowp_input = false;
};

// Sum (mean: times 1/count) of x over the dims. Under autocast (sum and mean are f32-category
// ops that read bf16/f16 directly, OpDef::reads_lowp) a bf16/f16 x is read straight into an f32
// result instead of being cast to a full f32 copy first; the gradient comes back in x's
// dtype, as the cast's backward would give it.
template <bool Mean> std::vector<Tensor> reduce_cpu(OpCall& c) {
  const Tensor& x = c.in(0);
  const char* op = c.name();
  const ReduceArgs& a = c.args<ReduceArgs>();
  detail::check_floating(x, op, "x");
  const auto dims = detail::normalize_dims(a.dims, x.dim(), op);
  int64_t count = 1;
  for (int64_t d : dims) count *= x.sizes()[d];
  // The mean over an empty dimension is NaN (0/0), as in PyTorch.
  const double scale = !Mean ? 1.0 : count > 0 ? 1.0 / static_cast<double>(count) : std::nan("");
  const bool lowp_input = c.autocast() && is_lowp(x.dtype());
  Tensor out;
  if (lowp_input) {
    out = empty(detail::reduced_shape(x.sizes(), dims, a.keepdim), TensorOptions(DType::f32));
    const auto [src, outer, r, inner] = detail::reduce_layout(x, dims);
    if (x.dtype() == DType::bf16)
      cpu::sum_3d_lowp_input(static_cast<const bfloat16*>(src.raw_data()), out.data_ptr<float>(), outer, r, inner, scale);
    else
      cpu::sum_3d_lowp_input(static_cast<const float16*>(src.raw_data()), out.data_ptr<float>(), outer, r, inner, scale);
  } else {
    out = sum_kernel(x, dims, a.keepdim, scale, op);
  }
  if (c.records()) {
    ReduceSaved& sv = c.save<ReduceSaved>();
    sv.in = x.sizes(), sv.kept = detail::reduced_shape(x.sizes(), dims, true), sv.scale = scale;
    sv.x_dtype = x.dtype(), sv.lowp_input = lowp_input;
  }
  return {out};
}

Grads reduce_backward(const Node&, const Grads& g, const OpSaved& saved) {
  const ReduceSaved& s = saved.as<ReduceSaved>();
  if (s.lowp_input) {
    // Scale the small f32 gradient first, then broadcast and round once into x's dtype:
    // the numbers of the f32 path followed by the cast's backward, with no full f32 copy.
    Tensor gk = reshape(detail::to_raw(g[0], DType::f32), s.kept);
    if (s.scale != 1.0) gk = mul(gk, s.scale);
    return {detail::to_raw(expand(gk, s.in), s.x_dtype)};
  }
  Tensor gk = reshape(g[0], s.kept);  // put the reduced dims back as size 1, then broadcast
  Tensor ge = contiguous(expand(gk, s.in));
  return {s.scale == 1.0 ? ge : mul(ge, s.scale)};
}

template <bool Mean> std::vector<Tensor> reduce_reference(OpCall& c) {
  const Tensor x = detail::ref64(c.in(0));
  const ReduceArgs& a = c.args<ReduceArgs>();
  const auto dims = detail::normalize_dims(a.dims, x.dim(), "reference");
  int64_t count = 1;
  for (int64_t d : dims) count *= x.sizes()[d];
  const auto [src, outer, r, inner] = detail::reduce_layout(x, dims);
  Tensor out = empty(detail::reduced_shape(x.sizes(), dims, a.keepdim), TensorOptions(DType::f64));
  cpu::ref::sum_3d<double>(src.data_ptr<double>(), out.data_ptr<double>(), outer, r, inner,
                           Mean ? 1.0 / static_cast<double>(count) : 1.0);
  return {out};
}

// All dims, the last dim, a middle block kept (keepdim), non-adjacent dims (a permuted copy),
// a 0-d input and negative dims.
template <bool Mean> std::vector<OpCase> reduce_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const ReduceArgs& a) {
    return Inputs{Mean ? mean(t[0], a.dims, a.keepdim) : sum(t[0], a.dims, a.keepdim)};
  };
  return {
      make_case<ReduceArgs>("x [3, 4] transposed, all dims", {case_randn({3 * s, 4}, 1, CaseLayout::transposed)}, {{}, false}, call),
      make_case<ReduceArgs>("x [4, 5], dim -1", {case_randn({4 * s, 5}, 2)}, {{-1}, false}, call),
      make_case<ReduceArgs>("x [2, 3, 4, 2], dims {1, 2} keepdim", {case_randn({2 * s, 3, 4, 2}, 3)}, {{1, 2}, true}, call),
      make_case<ReduceArgs>("x [3, 2, 4] strided, dims {0, 2}", {case_randn({3 * s, 2, 4}, 4, CaseLayout::strided)}, {{0, 2}, false}, call),
      make_case<ReduceArgs>("x [] (0-d), dim 0", {case_randn({}, 5)}, {{0}, false}, call),
  };
}
}  // namespace

namespace ops {
const OpDef& sum_op() {
  static const OpDef d{.name = "sum", .inputs = {"x"}, .category = AutocastCategory::f32, .reads_lowp = 1u,
                       .kernels = detail::cpu_kernels(reduce_cpu<false>, reduce_backward), .reference = reduce_reference<false>,
                       .dtypes = detail::kFloatDTypes, .cases = reduce_cases<false>,
                       .derivative = "g broadcast back over the reduced dims", .file = "src/ops/sum.cpp"};
  return d;
}
const OpDef& mean_op() {
  static const OpDef d{.name = "mean", .inputs = {"x"}, .category = AutocastCategory::f32, .reads_lowp = 1u,
                       .kernels = detail::cpu_kernels(reduce_cpu<true>, reduce_backward), .reference = reduce_reference<true>,
                       .dtypes = detail::kFloatDTypes, .cases = reduce_cases<true>,
                       .derivative = "g / N broadcast back", .file = "src/ops/sum.cpp"};
  return d;
}
}  // namespace ops

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return call_op(ops::sum_op(), {x}, ReduceArgs{dims, keepdim});
}
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return call_op(ops::mean_op(), {x}, ReduceArgs{dims, keepdim});
}

}  // namespace athanor
