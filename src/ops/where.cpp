// where(cond, a, b) and masked_fill(x, mask, value), with broadcasting; the
// backward of each sits below its forward. Kernel: cpu::where (src/backend/cpu/unary.cpp).
//
// Invariants: cond/mask must be bool or u8 (non-zero = true); the output dtype is
// promote(a, b) (masked_fill: x's dtype, the value converted to it); operands of
// one element are read in place, others are materialized at the output shape.
#include "athanor/ops/elementwise.h"
#include "athanor/ops/shape.h"
#include "backend/cpu/unary.h"
#include "athanor/core/rng.h"
#include "ops/op_def.h"
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

using detail::Grads;
using detail::Inputs;

// ---- where: y = cond ? a : b
struct WhereSaved : OpSaved {
  SavedTensor cond;
  Shape as, bs;
};
std::vector<Tensor> where_cpu(OpCall& c) {
  const Tensor &cond = c.in(0), &a = c.in(1), &b = c.in(2);
  check_condition(cond, "where", "condition");
  detail::check_defined(a, "where", "a");
  detail::check_defined(b, "where", "b");
  Tensor y = where_kernel(cond, a, b, "where");
  if (c.records()) {
    WhereSaved& s = c.save<WhereSaved>();
    s.cond = save(cond, "condition"), s.as = a.sizes(), s.bs = b.sizes();
  }
  return {y};
}
Grads where_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  // dy/da = [cond], dy/db = [!cond]: route g to the selected side, then undo a/b's broadcast.
  const WhereSaved& s = saved.as<WhereSaved>();
  const Tensor c = s.cond.unpack(n);
  const Tensor zero = scalar_tensor(0.0, TensorOptions(g[0].dtype()));
  Tensor ga, gb;
  if (needs_grad(n, 1)) ga = sum_to(where_kernel(c, g[0], zero, "where backward"), s.as);
  if (needs_grad(n, 2)) gb = sum_to(where_kernel(c, zero, g[0], "where backward"), s.bs);
  return {Tensor(), ga, gb};
}
std::vector<Tensor> where_reference(OpCall& c) {
  return {cpu::ref::where(c.in(0), detail::ref64(c.in(1)), detail::ref64(c.in(2)))};
}

// ---- masked_fill: y = mask ? value : x, at x's shape (mask broadcasts to it)
struct MaskedFillArgs {
  double value;
};
std::vector<Tensor> masked_fill_cpu(OpCall& c) {
  const Tensor &x = c.in(0), &mask = c.in(1);
  detail::check_defined(x, "masked_fill", "x");
  check_condition(mask, "masked_fill", "mask");
  const Shape bshape = broadcast_shapes(x.sizes(), mask.sizes(), "masked_fill");
  ATH_CHECK(bshape == x.sizes(), "masked_fill", "mask ", mask.describe(), " does not broadcast to the shape of x ",
            x.describe(), " (it would make the result ", shape_str(bshape), ")",
            Hint{"the mask must have x's shape or be broadcastable to it"});
  Tensor y = where_kernel(mask, scalar_tensor(c.args<MaskedFillArgs>().value, TensorOptions(x.dtype())), x, "masked_fill");
  if (c.records()) c.save<detail::SavedOne>().t = save(mask, "mask");
  return {y};
}
Grads masked_fill_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  // dy/dx = [!mask]: filled positions get no gradient
  const Tensor zero = scalar_tensor(0.0, TensorOptions(g[0].dtype()));
  return {where_kernel(saved.as<detail::SavedOne>().t.unpack(n), zero, g[0], "masked_fill backward"), Tensor()};
}
std::vector<Tensor> masked_fill_reference(OpCall& c) {
  const Tensor x = detail::ref64(c.in(0));
  return {cpu::ref::where(c.in(1), scalar_tensor(c.args<MaskedFillArgs>().value, TensorOptions(DType::f64)), x)};
}

Tensor bools(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  Tensor u = rand(shape, TensorOptions(DType::f64), gen);
  return gt(u, 0.5);
}

std::vector<OpCase> where_cases(int scale) {
  const int64_t s = scale;
  const ApiCall call = [](const Inputs& t) { return Inputs{where(t[0], t[1], t[2])}; };
  return {
      make_case("cond [4, 5], a [4, 5], b [4, 5] transposed",
                {case_fixed(bools({4 * s, 5}, 1)), case_randn({4 * s, 5}, 2), case_randn({4 * s, 5}, 3, CaseLayout::transposed)}, call),
      make_case("cond [3, 1], a [4] (broadcast), b [] (0-d)", {case_fixed(bools({3 * s, 1}, 4)), case_randn({4}, 5), case_randn({}, 6)},
                call),
      make_case("cond [6] strided, a [2, 6], b [6]",
                {case_fixed(bools({6}, 7), CaseLayout::strided), case_randn({2 * s, 6}, 8), case_randn({6}, 9)}, call),
  };
}
std::vector<OpCase> masked_fill_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const MaskedFillArgs& a) { return Inputs{masked_fill(t[0], t[1], a.value)}; };
  return {
      make_case<MaskedFillArgs>("x [4, 5], mask [4, 5]", {case_randn({4 * s, 5}, 1), case_fixed(bools({4 * s, 5}, 2))}, {-2.5}, call),
      make_case<MaskedFillArgs>("x [3, 4] transposed, mask [4] (broadcast)",
                                {case_randn({3 * s, 4}, 3, CaseLayout::transposed), case_fixed(bools({4}, 4))}, {7.0}, call),
      make_case<MaskedFillArgs>("x [2, 3, 2] strided, mask [3, 1]",
                                {case_randn({2 * s, 3, 2}, 5, CaseLayout::strided), case_fixed(bools({3, 1}, 6))}, {0.0}, call),
  };
}
}  // namespace

namespace ops {
const OpDef& where_op() {
  static const OpDef d{.name = "where", .inputs = {"condition", "a", "b"}, .category = AutocastCategory::promote,
                       .kernels = detail::cpu_kernels(where_cpu, where_backward), .reference = where_reference,
                       .dtypes = detail::kFloatDTypes, .cases = where_cases,
                       .derivative = "ga = sum_to(cond ? g : 0), gb = sum_to(cond ? 0 : g)", .file = "src/ops/where.cpp"};
  return d;
}
const OpDef& masked_fill_op() {
  static const OpDef d{.name = "masked_fill", .inputs = {"x", "mask"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(masked_fill_cpu, masked_fill_backward), .reference = masked_fill_reference,
                       .dtypes = detail::kFloatDTypes, .cases = masked_fill_cases,
                       .derivative = "g where mask is false", .file = "src/ops/where.cpp"};
  return d;
}
}  // namespace ops

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) { return call_op(ops::where_op(), {cond, a, b}); }
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  return call_op(ops::masked_fill_op(), {x, mask}, MaskedFillArgs{value});
}

}  // namespace athanor
