// add, sub, mul, div with broadcasting and type promotion, and neg; each backward sits
// below its forward, the registry entries (ops::*_op) at the end. Under autocast these are
// `promote` ops: the kernel itself promotes the operands (an f32 op bf16 add of one shape
// widens the bf16 operand in registers, with no f32 copy of it).
#include "athanor/ops/elementwise.h"
#include "athanor/ops/shape.h"
#include "backend/cpu/binary.h"
#include "ops/op_def.h"
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
  // On a's device: a device tensor times a number is one device op (a fill, no host sync).
  return scalar_tensor(s, TensorOptions(dt).with_device(a.device()));
}

using detail::Grads;
using detail::Inputs;

struct BinarySaved : OpSaved {
  Shape as, bs;
  SavedTensor a, b, out;  // what each backward needs (mul: the other operand; div: b and the result)
};

template <BinaryOp Op> std::vector<Tensor> binary_cpu(OpCall& c) {
  Tensor out = binary_kernel(Op, c.in(0), c.in(1));
  if (c.records()) {
    BinarySaved& s = c.save<BinarySaved>();
    s.as = c.in(0).sizes(), s.bs = c.in(1).sizes();
    if constexpr (Op == BinaryOp::mul) {
      // d(a*b)/da = b, d(a*b)/db = a: each side saves the other operand only if it is needed.
      if (c.requires_grad(1)) s.a = save(c.in(0), "self");
      if (c.requires_grad(0)) s.b = save(c.in(1), "other");
    } else if constexpr (Op == BinaryOp::div) {
      s.b = save(c.in(1), "other");
      if (c.requires_grad(1)) s.out = save(out, "result");
    }
  }
  return {out};
}

Grads add_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const BinarySaved& s = saved.as<BinarySaved>();
  return {needs_grad(n, 0) ? sum_to(g[0], s.as) : Tensor(), needs_grad(n, 1) ? sum_to(g[0], s.bs) : Tensor()};
}
Grads sub_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const BinarySaved& s = saved.as<BinarySaved>();
  return {needs_grad(n, 0) ? sum_to(g[0], s.as) : Tensor(), needs_grad(n, 1) ? neg(sum_to(g[0], s.bs)) : Tensor()};
}
Grads mul_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const BinarySaved& s = saved.as<BinarySaved>();
  Tensor ga, gb;
  if (needs_grad(n, 0)) ga = sum_to(mul(g[0], s.b.unpack(n)), s.as);
  if (needs_grad(n, 1)) gb = sum_to(mul(g[0], s.a.unpack(n)), s.bs);
  return {ga, gb};
}
Grads div_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const BinarySaved& s = saved.as<BinarySaved>();
  Tensor ga, gb;
  const Tensor bv = s.b.unpack(n);
  if (needs_grad(n, 0)) ga = sum_to(div(g[0], bv), s.as);                                  // d(a/b)/da = 1/b
  if (needs_grad(n, 1)) gb = sum_to(neg(div(mul(g[0], s.out.unpack(n)), bv)), s.bs);  // d(a/b)/db = -(a/b)/b
  return {ga, gb};
}

template <BinaryOp Op> std::vector<Tensor> binary_reference(OpCall& c) {
  return {cpu::ref::binary(Op, detail::ref64(c.in(0)), detail::ref64(c.in(1)))};
}

// neg: -x, the scalar form of mul's kernel; its backward is -g.
std::vector<Tensor> neg_cpu(OpCall& c) {
  detail::check_defined(c.in(0), "neg", "x");
  return {binary_kernel(BinaryOp::mul, c.in(0), scalar_tensor(-1.0, TensorOptions(c.in(0).dtype())))};
}
Grads neg_backward(const Node&, const Grads& g, const OpSaved&) { return {neg(g[0])}; }
std::vector<Tensor> neg_reference(OpCall& c) {
  return {cpu::ref::binary(BinaryOp::mul, detail::ref64(c.in(0)), scalar_tensor(-1.0, TensorOptions(DType::f64)))};
}

