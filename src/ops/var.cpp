// var over a set of dims with a correction (1 = Bessel's, 0 = population).
//
// Forward: like sum, the input is viewed as [outer, r, inner] without a copy
// when the reduced dims are one adjacent block of a contiguous tensor;
// otherwise the reduced dims are permuted last ([kept..., reduced...] ->
// [outer, r, 1], one copy). cpu::var_3d is two-pass (mean, then squared
// deviations) and also returns the mean, which backward reuses.
// Backward: var = sum_j (x_j - m)^2 / (N - c), and since sum_j (x_j - m) = 0
// the mean's own dependence on x drops out:
//   d var / d x_k = 2 (x_k - m) / (N - c).
#include <algorithm>

#include "athanor/ops/elementwise.h"
#include "athanor/ops/reduction.h"
#include "athanor/ops/shape.h"
#include "backend/cpu/minmax.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {


}  // namespace

Tensor var(const Tensor& x, const std::vector<int64_t>& dims_in, int64_t correction, bool keepdim) {
  const char* op = "var";
  detail::check_floating(x, op, "x");
  ATH_CHECK(correction >= 0, op, "correction must be >= 0, got ", correction, " for ", x.describe(),
            Hint{"use correction=1 for the unbiased (sample) variance, 0 for the population variance"});
  const auto dims = detail::normalize_dims(dims_in, x.dim(), op);
  const Shape out_shape = detail::reduced_shape(x.sizes(), dims, keepdim);
  const Shape kept = detail::reduced_shape(x.sizes(), dims, true);

  const auto [src, outer, r, inner] = detail::reduce_layout(x, dims);

  // The mean is kept in the accumulation dtype (f32 for f32/bf16/f16, f64 for f64).
  const DType acc = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor out = empty(out_shape, TensorOptions(x.dtype()));
  Tensor mean = empty(kept, TensorOptions(acc));
  if (outer * inner > 0) {
    dispatch(x.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
        cpu::var_3d<T, A>(static_cast<const T*>(src.raw_data()), static_cast<T*>(out.raw_data()),
                          static_cast<A*>(mean.raw_data()), outer, r, inner, correction);
      }
    });
  }
  if (!any_requires_grad({x})) return out;
  const double scale = 2.0 / static_cast<double>(std::max<int64_t>(r - correction, 0));
  const DType dt = x.dtype();
  return record(op, {x}, out, [sx = save(x, "self"), mean, kept, scale, dt](const Node& n, const Grads& g) {
    // d var / d x = 2 (x - mean) / (N - correction), times the incoming gradient broadcast back.
    const Tensor gk = reshape(g[0], kept);
    Tensor gx = mul(mul(sub(sx.unpack(n), mean), gk), scale);
    return Grads{gx.dtype() == dt ? gx : cast(gx, dt)};
  });
}

}  // namespace athanor
