// max/min (values, along a dim or over all elements), argmax.
//
// Forward: the input is viewed as [outer, r, inner] around the reduced dim
// (a copy only when it is not contiguous) and cpu::minmax_3d returns the values
// and the index of the FIRST extremal element (NaN propagates). The indices are
// kept for backward; they are internal and cannot be modified by the user.
// Backward: d max_j x_j / d x_k = [k == first argmax], so the gradient is routed
// to the selected element and is zero elsewhere (scatter of g at the indices).
#include "athanor/ops/reduction.h"
#include "athanor/ops/shape.h"
#include "backend/cpu/index.h"
#include "backend/cpu/minmax.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
using detail::Grads;

struct Geometry {
  int64_t outer = 1, r = 1, inner = 1;
  Shape out_shape;  // the result's shape (keepdim applied)
};

// [outer, r, inner] around dim `d` of `x` (a 0-d tensor is [1, 1, 1]).
Geometry geometry(const Tensor& x, int64_t d, bool keepdim) {
  Geometry g;
  if (x.dim() == 0) return g;
  for (int64_t i = 0; i < x.dim(); ++i) {
    const int64_t s = x.sizes()[i];
    if (i < d) g.outer *= s;
    else if (i > d) g.inner *= s;
    else g.r = s;
    if (i != d) g.out_shape.push_back(s);
    else if (keepdim) g.out_shape.push_back(1);
  }
  return g;
}

void check_input(const Tensor& x, const char* op) {
  detail::check_defined(x, op, "x");
  ATH_CHECK(x.dtype() != DType::boolean, op, "is not defined for ", x.describe(),
            Hint{"convert the tensor with .to(DType::u8) or a floating dtype first"});
}

// values (optional) and i64 indices of the extremum of x along geometry `g`.
void run_minmax(const Tensor& x, const Geometry& g, Tensor* values, const Tensor& indices, bool is_max) {
  const Tensor xc = detail::contiguous_raw(x);
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      cpu::minmax_3d<T>(static_cast<const T*>(xc.raw_data()), values ? static_cast<T*>(values->raw_data()) : nullptr,
                        indices.data_ptr<int64_t>(), g.outer, g.r, g.inner, is_max);
    }
  });
}

// Gradient of a selection: gx[o, idx[o, i], i] = g[o, i], zero elsewhere; gx has shape `in` and dtype dt.
Tensor route_gradient(const Tensor& grad, const Tensor& idx, const Shape& in, DType dt, const Geometry& geo) {
  const DType work = dt == DType::f64 ? DType::f64 : DType::f32;  // bf16/f16: scatter in f32, round once
  const Tensor gc = detail::to_raw(grad, work);
  Tensor gx = empty(in, TensorOptions(work));
  dispatch(work, [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
      cpu::scatter_add_3d<T, int64_t>(static_cast<const T*>(gc.raw_data()), idx.data_ptr<int64_t>(),
                                      static_cast<T*>(gx.raw_data()), geo.outer, geo.r, 1, geo.inner);
  });
  return work == dt ? gx : detail::to_raw(gx, dt);
}

struct MinMaxArgs {
  std::optional<int64_t> dim;  // none: over all elements
  bool keepdim = false;
};
struct MinMaxSaved : OpSaved {
  Tensor idx;  // internal: the user cannot modify it
  Shape in;
  DType dtype = DType::f32;
  Geometry geo;
};

// The geometry of a call: around its dim, or the flattened input (out_shape {}) for all elements.
Geometry call_geometry(const Tensor& x, const MinMaxArgs& a, const char* op) {
  if (!a.dim) {
    ATH_CHECK(x.numel() > 0, op, "cannot reduce an empty tensor ", x.describe(),
              Hint{"max/min of zero elements is undefined; pass a non-empty tensor"});
    Geometry geo;
    geo.r = x.numel();
    return geo;
  }
  const int64_t d = detail::wrap_dim(*a.dim, x.dim(), op);
  const Geometry geo = geometry(x, d, a.keepdim);
  ATH_CHECK(geo.r > 0, op, "cannot reduce dimension ", d, " of size 0 in ", x.describe(),
            Hint{"max/min of an empty dimension is undefined; check the shape or use a non-empty dimension"});
  return geo;
}

