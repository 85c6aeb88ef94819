// sum and mean over a set of dims; backward broadcasts the gradient back.
#include "athanor/ops/autocast.h"
#include "athanor/ops/elementwise.h"
#include "athanor/ops/reduction.h"
#include "athanor/ops/shape.h"
#include "backend/cpu/reduce.h"
#include "ops/op_utils.h"

#include <cmath>

namespace athanor {
namespace {


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

// Under autocast (sum/mean are f32-category ops) a bf16/f16 x is read directly into an
// f32 result instead of being cast to a full f32 copy first; the gradient comes back in
// x's dtype, as the cast's backward would give it.
Tensor reduce_lowp_input(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, double scale, const char* op) {
  const Shape out_shape = detail::reduced_shape(x.sizes(), dims, keepdim);
  Tensor out = empty(out_shape, TensorOptions(DType::f32));
  const auto [src, outer, r, inner] = detail::reduce_layout(x, dims);
  if (x.dtype() == DType::bf16)
    cpu::sum_3d_lowp_input(static_cast<const bfloat16*>(src.raw_data()), out.data_ptr<float>(), outer, r, inner, scale);
  else
    cpu::sum_3d_lowp_input(static_cast<const float16*>(src.raw_data()), out.data_ptr<float>(), outer, r, inner, scale);
  const Shape in = x.sizes(), kept = detail::reduced_shape(in, dims, true);
  const DType xdt = x.dtype();
  return record(op, {x}, out, [in, kept, scale, xdt](const Node&, const Grads& g) {
    // Scale the small f32 gradient first, then broadcast and round once into x's dtype:
    // the numbers of the f32 path followed by the cast's backward, with no full f32 copy.
    Tensor gk = reshape(detail::to_raw(g[0], DType::f32), kept);
    if (scale != 1.0) gk = mul(gk, scale);
    return Grads{detail::to_raw(expand(gk, in), xdt)};
  });
}

Tensor reduce(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim, bool is_mean) {
  const char* op = is_mean ? "mean" : "sum";
  const bool read_lowp = autocast_enabled() && x.defined() && is_lowp(x.dtype()) && autocast_target(op, x.dtype()) == DType::f32;
  if (!read_lowp && autocast_needs_cast(op, {x})) return reduce(autocast_input(x, op), dims_in, keepdim, is_mean);
  detail::check_floating(x, op, "x");
  const auto dims = detail::normalize_dims(dims_in, x.dim(), op);
  int64_t count = 1;
  for (int64_t d : dims) count *= x.sizes()[d];
  // The mean over an empty dimension is NaN (0/0), as in PyTorch.
  const double scale = !is_mean ? 1.0 : count > 0 ? 1.0 / static_cast<double>(count) : std::nan("");
  if (read_lowp) return reduce_lowp_input(x, dims, keepdim, scale, op);
  Tensor out = sum_kernel(x, dims, keepdim, scale, op);
  const Shape in = x.sizes(), kept = detail::reduced_shape(in, dims, true);
  return record(op, {x}, out, [in, kept, scale](const Node&, const Grads& g) {
    Tensor gk = reshape(g[0], kept);  // put the reduced dims back as size 1, then broadcast
    Tensor ge = contiguous(expand(gk, in));
    return Grads{scale == 1.0 ? ge : mul(ge, scale)};
  });
}
}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return reduce(x, dims, keepdim, false); }
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return reduce(x, dims, keepdim, true); }

}  // namespace athanor
