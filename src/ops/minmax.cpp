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
#include "ops/op_utils.h"

namespace athanor {
namespace {

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

Tensor minmax_dim(const Tensor& x, int64_t dim, bool keepdim, bool is_max) {
  const char* op = is_max ? "max" : "min";
  check_input(x, op);
  const int64_t d = detail::wrap_dim(dim, x.dim(), op);
  const Geometry geo = geometry(x, d, keepdim);
  ATH_CHECK(geo.r > 0, op, "cannot reduce dimension ", d, " of size 0 in ", x.describe(),
            Hint{"max/min of an empty dimension is undefined; check the shape or use a non-empty dimension"});
  Tensor values = empty(geo.out_shape, TensorOptions(x.dtype()));
  Tensor idx = empty(geo.out_shape, TensorOptions(DType::i64));
  run_minmax(x, geo, &values, idx, is_max);
  if (!is_floating(x.dtype())) return values;
  const Shape in = x.sizes();
  const DType dt = x.dtype();
  // d/dx_k max_j x_j = 1 at the first extremal k, 0 elsewhere: scatter g there.
  return record(op, {x}, values, [idx, in, dt, geo](const Node&, const Grads& g) {
    return Grads{route_gradient(g[0], idx, in, dt, geo)};
  });
}

Tensor minmax_all(const Tensor& x, bool is_max) {
  const char* op = is_max ? "max" : "min";
  check_input(x, op);
  ATH_CHECK(x.numel() > 0, op, "cannot reduce an empty tensor ", x.describe(),
            Hint{"max/min of zero elements is undefined; pass a non-empty tensor"});
  Geometry geo;
  geo.r = x.numel();  // out_shape stays {} (a scalar)
  Tensor values = empty({}, TensorOptions(x.dtype()));
  Tensor idx = empty({}, TensorOptions(DType::i64));
  run_minmax(x, geo, &values, idx, is_max);
  if (!is_floating(x.dtype())) return values;
  const Shape in = x.sizes();
  const DType dt = x.dtype();
  // Same derivative as along a dim, over the flattened input: g lands on the first extremum.
  return record(op, {x}, values, [idx, in, dt, geo](const Node&, const Grads& g) {
    return Grads{route_gradient(g[0], idx, in, dt, geo)};
  });
}

}  // namespace

Tensor max(const Tensor& x, int64_t dim, bool keepdim) { return minmax_dim(x, dim, keepdim, true); }
Tensor min(const Tensor& x, int64_t dim, bool keepdim) { return minmax_dim(x, dim, keepdim, false); }
Tensor max(const Tensor& x) { return minmax_all(x, true); }
Tensor min(const Tensor& x) { return minmax_all(x, false); }

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