template <bool IsMax> std::vector<Tensor> minmax_cpu(OpCall& c) {
  const Tensor& x = c.in(0);
  const char* op = c.name();
  check_input(x, op);
  const Geometry geo = call_geometry(x, c.args<MinMaxArgs>(), op);
  Tensor values = empty(geo.out_shape, TensorOptions(x.dtype()));
  Tensor idx = empty(geo.out_shape, TensorOptions(DType::i64));
  run_minmax(x, geo, &values, idx, IsMax);
  if (!is_floating(x.dtype())) c.set_differentiable(false);
  else if (c.records()) {
    MinMaxSaved& s = c.save<MinMaxSaved>();
    s.idx = idx, s.in = x.sizes(), s.dtype = x.dtype(), s.geo = geo;
  }
  return {values};
}
// d/dx_k max_j x_j = 1 at the first extremal k, 0 elsewhere: scatter g there.
Grads minmax_backward(const Node&, const Grads& g, const OpSaved& saved) {
  const MinMaxSaved& s = saved.as<MinMaxSaved>();
  return {route_gradient(g[0], s.idx, s.in, s.dtype, s.geo)};
}
template <bool IsMax> std::vector<Tensor> minmax_reference(OpCall& c) {
  const Tensor x = detail::ref64(c.in(0));
  const Geometry geo = call_geometry(x, c.args<MinMaxArgs>(), "reference");
  Tensor values = empty(geo.out_shape, TensorOptions(DType::f64)), idx = empty(geo.out_shape, TensorOptions(DType::i64));
  cpu::ref::minmax_3d<double>(x.data_ptr<double>(), values.data_ptr<double>(), idx.data_ptr<int64_t>(), geo.outer, geo.r,
                              geo.inner, IsMax);
  return {values};
}
template <bool IsMax> std::vector<OpCase> minmax_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const detail::Inputs& t, const MinMaxArgs& a) {
    if (!a.dim) return detail::Inputs{IsMax ? max(t[0]) : min(t[0])};
    return detail::Inputs{IsMax ? max(t[0], *a.dim, a.keepdim) : min(t[0], *a.dim, a.keepdim)};
  };
  return {
      make_case<MinMaxArgs>("x [4, 5], dim 1", {case_randn({4 * s, 5}, 1)}, {1, false}, call),
      make_case<MinMaxArgs>("x [3, 4, 2] transposed, dim 0 keepdim", {case_randn({3 * s, 4, 2}, 2, CaseLayout::transposed)},
                            {0, true}, call),
      make_case<MinMaxArgs>("x [6, 3] strided, dim -1", {case_randn({6 * s, 3}, 3, CaseLayout::strided)}, {-1, false}, call),
      make_case<MinMaxArgs>("x [3, 4], all elements", {case_randn({3 * s, 4}, 4)}, {std::nullopt, false}, call),
  };
}
}  // namespace

namespace ops {
const OpDef& max_op() {
  static const OpDef d{.name = "max", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(minmax_cpu<true>, minmax_backward), .reference = minmax_reference<true>,
                       .dtypes = detail::kFloatDTypes, .cases = minmax_cases<true>,
                       .derivative = "g to the first maximal element", .file = "src/ops/minmax.cpp"};
  return d;
}
const OpDef& min_op() {
  static const OpDef d{.name = "min", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(minmax_cpu<false>, minmax_backward), .reference = minmax_reference<false>,
                       .dtypes = detail::kFloatDTypes, .cases = minmax_cases<false>,
                       .derivative = "g to the first minimal element", .file = "src/ops/minmax.cpp"};
  return d;
}
}  // namespace ops

Tensor max(const Tensor& x, int64_t dim, bool keepdim) { return call_op(ops::max_op(), {x}, MinMaxArgs{dim, keepdim}); }
Tensor min(const Tensor& x, int64_t dim, bool keepdim) { return call_op(ops::min_op(), {x}, MinMaxArgs{dim, keepdim}); }
Tensor max(const Tensor& x) { return call_op(ops::max_op(), {x}, MinMaxArgs{}); }
Tensor min(const Tensor& x) { return call_op(ops::min_op(), {x}, MinMaxArgs{}); }

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  check_input(x, "argmax");
  const int64_t d = detail::wrap_dim(dim, x.dim(), "argmax");
  const Geometry geo = geometry(x, d, keepdim);
  ATH_CHECK(geo.r > 0, "argmax", "cannot reduce dimension ", d, " of size 0 in ", x.describe(),
            Hint{"argmax of an empty dimension is undefined; check the shape"});
  Tensor idx = empty(geo.out_shape, TensorOptions(DType::i64));
  run_minmax(x, geo, nullptr, idx, true);
  return idx;  // integer: no gradient
}

}  // namespace athanor
