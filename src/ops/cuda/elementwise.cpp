// CUDA kernels of the elementwise ops: add, sub, mul, div with broadcasting and type
// promotion (an f32 op bf16 residual add widens the 16-bit operand in registers), neg, and
// the activations relu, tanh, sigmoid, silu and gelu (tanh and erf forms), in f32, f64, bf16
// and f16, on the one pointwise kernel (src/backend/cuda/pointwise.h): inputs are read in
// place at their strides (transposed, sliced, broadcast), math in f32 (in f64, with the CPU's
// f64 formulas, when an operand is f64), one rounding into the output dtype.
// Backward beside forward, the CPU ops' formulas (src/ops/binary.cpp, activation.cpp):
//   add: (g, g), sub: (g, -g), mul: (g b, g a), div: (g / b, -g y / b), each summed down to
//   its input's shape (sum_to: the deterministic CUDA sum over the broadcast dims);
//   relu: g [y > 0];  tanh: g (1 - y^2);  sigmoid: g y (1 - y);  silu: g s (1 + x (1 - s));
//   gelu: g gelu'(x).
#include "athanor/autograd/function.h"
#include "athanor/ops/activation.h"
#include "athanor/ops/elementwise.h"
#include "athanor/ops/shape.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/device_ops.h"
#include "ops/op_def.h"

namespace athanor::detail {
namespace {
using cuda::PointwiseOp;

struct BinaryCudaSaved : OpSaved {
  Shape as, bs;
  SavedTensor a, b, out;
};

template <PointwiseOp Op> const char* bin_name() {
  return Op == PointwiseOp::add ? "add" : Op == PointwiseOp::sub ? "sub" : Op == PointwiseOp::mul ? "mul" : "div";
}

template <PointwiseOp Op> std::vector<Tensor> binary_cuda(OpCall& c) {
  const char* op = bin_name<Op>();
  const Tensor &a = c.in(0), &b = c.in(1);
  ATH_CHECK(a.defined() && b.defined(), op, "undefined input");
  ATH_CHECK(is_floating(a.dtype()) && is_floating(b.dtype()), op, "arithmetic on ", a.describe(), " and ", b.describe(),
            " is not supported on cuda", Hint{"convert integer and bool tensors to a floating dtype first"});
  check_cuda_dtype_or_f64(op, a, "a");
  check_cuda_dtype_or_f64(op, b, "b");
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), op);
  const DType dt = promote_types(a.dtype(), b.dtype());
  Tensor y = cuda_pointwise(Op, {a, b}, shape, dt);
  if (c.records()) {
    BinaryCudaSaved& s = c.save<BinaryCudaSaved>();
    s.as = a.sizes(), s.bs = b.sizes();
    if constexpr (Op == PointwiseOp::mul) {
      if (c.requires_grad(1)) s.a = save(a, "self");
      if (c.requires_grad(0)) s.b = save(b, "other");
    } else if constexpr (Op == PointwiseOp::div) {
      s.b = save(b, "other");
      if (c.requires_grad(1)) s.out = save(y, "result");
    }
  }
  return {y};
}

Grads add_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const BinaryCudaSaved& s = saved.as<BinaryCudaSaved>();
  return {needs_grad(n, 0) ? sum_to(g[0], s.as) : Tensor(), needs_grad(n, 1) ? sum_to(g[0], s.bs) : Tensor()};
}
Grads sub_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const BinaryCudaSaved& s = saved.as<BinaryCudaSaved>();
  return {needs_grad(n, 0) ? sum_to(g[0], s.as) : Tensor(), needs_grad(n, 1) ? neg(sum_to(g[0], s.bs)) : Tensor()};
}
Grads mul_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const BinaryCudaSaved& s = saved.as<BinaryCudaSaved>();
  return {needs_grad(n, 0) ? sum_to(mul(g[0], s.b.unpack(n)), s.as) : Tensor(),
          needs_grad(n, 1) ? sum_to(mul(g[0], s.a.unpack(n)), s.bs) : Tensor()};
}
Grads div_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const BinaryCudaSaved& s = saved.as<BinaryCudaSaved>();
  const Tensor bv = s.b.unpack(n);
  return {needs_grad(n, 0) ? sum_to(div(g[0], bv), s.as) : Tensor(),
          needs_grad(n, 1) ? sum_to(neg(div(mul(g[0], s.out.unpack(n)), bv)), s.bs) : Tensor()};
}

