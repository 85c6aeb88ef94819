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
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
using detail::Grads;
using detail::Inputs;

struct VarArgs {
  std::vector<int64_t> dims;
  int64_t correction = 1;
  bool keepdim = false;
};
struct VarSaved : OpSaved {
  SavedTensor x;
  Tensor mean;  // internal, in the accumulation dtype
  Shape kept;
  double scale = 0;
  DType dtype = DType::f32;
};

std::vector<Tensor> var_cpu(OpCall& c) {
  const Tensor& x = c.in(0);
  const VarArgs& a = c.args<VarArgs>();
  const char* op = "var";
  detail::check_floating(x, op, "x");
  ATH_CHECK(a.correction >= 0, op, "correction must be >= 0, got ", a.correction, " for ", x.describe(),
            Hint{"use correction=1 for the unbiased (sample) variance, 0 for the population variance"});
  const auto dims = detail::normalize_dims(a.dims, x.dim(), op);
  const Shape out_shape = detail::reduced_shape(x.sizes(), dims, a.keepdim);
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
                          static_cast<A*>(mean.raw_data()), outer, r, inner, a.correction);
      }
    });
  }
  if (c.records()) {
    VarSaved& s = c.save<VarSaved>();
    s.x = save(x, "self"), s.mean = mean, s.kept = kept, s.dtype = x.dtype();
    s.scale = 2.0 / static_cast<double>(std::max<int64_t>(r - a.correction, 0));
  }
  return {out};
}

Grads var_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  // d var / d x = 2 (x - mean) / (N - correction), times the incoming gradient broadcast back.
  const VarSaved& s = saved.as<VarSaved>();
  const Tensor gk = reshape(g[0], s.kept);
  Tensor gx = mul(mul(sub(s.x.unpack(n), s.mean), gk), s.scale);
  return {gx.dtype() == s.dtype ? gx : cast(gx, s.dtype)};
}

std::vector<Tensor> var_reference(OpCall& c) {
  const Tensor x = detail::ref64(c.in(0));
  const VarArgs& a = c.args<VarArgs>();
  const auto dims = detail::normalize_dims(a.dims, x.dim(), "reference");
  const auto [src, outer, r, inner] = detail::reduce_layout(x, dims);
  Tensor out = empty(detail::reduced_shape(x.sizes(), dims, a.keepdim), TensorOptions(DType::f64));
  Tensor mean = empty(detail::reduced_shape(x.sizes(), dims, true), TensorOptions(DType::f64));
  cpu::ref::var_3d<double, double>(src.data_ptr<double>(), out.data_ptr<double>(), mean.data_ptr<double>(), outer, r, inner,
                                   a.correction);
  return {out};
}

std::vector<OpCase> var_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const VarArgs& a) { return Inputs{var(t[0], a.dims, a.correction, a.keepdim)}; };
  return {
      make_case<VarArgs>("x [4, 6], dim 1", {case_randn({4 * s, 6}, 1)}, {{1}, 1, false}, call),
      make_case<VarArgs>("x [3, 5] transposed, all dims, correction 0", {case_randn({3 * s, 5}, 2, CaseLayout::transposed)},
                         {{}, 0, false}, call),
      make_case<VarArgs>("x [2, 3, 4] strided, dims {0, 2} keepdim", {case_randn({2 * s, 3, 4}, 3, CaseLayout::strided)},
                         {{0, 2}, 1, true}, call),
  };
}
}  // namespace

namespace ops {
const OpDef& var_op() {
  static const OpDef d{.name = "var", .inputs = {"x"}, .category = AutocastCategory::f32,
                       .kernels = detail::cpu_kernels(var_cpu, var_backward), .reference = var_reference,
                       .dtypes = detail::kFloatDTypes, .cases = var_cases,
                       .derivative = "g 2 (x - mean) / (N - correction)", .file = "src/ops/var.cpp"};
  return d;
}
}  // namespace ops

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  return call_op(ops::var_op(), {x}, VarArgs{dims, correction, keepdim});
}

}  // namespace athanor
