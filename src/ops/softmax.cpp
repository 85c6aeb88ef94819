// softmax and log_softmax over any dim. The kernels work on the last dim of a
// contiguous buffer; another dim is moved last (transpose + contiguous copy) and
// the result moved back, so every output is contiguous in the input's shape.
// Backward reuses the forward output y (saved), never the input:
//   softmax:     dx = y * (g - sum(g * y))     (Jacobian diag(y) - y y^T applied to g)
//   log_softmax: dx = g - exp(y) * sum(g)      (Jacobian I - 1 softmax^T applied to g)
#include "athanor/ops/softmax.h"

#include "athanor/ops/autocast.h"
#include "backend/cpu/softmax.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {

// Raw (unrecorded) view of x with dims `dim` and the last one swapped.
Tensor swap_last(const Tensor& x, int64_t dim) {
  Shape sz = x.sizes(), st = x.strides();
  std::swap(sz[dim], sz.back());
  std::swap(st[dim], st.back());
  return make_view(x, sz, st, x.storage_offset());
}

// Contiguous copy of x with `dim` moved last (x itself when already so laid out).
Tensor dim_last(const Tensor& x, int64_t dim) {
  if (x.dim() == 0 || dim == x.dim() - 1) return detail::contiguous_raw(x);
  return detail::contiguous_raw(swap_last(x, dim));
}
// Inverse of dim_last for a contiguous buffer t: a contiguous tensor in the original layout.
Tensor undo_dim_last(const Tensor& t, int64_t dim) {
  if (t.dim() == 0 || dim == t.dim() - 1) return t;
  return detail::contiguous_raw(swap_last(t, dim));
}

Tensor softmax_fwd(const Tensor& x, int64_t dim, bool log) {
  const Tensor src = dim_last(x, dim);
  Tensor out = empty(src.sizes(), TensorOptions(x.dtype()));
  const int64_t cols = x.dim() == 0 ? 1 : src.size(-1);
  if (x.numel() == 0) return undo_dim_last(out, dim);
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (is_float_type_v<T>)
      cpu::softmax_forward<T>(static_cast<const T*>(src.raw_data()), static_cast<T*>(out.raw_data()), x.numel() / cols,
                              cols, log);
  });
  return undo_dim_last(out, dim);
}

Tensor softmax_bwd(const Tensor& g, const Tensor& y, int64_t dim, bool log) {
  const Tensor gs = dim_last(g.dtype() == y.dtype() ? g : detail::to_raw(g, y.dtype()), dim), ys = dim_last(y, dim);
  Tensor dx = empty(ys.sizes(), TensorOptions(y.dtype()));
  const int64_t cols = y.dim() == 0 ? 1 : ys.size(-1);
  if (y.numel() == 0) return undo_dim_last(dx, dim);
  dispatch(y.dtype(), [&]<class T>() {
    if constexpr (is_float_type_v<T>)
      cpu::softmax_backward<T>(static_cast<const T*>(gs.raw_data()), static_cast<const T*>(ys.raw_data()),
                               static_cast<T*>(dx.raw_data()), y.numel() / cols, cols, log);
  });
  return undo_dim_last(dx, dim);
}

Tensor softmax_op(const char* name, const Tensor& x, int64_t dim_in, bool log) {
  if (autocast_needs_cast(name, {x})) return softmax_op(name, autocast_input(x, name), dim_in, log);
  detail::check_floating(x, name, "x");
  const int64_t dim = detail::wrap_dim(dim_in, x.dim(), name);
  Tensor y = softmax_fwd(x, dim, log);
  if (!any_requires_grad({x})) return y;
  SavedTensor sy = save(y, "result");
  return record(name, {x}, y, [sy, dim, log](const Node& n, const Grads& g) {
    return Grads{softmax_bwd(g[0], sy.unpack(n), dim, log)};
  });
}
}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_op("softmax", x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_op("log_softmax", x, dim, true); }

}  // namespace athanor