// Same shapes (one transposed), a row broadcast, a scalar on either side, and a general
// broadcast of both operands (one strided). b avoids 0 (div).
std::vector<OpCase> binary_cases(int scale, ApiCall call) {
  const int64_t s = scale;
  auto b = [](const Shape& shape, uint64_t seed, CaseLayout l = CaseLayout::contiguous) {
    return case_away_from(shape, -2, 2, {0.0}, 0.3, seed, l);
  };
  return {
      make_case("a [4, 5], b [4, 5] transposed", {case_randn({4 * s, 5}, 1), b({4 * s, 5}, 2, CaseLayout::transposed)}, call),
      make_case("a [3, 4], b [4] (row broadcast)", {case_randn({3 * s, 4}, 3), b({4}, 4)}, call),
      make_case("a [] (0-d), b [2, 3]", {case_randn({}, 5), b({2 * s, 3}, 6)}, call),
      make_case("a [6], b [] (0-d)", {case_randn({6 * s}, 7), b({}, 8)}, call),
      make_case("a [3, 1, 4] strided, b [2, 1] (both broadcast)",
                {case_randn({3 * s, 1, 4}, 9, CaseLayout::strided), b({2, 1}, 10)}, call),
  };
}

OpDef binary_def(const char* name, ForwardFn fwd, BackwardFn bwd, ForwardFn ref, const char* derivative) {
  return OpDef{.name = name, .inputs = {"a", "b"}, .category = AutocastCategory::promote,
               .kernels = detail::cpu_kernels(fwd, bwd), .reference = ref, .dtypes = detail::kFloatDTypes,
               .derivative = derivative, .file = "src/ops/binary.cpp"};
}
}  // namespace

namespace ops {
const OpDef& add_op() {
  static const OpDef d = [] {
    OpDef o = binary_def("add", binary_cpu<BinaryOp::add>, add_backward, binary_reference<BinaryOp::add>,
                         "ga = sum_to(g), gb = sum_to(g)");
    o.cases = [](int s) { return binary_cases(s, [](const Inputs& t) { return Inputs{add(t[0], t[1])}; }); };
    return o;
  }();
  return d;
}
const OpDef& sub_op() {
  static const OpDef d = [] {
    OpDef o = binary_def("sub", binary_cpu<BinaryOp::sub>, sub_backward, binary_reference<BinaryOp::sub>,
                         "ga = sum_to(g), gb = -sum_to(g)");
    o.cases = [](int s) { return binary_cases(s, [](const Inputs& t) { return Inputs{sub(t[0], t[1])}; }); };
    return o;
  }();
  return d;
}
const OpDef& mul_op() {
  static const OpDef d = [] {
    OpDef o = binary_def("mul", binary_cpu<BinaryOp::mul>, mul_backward, binary_reference<BinaryOp::mul>,
                         "ga = sum_to(g b), gb = sum_to(g a)");
    o.cases = [](int s) { return binary_cases(s, [](const Inputs& t) { return Inputs{mul(t[0], t[1])}; }); };
    return o;
  }();
  return d;
}
const OpDef& div_op() {
  static const OpDef d = [] {
    OpDef o = binary_def("div", binary_cpu<BinaryOp::div>, div_backward, binary_reference<BinaryOp::div>,
                         "ga = sum_to(g / b), gb = -sum_to(g (a / b) / b)");
    o.cases = [](int s) { return binary_cases(s, [](const Inputs& t) { return Inputs{div(t[0], t[1])}; }); };
    return o;
  }();
  return d;
}
const OpDef& neg_op() {
  static const OpDef d{.name = "neg", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(neg_cpu, neg_backward), .reference = neg_reference,
                       .dtypes = detail::kFloatDTypes,
                       .cases = [](int s) { return detail::unary_cases(s, [](const Inputs& t) { return Inputs{neg(t[0])}; }, -3, 3); },
                       .derivative = "-g", .file = "src/ops/binary.cpp"};
  return d;
}
}  // namespace ops

Tensor add(const Tensor& a, const Tensor& b) { return call_op(ops::add_op(), {a, b}); }
Tensor sub(const Tensor& a, const Tensor& b) { return call_op(ops::sub_op(), {a, b}); }
Tensor mul(const Tensor& a, const Tensor& b) { return call_op(ops::mul_op(), {a, b}); }
Tensor div(const Tensor& a, const Tensor& b) { return call_op(ops::div_op(), {a, b}); }
Tensor neg(const Tensor& x) { return call_op(ops::neg_op(), {x}); }

Tensor add(const Tensor& a, double b) { return add(a, scalar_like(a, b)); }
Tensor sub(const Tensor& a, double b) { return sub(a, scalar_like(a, b)); }
Tensor mul(const Tensor& a, double b) { return mul(a, scalar_like(a, b)); }
Tensor div(const Tensor& a, double b) { return div(a, scalar_like(a, b)); }
Tensor rsub(const Tensor& a, double b) { return sub(scalar_like(a, b), a); }
Tensor rdiv(const Tensor& a, double b) { return div(scalar_like(a, b), a); }

}  // namespace athanor
