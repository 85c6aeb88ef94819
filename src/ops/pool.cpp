// max_pool2d and avg_pool2d: checks, kernels (backend/cpu/pool) and backward.
//   max: dy goes to the first maximum of each window (indices recorded in the forward);
//   avg: dy / (kH kW) goes to every element of the window (count_include_pad = true).
#include <sstream>

#include "athanor/ops/conv.h"
#include "backend/cpu/pool.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {

std::string pair_str(Pair p) {
  std::ostringstream s;
  s << "(" << p[0] << ", " << p[1] << ")";
  return s.str();
}

cpu::Pool2dGeom pool_geom(const char* op, const Tensor& x, Pair kernel, Pair stride, Pair padding) {
  detail::check_floating(x, op, "input");
  ATH_CHECK(x.dim() == 4, op, "input must be 4-D [N, C, H, W], got ", x.describe(),
            Hint{"add a batch dim with unsqueeze(x, 0) for a single image"});
  ATH_CHECK(kernel[0] >= 1 && kernel[1] >= 1, op, "kernel size must be >= 1, got ", pair_str(kernel));
  if (stride[0] == 0 && stride[1] == 0) stride = kernel;  // default: non-overlapping windows
  ATH_CHECK(stride[0] >= 1 && stride[1] >= 1, op, "stride must be >= 1 (or {0, 0} for the kernel size), got ",
            pair_str(stride));
  ATH_CHECK(padding[0] >= 0 && padding[1] >= 0 && 2 * padding[0] <= kernel[0] && 2 * padding[1] <= kernel[1], op,
            "padding must be >= 0 and at most half the kernel size, got padding ", pair_str(padding), " for kernel ",
            pair_str(kernel), Hint{"a window that lies entirely in the padding has no input to pool"});
  cpu::Pool2dGeom g;
  g.N = x.size(0), g.C = x.size(1), g.H = x.size(2), g.W = x.size(3);
  g.KH = kernel[0], g.KW = kernel[1], g.sh = stride[0], g.sw = stride[1], g.ph = padding[0], g.pw = padding[1];
  const int64_t sh = g.H + 2 * g.ph - g.KH, sw = g.W + 2 * g.pw - g.KW;
  g.OH = sh < 0 ? 0 : sh / g.sh + 1;
  g.OW = sw < 0 ? 0 : sw / g.sw + 1;
  ATH_CHECK(g.OH > 0 && g.OW > 0, op, "kernel ", pair_str(kernel), " is larger than the padded input ", x.describe(),
            " with padding ", pair_str(padding), Hint{"use a smaller kernel, more padding, or a larger input"});
  return g;
}
}  // namespace

Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding) {
  const cpu::Pool2dGeom g = pool_geom("max_pool2d", x, kernel, stride, padding);
  const DType dt = x.dtype();
  const Tensor xc = detail::contiguous_raw(x);
  Tensor y = empty({g.N, g.C, g.OH, g.OW}, TensorOptions(dt));
  Tensor idx = empty({g.N, g.C, g.OH, g.OW}, TensorOptions(DType::i64));
  dispatch(dt, [&]<class T>() {
    if constexpr (is_float_type_v<T>) cpu::max_pool2d_forward<T>(xc.data_ptr<T>(), y.data_ptr<T>(), idx.data_ptr<int64_t>(), g);
  });
  if (!any_requires_grad({x})) return y;
  SavedTensor si = save(idx, "indices");
  return record("max_pool2d", {x}, y, [si, g, dt](const Node& n, const Grads& grads) {
    const Tensor iv = si.unpack(n);
    if (!grads[0].defined()) return Grads{Tensor()};
    const Tensor dy = detail::to_raw(grads[0], dt);
    Tensor dx = empty({g.N, g.C, g.H, g.W}, TensorOptions(dt));
    dispatch(dt, [&]<class T>() {  // dx[argmax] += dy
      if constexpr (is_float_type_v<T>) cpu::max_pool2d_backward<T>(dy.data_ptr<T>(), iv.data_ptr<int64_t>(), dx.data_ptr<T>(), g);
    });
    return Grads{dx};
  });
}

Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding) {
  const cpu::Pool2dGeom g = pool_geom("avg_pool2d", x, kernel, stride, padding);
  const DType dt = x.dtype();
  const Tensor xc = detail::contiguous_raw(x);
  Tensor y = empty({g.N, g.C, g.OH, g.OW}, TensorOptions(dt));
  dispatch(dt, [&]<class T>() {
    if constexpr (is_float_type_v<T>) cpu::avg_pool2d_forward<T>(xc.data_ptr<T>(), y.data_ptr<T>(), g);
  });
  if (!any_requires_grad({x})) return y;
  return record("avg_pool2d", {x}, y, [g, dt](const Node& n, const Grads& grads) {
    if (!grads[0].defined()) return Grads{Tensor()};
    const Tensor dy = detail::to_raw(grads[0], dt);
    Tensor dx = empty({g.N, g.C, g.H, g.W}, TensorOptions(dt));
    dispatch(dt, [&]<class T>() {  // dx[window] += dy / (kH kW)
      if constexpr (is_float_type_v<T>) cpu::avg_pool2d_backward<T>(dy.data_ptr<T>(), dx.data_ptr<T>(), g);
    });
    return Grads{dx};
  });
}

}  // namespace athanor
