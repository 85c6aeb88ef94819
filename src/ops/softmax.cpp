// softmax and log_softmax over any dim. The kernels work on the last dim of a
// contiguous buffer; another dim is moved last (transpose + contiguous copy) and
// the result moved back, so every output is contiguous in the input's shape.
// Backward reuses the forward output y (saved), never the input:
//   softmax:     dx = y * (g - sum(g * y))     (Jacobian diag(y) - y y^T applied to g)
//   log_softmax: dx = g - exp(y) * sum(g)      (Jacobian I - 1 softmax^T applied to g)
// Under autocast (f32-category ops) a bf16/f16 x is read directly by the kernel, widened
// row by row, rather than cast to a full f32 copy first: y is f32 (and saved), dx is
// written in x's dtype, the numbers those of the cast-then-f32 composition.
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

bool is_lowp(DType d) { return d == DType::bf16 || d == DType::f16; }
template <class Fn> void with_lowp(const Tensor& t, Fn&& fn) {  // fn(L*) for t's 16-bit storage type
  if (t.dtype() == DType::bf16) fn(static_cast<bfloat16*>(t.raw_data()));
  else fn(static_cast<float16*>(t.raw_data()));
}

// Under autocast a bf16/f16 x is read directly (f32 result, dx in x's dtype): see the file comment.
Tensor softmax_lowp_input(const char* name, const Tensor& x, int64_t dim, bool log) {
  const Tensor src = dim_last(x, dim);
  Tensor out = empty(src.sizes(), TensorOptions(DType::f32));
  const int64_t cols = x.dim() == 0 ? 1 : src.size(-1);
  if (x.numel() > 0)
    with_lowp(src, [&](auto* xp) { cpu::softmax_forward_lowp_input(xp, out.data_ptr<float>(), x.numel() / cols, cols, log); });
  Tensor y = undo_dim_last(out, dim);
  if (!any_requires_grad({x})) return y;
  SavedTensor sy = save(y, "result");
  const DType xdt = x.dtype();
  return record(name, {x}, y, [sy, dim, log, xdt](const Node& n, const Grads& g) {
    const Tensor yv = sy.unpack(n);
    const Tensor gs = dim_last(detail::to_raw(g[0], DType::f32), dim), ys = dim_last(yv, dim);
    Tensor dx = empty(ys.sizes(), TensorOptions(xdt));
    const int64_t cols = yv.dim() == 0 ? 1 : ys.size(-1);
    if (yv.numel() > 0)
      with_lowp(dx, [&](auto* dp) {
        cpu::softmax_backward_lowp_dx(gs.data_ptr<float>(), ys.data_ptr<float>(), dp, yv.numel() / cols, cols, log);
      });
    return Grads{undo_dim_last(dx, dim)};
  });
}

Tensor softmax_op(const char* name, const Tensor& x, int64_t dim_in, bool log) {
  if (autocast_enabled() && x.defined() && is_lowp(x.dtype()) && autocast_target(name, x.dtype()) == DType::f32)
    return softmax_lowp_input(name, x, detail::wrap_dim(dim_in, x.dim(), name), log);
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
