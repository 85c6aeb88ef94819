// add, sub, mul, div with broadcasting and type promotion; backward beside forward.
#include "athanor/ops/elementwise.h"
#include "athanor/ops/shape.h"
#include "backend/cpu/binary.h"
#include "ops/op_utils.h"

namespace athanor {
using cpu::BinaryOp;

namespace {
const char* op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
    case BinaryOp::div: return "div";
  }
  return "?";
}

// b's shape (leading 1s stripped) equals the trailing dims of `out`: a row broadcast.
bool is_row_of(const Shape& b, const Shape& out) {
  size_t lead = 0;
  while (lead < b.size() && b[lead] == 1) ++lead;
  const size_t n = b.size() - lead;
  if (n == 0 || n > out.size()) return false;
  for (size_t i = 0; i < n; ++i)
    if (b[lead + i] != out[out.size() - n + i]) return false;
  return true;
}

bool is_lowp(DType d) { return d == DType::bf16 || d == DType::f16; }

// f32 op bf16/f16 of one shape (the autocast residual add): the kernel widens the
// 16-bit operand in registers instead of materializing an f32 copy of it.
// Returns an undefined tensor when the case does not apply.
Tensor mixed_same_shape(BinaryOp op, const Tensor& a, const Tensor& b, const Shape& out_shape, DType dt) {
  if (dt != DType::f32 || a.sizes() != out_shape || b.sizes() != out_shape) return Tensor();
  const bool low_is_a = is_lowp(a.dtype()) && b.dtype() == DType::f32;
  const bool low_is_b = is_lowp(b.dtype()) && a.dtype() == DType::f32;
  if (!low_is_a && !low_is_b) return Tensor();
  const Tensor full = detail::contiguous_raw(low_is_a ? b : a), low = detail::contiguous_raw(low_is_a ? a : b);
  Tensor out = empty(out_shape, TensorOptions(DType::f32));
  const float* f = static_cast<const float*>(full.raw_data());
  float* o = static_cast<float*>(out.raw_data());
  if (low.dtype() == DType::bf16)
    cpu::binary_same_mixed<bfloat16>(op, f, static_cast<const bfloat16*>(low.raw_data()), o, out.numel(), low_is_a);
  else
    cpu::binary_same_mixed<float16>(op, f, static_cast<const float16*>(low.raw_data()), o, out.numel(), low_is_a);
  return out;
}

Tensor binary_kernel(BinaryOp op, const Tensor& a_in, const Tensor& b_in) {
  const char* name = op_name(op);
  detail::check_defined(a_in, name, "a");
  detail::check_defined(b_in, name, "b");
  ATH_CHECK(a_in.dtype() != DType::boolean && b_in.dtype() != DType::boolean && a_in.dtype() != DType::u8 &&
                b_in.dtype() != DType::u8,
            name, "arithmetic on ", a_in.describe(), " and ", b_in.describe(), " is not supported",
            Hint{"convert bool/u8 tensors to a floating dtype with .to(DType::f32) first"});
  const Shape out_shape = broadcast_shapes(a_in.sizes(), b_in.sizes(), name);
  const DType dt = promote_types(a_in.dtype(), b_in.dtype());
  if (Tensor mixed = mixed_same_shape(op, a_in, b_in, out_shape, dt); mixed.defined()) return mixed;
  Tensor a = detail::to_raw(a_in, dt), b = detail::to_raw(b_in, dt);
  Tensor out = empty(out_shape, TensorOptions(dt));
  const int64_t n = out.numel();
  if (n == 0) return out;
  dispatch(dt, [&]<class T>() {
    if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, uint8_t>) {
      ATH_ASSERT(false);
    } else {
      T* o = static_cast<T*>(out.raw_data());
      const Shape& as = a.sizes();
      const Shape& bs = b.sizes();
      if (as == bs) {
        cpu::binary_same<T>(op, static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()), o, n);
      } else if (b.numel() == 1 && as == out_shape) {
        cpu::binary_scalar<T>(op, static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()), o, n, false);
      } else if (a.numel() == 1 && bs == out_shape) {
        cpu::binary_scalar<T>(op, static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()), o, n, true);
      } else if (as == out_shape && is_row_of(bs, out_shape)) {
        const int64_t cols = b.numel();
        cpu::binary_row<T>(op, static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()), o, n / cols, cols, false);
      } else if (bs == out_shape && is_row_of(as, out_shape)) {
        const int64_t cols = a.numel();
        cpu::binary_row<T>(op, static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()), o, n / cols, cols, true);
      } else {  // general broadcast: materialize both operands at the output shape
        Tensor am = empty(out_shape, TensorOptions(dt)), bm = empty(out_shape, TensorOptions(dt));
        copy_into(am, a);
        copy_into(bm, b);
        cpu::binary_same<T>(op, static_cast<const T*>(am.raw_data()), static_cast<const T*>(bm.raw_data()), o, n);
      }
    }
  });
  return out;
}