std::vector<Tensor> neg_cuda(OpCall& c) {
  const Tensor& x = c.in(0);
  check_cuda_dtype_or_f64("neg", x, "x");
  return {cuda_pointwise(PointwiseOp::scale, {x}, x.sizes(), x.dtype(), -1.0f)};
}
Grads neg_backward_cuda(const Node&, const Grads& g, const OpSaved&) { return {neg(g[0])}; }

struct ActCudaSaved : OpSaved {
  PointwiseOp backward = PointwiseOp::relu_backward;
  SavedTensor t;  // relu: the output; gelu: the input
};

// relu, tanh, sigmoid: the derivative is a function of the output y; silu: of the input x.
template <PointwiseOp F, PointwiseOp B, bool SaveOutput> std::vector<Tensor> act_cuda(OpCall& c) {
  const Tensor& x = c.in(0);
  check_cuda_dtype_or_f64(c.name(), x, "x");
  Tensor y = cuda_pointwise(F, {x}, x.sizes(), x.dtype());
  if (c.records()) {
    ActCudaSaved& s = c.save<ActCudaSaved>();
    s.backward = B;
    s.t = SaveOutput ? save(y, "result") : save(x, "self");
  }
  return {y};
}

std::vector<Tensor> gelu_cuda(OpCall& c) {
  const Tensor& x = c.in(0);
  check_cuda_dtype_or_f64("gelu", x, "x");
  const bool tanh_form = c.args<GeluApprox>() == GeluApprox::tanh;
  Tensor y = cuda_pointwise(tanh_form ? PointwiseOp::gelu_tanh : PointwiseOp::gelu_erf, {x}, x.sizes(), x.dtype());
  if (c.records()) {
    ActCudaSaved& s = c.save<ActCudaSaved>();
    s.backward = tanh_form ? PointwiseOp::gelu_tanh_backward : PointwiseOp::gelu_erf_backward;
    s.t = save(x, "self");
  }
  return {y};
}

// dx = g f'(saved), in the saved tensor's dtype (x's).
Grads act_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const ActCudaSaved& s = saved.as<ActCudaSaved>();
  const Tensor t = s.t.unpack(n);
  return {cuda_pointwise(s.backward, {g[0], t}, t.sizes(), t.dtype())};
}

}  // namespace

void cuda_elementwise_ops(std::vector<CudaOpEntry>& out) {
  out.push_back({"add", {binary_cuda<PointwiseOp::add>, add_backward_cuda}});
  out.push_back({"sub", {binary_cuda<PointwiseOp::sub>, sub_backward_cuda}});
  out.push_back({"mul", {binary_cuda<PointwiseOp::mul>, mul_backward_cuda}});
  out.push_back({"div", {binary_cuda<PointwiseOp::div>, div_backward_cuda}});
  out.push_back({"neg", {neg_cuda, neg_backward_cuda}});
  out.push_back({"relu", {act_cuda<PointwiseOp::relu, PointwiseOp::relu_backward, true>, act_backward_cuda}});
  out.push_back({"tanh", {act_cuda<PointwiseOp::tanh, PointwiseOp::tanh_backward, true>, act_backward_cuda}});
  out.push_back({"sigmoid", {act_cuda<PointwiseOp::sigmoid, PointwiseOp::sigmoid_backward, true>, act_backward_cuda}});
  out.push_back({"silu", {act_cuda<PointwiseOp::silu, PointwiseOp::silu_backward, false>, act_backward_cuda}});
  out.push_back({"gelu", {gelu_cuda, act_backward_cuda}});
}

}  // namespace athanor::detail
