// mse_loss: (input - target)^2 with reduction none / sum / mean. Shapes must match
// exactly (no broadcasting, as a silent broadcast here is almost always a bug).
// Backward: d/dinput = 2 (input - target) * g (/ numel for mean); d/dtarget = -d/dinput.
#include <limits>

#include "athanor/ops/loss.h"
#include "backend/cpu/cross_entropy.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {

namespace {
using detail::Grads;
using detail::Inputs;

using detail::MseArgs;  // op_args.h: shared with the CUDA kernel (src/ops/cuda/loss.cpp)
struct MseSaved : OpSaved {
  SavedTensor input, target;
  Reduction reduction = Reduction::mean;
};

std::vector<Tensor> mse_loss_cpu(OpCall& c) {
  const char* op = "mse_loss";
  const Tensor &input = c.in(0), &target = c.in(1);
  const Reduction reduction = c.args<MseArgs>().reduction;
  detail::check_mse_args(input, target, op);
  const int64_t n = input.numel();
  const Tensor a = detail::contiguous_raw(input), b = detail::contiguous_raw(target);
  Tensor out;
  if (reduction == Reduction::none) {
    out = empty(input.sizes(), TensorOptions(input.dtype()));
    dispatch(input.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>)
        cpu::mse_forward<T>(static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()),
                            static_cast<T*>(out.raw_data()), n);
    });
  } else {
    double total = 0;
    dispatch(input.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>)
        total = cpu::mse_sum<T>(static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()), n);
    });
    if (reduction == Reduction::mean) total = n > 0 ? total / static_cast<double>(n) : std::numeric_limits<double>::quiet_NaN();
    out = scalar_tensor(total, TensorOptions(input.dtype()));
  }
  if (c.records()) {
    MseSaved& s = c.save<MseSaved>();
    s.input = save(input, "input"), s.target = save(target, "target"), s.reduction = reduction;
  }
  return {out};
}

Grads mse_loss_backward(const Node& nd, const Grads& g, const OpSaved& saved) {
  const MseSaved& s = saved.as<MseSaved>();
  const Tensor av = detail::contiguous_raw(s.input.unpack(nd)), bv = detail::contiguous_raw(s.target.unpack(nd));
  const Tensor gv = detail::to_raw(g[0], av.dtype());
  const int64_t n = av.numel();
  Tensor da = needs_grad(nd, 0) ? empty(av.sizes(), TensorOptions(av.dtype())) : Tensor();
  Tensor db = needs_grad(nd, 1) ? empty(bv.sizes(), TensorOptions(bv.dtype())) : Tensor();
  const int64_t stride = s.reduction == Reduction::none ? 1 : 0;
  const double scale = s.reduction == Reduction::mean ? 1.0 / static_cast<double>(n) : 1.0;
  dispatch(av.dtype(), [&]<class T>() {
    if constexpr (is_float_type_v<T>)
      cpu::mse_backward<T>(static_cast<const T*>(av.raw_data()), static_cast<const T*>(bv.raw_data()),
                           static_cast<const T*>(gv.raw_data()), stride, scale,
                           da.defined() ? static_cast<T*>(da.raw_data()) : nullptr,
                           db.defined() ? static_cast<T*>(db.raw_data()) : nullptr, n);
  });
  return {da, db};
}

std::vector<Tensor> mse_loss_reference(OpCall& c) {
  const Tensor a = detail::ref64(c.in(0)).contiguous(), b = detail::ref64(c.in(1)).contiguous();
  const Reduction r = c.args<MseArgs>().reduction;
  if (r == Reduction::none) {
    Tensor out = empty(a.sizes(), TensorOptions(DType::f64));
    cpu::ref::mse_forward<double>(a.data_ptr<double>(), b.data_ptr<double>(), out.data_ptr<double>(), a.numel());
    return {out};
  }
  double total = cpu::ref::mse_sum<double>(a.data_ptr<double>(), b.data_ptr<double>(), a.numel());
  if (r == Reduction::mean) total /= static_cast<double>(a.numel());
  return {scalar_tensor(total, TensorOptions(DType::f64))};
}

std::vector<OpCase> mse_loss_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const MseArgs& a) { return Inputs{mse_loss(t[0], t[1], a.reduction)}; };
  return {
      make_case<MseArgs>("input [4, 5], target [4, 5], mean", {case_randn({4 * s, 5}, 1), case_randn({4 * s, 5}, 2)}, {}, call),
      make_case<MseArgs>("input [3, 4] transposed, target [3, 4] strided, sum",
                         {case_randn({3 * s, 4}, 3, CaseLayout::transposed), case_randn({3 * s, 4}, 4, CaseLayout::strided)},
                         {Reduction::sum}, call),
      make_case<MseArgs>("input [6], target [6], none", {case_randn({6 * s}, 5), case_randn({6 * s}, 6)}, {Reduction::none}, call),
  };
}
}  // namespace

namespace ops {
const OpDef& mse_loss_op() {
  static const OpDef d{.name = "mse_loss", .inputs = {"input", "target"}, .category = AutocastCategory::f32,
                       .kernels = detail::cpu_kernels(mse_loss_cpu, mse_loss_backward), .reference = mse_loss_reference,
                       .dtypes = detail::kFloatDTypes, .cases = mse_loss_cases,
                       .derivative = "2 (a - b) g (/ n for mean); d/dtarget = -d/dinput", .file = "src/ops/mse_loss.cpp"};
  return d;
}
}  // namespace ops

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  return call_op(ops::mse_loss_op(), {input, target}, MseArgs{reduction});
}

}  // namespace athanor
