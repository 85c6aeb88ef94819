// where(cond, a, b) and masked_fill(x, mask, value), with broadcasting; the
// backward closures sit beside the forwards. Kernel: cpu::where (src/backend/cpu/unary.cpp).
//
// Invariants: cond/mask must be bool or u8 (non-zero = true); the output dtype is
// promote(a, b) (masked_fill: x's dtype, the value converted to it); operands of
// one element are read in place, others are materialized at the output shape.
#include "athanor/ops/elementwise.h"
#include "athanor/ops/shape.h"
#include "backend/cpu/unary.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
void check_condition(const Tensor& cond, const char* op, const char* arg) {
  detail::check_defined(cond, op, arg);
  ATH_CHECK(cond.dtype() == DType::boolean || cond.dtype() == DType::u8, op, "argument '", arg, "' must be bool or u8, got ",
            cond.describe(),
            Hint{"build the condition with a comparison (gt, lt, eq), or convert it with .to(DType::boolean)"});
}

// cond as contiguous bytes at `shape` (bool and u8 share the byte layout).
Tensor condition_bytes(const Tensor& cond, const Shape& shape) {
  if (cond.sizes() == shape && cond.is_contiguous()) return cond;
  Tensor c = empty(shape, TensorOptions(DType::u8));
  copy_into(c, cond);  // broadcasts; bool -> 0/1
  return c;
}

Tensor at_shape(const Tensor& t, const Shape& shape, DType dt) {
  if (t.sizes() == shape) return detail::to_raw(t, dt);
  Tensor m = empty(shape, TensorOptions(dt));
  copy_into(m, t);  // broadcasts and converts
  return m;
}

// The where kernel on raw tensors (no autograd): out = cond ? a : b at the broadcast shape.
Tensor where_kernel(const Tensor& cond, const Tensor& a_in, const Tensor& b_in, const char* op) {
  const Shape& cs = cond.sizes();
  const Shape& as = a_in.sizes();
  const Shape& bs = b_in.sizes();
  // One broadcast of all three shapes, with an error that names every shape.
  const size_t nd = std::max({cs.size(), as.size(), bs.size()});
  Shape out_shape(nd, 1);
  for (const Shape* s : {&cs, &as, &bs})
    for (size_t i = 0; i < s->size(); ++i) {
      int64_t& o = out_shape[nd - s->size() + i];
      const int64_t v = (*s)[i];
      ATH_CHECK(v == o || v == 1 || o == 1, op, "shapes of condition ", shape_str(cs), ", a ", shape_str(as), " and b ",
                shape_str(bs), " cannot be broadcast together",
                Hint{"sizes must match or be 1 in each dimension (aligned from the right); use reshape/unsqueeze"});
      if (o == 1) o = v;
    }
  const DType dt = promote_types(a_in.dtype(), b_in.dtype());
  Tensor out = empty(out_shape, TensorOptions(dt));
  const int64_t n = out.numel();
  if (n == 0) return out;
  const Tensor c = condition_bytes(cond, out_shape);
  const bool a_scalar = a_in.numel() == 1, b_scalar = b_in.numel() == 1;
  const Tensor a = a_scalar ? detail::to_raw(a_in, dt) : at_shape(a_in, out_shape, dt);
  const Tensor b = b_scalar ? detail::to_raw(b_in, dt) : at_shape(b_in, out_shape, dt);
  dispatch(dt, [&]<class T>() {
    cpu::where<T>(static_cast<const uint8_t*>(c.raw_data()), static_cast<const T*>(a.raw_data()), a_scalar,
                  static_cast<const T*>(b.raw_data()), b_scalar, static_cast<T*>(out.raw_data()), n);
  });
  return out;
}
}  // namespace

// ---- where: y = cond ? a : b
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_condition(cond, "where", "condition");
  detail::check_defined(a, "where", "a");
  detail::check_defined(b, "where", "b");
  Tensor y = where_kernel(cond, a, b, "where");
  const Shape as = a.sizes(), bs = b.sizes();
  return record("where", {cond, a, b}, y, [cs = save(cond, "condition"), as, bs](const Node& n, const Grads& g) {
    // dy/da = [cond], dy/db = [!cond]: route g to the selected side, then undo a/b's broadcast.
    const Tensor c = cs.unpack(n);
    const Tensor zero = scalar_tensor(0.0, TensorOptions(g[0].dtype()));
    Tensor ga, gb;
    if (needs_grad(n, 1)) ga = sum_to(where_kernel(c, g[0], zero, "where backward"), as);
    if (needs_grad(n, 2)) gb = sum_to(where_kernel(c, zero, g[0], "where backward"), bs);
    return Grads{Tensor(), ga, gb};
  });
}

// ---- masked_fill: y = mask ? value : x, at x's shape (mask broadcasts to it)
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  detail::check_defined(x, "masked_fill", "x");
  check_condition(mask, "masked_fill", "mask");
  const Shape bshape = broadcast_shapes(x.sizes(), mask.sizes(), "masked_fill");
  ATH_CHECK(bshape == x.sizes(), "masked_fill", "mask ", mask.describe(), " does not broadcast to the shape of x ",
            x.describe(), " (it would make the result ", shape_str(bshape), ")",
            Hint{"the mask must have x's shape or be broadcastable to it"});
  Tensor y = where_kernel(mask, scalar_tensor(value, TensorOptions(x.dtype())), x, "masked_fill");
  return record("masked_fill", {x, mask}, y, [ms = save(mask, "mask")](const Node& n, const Grads& g) {
    // dy/dx = [!mask]: filled positions get no gradient
    const Tensor zero = scalar_tensor(0.0, TensorOptions(g[0].dtype()));
    return Grads{where_kernel(ms.unpack(n), zero, g[0], "masked_fill backward"), Tensor()};
  });
}

}  // namespace athanor
