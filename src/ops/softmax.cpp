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

#include "backend/cpu/softmax.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
using detail::Grads;
using detail::Inputs;

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

using detail::SoftmaxArgs;  // shared with the CUDA kernel (ops/op_args.h)
struct SoftmaxSaved : OpSaved {
  SavedTensor y;
  int64_t dim = 0;
  bool lowp_input = false;  // x was bf16/f16, read directly: dx goes back in that dtype
  DType x_dtype = DType::f32;
};

template <bool Log> std::vector<Tensor> softmax_cpu(OpCall& c) {
  const char* name = c.name();
  const Tensor& x = c.in(0);
  detail::check_floating(x, name, "x");
  const int64_t dim = detail::wrap_dim(c.args<SoftmaxArgs>().dim, x.dim(), name);
  // Under autocast a bf16/f16 x reaches the kernel as it is (OpDef::reads_lowp) and is read
  // directly (f32 result, dx in x's dtype): see the file comment.
  const bool lowp_input = c.autocast() && is_lowp(x.dtype());
  Tensor y;
  if (lowp_input) {
    const Tensor src = dim_last(x, dim);
    Tensor out = empty(src.sizes(), TensorOptions(DType::f32));
    const int64_t cols = x.dim() == 0 ? 1 : src.size(-1);
    if (x.numel() > 0)
      with_lowp(src, [&](auto* xp) { cpu::softmax_forward_lowp_input(xp, out.data_ptr<float>(), x.numel() / cols, cols, Log); });
    y = undo_dim_last(out, dim);
  } else {
    y = softmax_fwd(x, dim, Log);
  }
  if (c.records()) {
    SoftmaxSaved& s = c.save<SoftmaxSaved>();
    s.y = save(y, "result"), s.dim = dim, s.lowp_input = lowp_input, s.x_dtype = x.dtype();
  }
  return {y};
}

template <bool Log> Grads softmax_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const SoftmaxSaved& s = saved.as<SoftmaxSaved>();
  const Tensor yv = s.y.unpack(n);
  if (!s.lowp_input) return {softmax_bwd(g[0], yv, s.dim, Log)};
  const Tensor gs = dim_last(detail::to_raw(g[0], DType::f32), s.dim), ys = dim_last(yv, s.dim);
  Tensor dx = empty(ys.sizes(), TensorOptions(s.x_dtype));
  const int64_t cols = yv.dim() == 0 ? 1 : ys.size(-1);
  if (yv.numel() > 0)
    with_lowp(dx, [&](auto* dp) {
      cpu::softmax_backward_lowp_dx(gs.data_ptr<float>(), ys.data_ptr<float>(), dp, yv.numel() / cols, cols, Log);
    });
  return {undo_dim_last(dx, s.dim)};
}

template <bool Log> std::vector<Tensor> softmax_reference(OpCall& c) {
  const Tensor x = detail::ref64(c.in(0));
  const int64_t dim = detail::wrap_dim(c.args<SoftmaxArgs>().dim, x.dim(), "reference");
  const Tensor src = dim_last(x, dim);
  Tensor out = empty(src.sizes(), TensorOptions(DType::f64));
  const int64_t cols = x.dim() == 0 ? 1 : src.size(-1);
  if (x.numel() > 0) cpu::ref::softmax_forward<double>(src.data_ptr<double>(), out.data_ptr<double>(), x.numel() / cols, cols, Log);
  return {undo_dim_last(out, dim)};
}

template <bool Log> std::vector<OpCase> softmax_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const SoftmaxArgs& a) { return Inputs{Log ? log_softmax(t[0], a.dim) : softmax(t[0], a.dim)}; };
  return {
      make_case<SoftmaxArgs>("x [4, 7], dim -1", {case_randn({4 * s, 7}, 1)}, {-1}, call),
      make_case<SoftmaxArgs>("x [3, 5] transposed, dim 0", {case_randn({3 * s, 5}, 2, CaseLayout::transposed)}, {0}, call),
      make_case<SoftmaxArgs>("x [2, 4, 3] strided, dim 1", {case_randn({2 * s, 4, 3}, 3, CaseLayout::strided)}, {1}, call),
      make_case<SoftmaxArgs>("x [] (0-d), dim 0", {case_randn({}, 4)}, {0}, call),
  };
}
}  // namespace

namespace ops {
const OpDef& softmax_op() {
  static const OpDef d{.name = "softmax", .inputs = {"x"}, .category = AutocastCategory::f32, .reads_lowp = 1u,
                       .kernels = detail::cpu_kernels(softmax_cpu<false>, softmax_backward<false>),
                       .reference = softmax_reference<false>, .dtypes = detail::kFloatDTypes, .cases = softmax_cases<false>,
                       .derivative = "y (g - sum(g y))", .file = "src/ops/softmax.cpp"};
  return d;
}
const OpDef& log_softmax_op() {
  static const OpDef d{.name = "log_softmax", .inputs = {"x"}, .category = AutocastCategory::f32, .reads_lowp = 1u,
                       .kernels = detail::cpu_kernels(softmax_cpu<true>, softmax_backward<true>),
                       .reference = softmax_reference<true>, .dtypes = detail::kFloatDTypes, .cases = softmax_cases<true>,
                       .derivative = "g - exp(y) sum(g)", .file = "src/ops/softmax.cpp"};
  return d;
}
}  // namespace ops

Tensor softmax(const Tensor& x, int64_t dim) { return call_op(ops::softmax_op(), {x}, SoftmaxArgs{dim}); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return call_op(ops::log_softmax_op(), {x}, SoftmaxArgs{dim}); }

}  // namespace athanor
