// mse_loss: (input - target)^2 with reduction none / sum / mean. Shapes must match
// exactly (no broadcasting, as a silent broadcast here is almost always a bug).
// Backward: d/dinput = 2 (input - target) * g (/ numel for mean); d/dtarget = -d/dinput.
#include <limits>

#include "athanor/ops/loss.h"
#include "backend/cpu/cross_entropy.h"
#include "ops/op_utils.h"

namespace athanor {

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  const char* op = "mse_loss";
  detail::check_floating(input, op, "input");
  detail::check_floating(target, op, "target");
  ATH_CHECK(input.sizes() == target.sizes(), op, "input ", input.describe(), " and target ", target.describe(),
            " must have the same shape",
            Hint{"mse_loss does not broadcast; reshape the target to the input's shape (e.g. unsqueeze a size-1 dim)"});
  detail::check_same_dtype(input, target, op);
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
  if (!any_requires_grad({input, target})) return out;

  SavedTensor si = save(input, "input"), st = save(target, "target");
  return record(op, {input, target}, out, [=](const Node& nd, const Grads& g) {
    const Tensor av = detail::contiguous_raw(si.unpack(nd)), bv = detail::contiguous_raw(st.unpack(nd));
    const Tensor gv = detail::to_raw(g[0], av.dtype());
    Tensor da = needs_grad(nd, 0) ? empty(av.sizes(), TensorOptions(av.dtype())) : Tensor();
    Tensor db = needs_grad(nd, 1) ? empty(bv.sizes(), TensorOptions(bv.dtype())) : Tensor();
    const int64_t stride = reduction == Reduction::none ? 1 : 0;
    const double scale = reduction == Reduction::mean ? 1.0 / static_cast<double>(n) : 1.0;
    dispatch(av.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>)
        cpu::mse_backward<T>(static_cast<const T*>(av.raw_data()), static_cast<const T*>(bv.raw_data()),
                             static_cast<const T*>(gv.raw_data()), stride, scale,
                             da.defined() ? static_cast<T*>(da.raw_data()) : nullptr,
                             db.defined() ? static_cast<T*>(db.raw_data()) : nullptr, n);
    });
    return Grads{da, db};
  });
}

}  // namespace athanor