Tensor scalar_like(const Tensor& a, double s) {
  // A double scalar keeps a floating tensor's dtype; an integer tensor with a
  // fractional scalar is promoted to f32.
  DType dt = a.dtype();
  if (!is_floating(dt) && s != static_cast<double>(static_cast<int64_t>(s))) dt = DType::f32;
  return scalar_tensor(s, TensorOptions(dt));
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_kernel(BinaryOp::add, a, b);
  const Shape as = a.sizes(), bs = b.sizes();
  return record("add", {a, b}, out, [as, bs](const Node& n, const Grads& g) {
    return Grads{needs_grad(n, 0) ? sum_to(g[0], as) : Tensor(), needs_grad(n, 1) ? sum_to(g[0], bs) : Tensor()};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_kernel(BinaryOp::sub, a, b);
  const Shape as = a.sizes(), bs = b.sizes();
  return record("sub", {a, b}, out, [as, bs](const Node& n, const Grads& g) {
    return Grads{needs_grad(n, 0) ? sum_to(g[0], as) : Tensor(), needs_grad(n, 1) ? neg(sum_to(g[0], bs)) : Tensor()};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_kernel(BinaryOp::mul, a, b);
  if (!any_requires_grad({a, b})) return out;
  const Shape as = a.sizes(), bs = b.sizes();
  // d(a*b)/da = b, d(a*b)/db = a: each side saves the other operand only if it is needed.
  SavedTensor sa = b.requires_grad() ? save(a, "self") : SavedTensor();
  SavedTensor sb = a.requires_grad() ? save(b, "other") : SavedTensor();
  return record("mul", {a, b}, out, [as, bs, sa, sb](const Node& n, const Grads& g) {
    Tensor ga, gb;
    if (needs_grad(n, 0)) ga = sum_to(mul(g[0], sb.unpack(n)), as);
    if (needs_grad(n, 1)) gb = sum_to(mul(g[0], sa.unpack(n)), bs);
    return Grads{ga, gb};
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_kernel(BinaryOp::div, a, b);
  if (!any_requires_grad({a, b})) return out;
  const Shape as = a.sizes(), bs = b.sizes();
  SavedTensor sb = save(b, "other");
  SavedTensor so = b.requires_grad() ? save(out, "result") : SavedTensor();
  return record("div", {a, b}, out, [as, bs, sb, so](const Node& n, const Grads& g) {
    Tensor ga, gb;
    const Tensor bv = sb.unpack(n);
    if (needs_grad(n, 0)) ga = sum_to(div(g[0], bv), as);                            // d(a/b)/da = 1/b
    if (needs_grad(n, 1)) gb = sum_to(neg(div(mul(g[0], so.unpack(n)), bv)), bs);  // d(a/b)/db = -(a/b)/b
    return Grads{ga, gb};
  });
}

Tensor add(const Tensor& a, double b) { return add(a, scalar_like(a, b)); }
Tensor sub(const Tensor& a, double b) { return sub(a, scalar_like(a, b)); }
Tensor mul(const Tensor& a, double b) { return mul(a, scalar_like(a, b)); }
Tensor div(const Tensor& a, double b) { return div(a, scalar_like(a, b)); }
Tensor rsub(const Tensor& a, double b) { return sub(scalar_like(a, b), a); }
Tensor rdiv(const Tensor& a, double b) { return div(scalar_like(a, b), a); }

}  // namespace athanor

namespace athanor {
// neg is composite: -x = x * (-1), so its kernel and backward are mul's.
Tensor neg(const Tensor& x) { return mul(x, -1.0); }
}  // namespace athanor
