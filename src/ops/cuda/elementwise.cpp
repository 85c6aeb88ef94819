// CUDA kernels of the elementwise ops: add, sub, mul (same shapes), neg, gelu (tanh form),
// f32, on src/backend/cuda/elementwise.h. Broadcasting and the other dtypes are "not yet
// supported on cuda" errors given before any launch. Backward beside forward: the gradients
// are the CPU ops' formulas, computed by the same ops on the device.
#include "athanor/autograd/function.h"
#include "athanor/ops/activation.h"
#include "athanor/ops/elementwise.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/runtime.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/op_def.h"

namespace athanor::detail {
namespace {

const float* f32(const Tensor& t) { return static_cast<const float*>(t.device_data()); }
float* f32_mut(const Tensor& t) { return static_cast<float*>(t.device_data()); }

void check_f32(const char* op, const Tensor& t, const char* name) {
  if (t.dtype() != DType::f32)
    cuda_unsupported(op, std::string(name) + " is " + t.describe() + " (the CUDA kernel takes f32)");
}

enum class Bin { add, sub, mul };
template <Bin B> const char* bin_name() { return B == Bin::add ? "add" : B == Bin::sub ? "sub" : "mul"; }

template <Bin B> std::vector<Tensor> binary_cuda(OpCall& c) {
  const char* op = bin_name<B>();
  const Tensor &a = c.in(0), &b = c.in(1);
  check_f32(op, a, "a");
  check_f32(op, b, "b");
  if (a.sizes() != b.sizes())
    cuda_unsupported(op, "broadcasting (a " + a.describe() + ", b " + b.describe() + "); give both the same shape");
  const Tensor ac = cuda_contiguous(a), bc = cuda_contiguous(b);
  Tensor y = empty(a.sizes(), TensorOptions(DType::f32).with_device(a.device()));
  const int dev = cuda_index(c);
  cuda::DeviceGuard g(dev);
  const cudaStream_t s = cuda::compute_stream(dev);
  const int64_t n = y.numel();
  if (n > 0) {
    if constexpr (B == Bin::add) cuda::add(f32(ac), f32(bc), f32_mut(y), n, s);
    if constexpr (B == Bin::mul) cuda::mul(f32(ac), f32(bc), f32_mut(y), n, s);
    if constexpr (B == Bin::sub) {  // a + (-1) b: -b is exact, so the sum rounds once as a - b
      Tensor nb = empty(b.sizes(), TensorOptions(DType::f32).with_device(b.device()).with_tag(MemTag::workspace));
      cuda::scale(f32(bc), -1.0f, f32_mut(nb), n, s);
      cuda::add(f32(ac), f32(nb), f32_mut(y), n, s);
    }
  }
  if constexpr (B == Bin::mul)
    if (c.records()) {
      SavedTwo& sv = c.save<SavedTwo>();
      if (c.requires_grad(1)) sv.a = save(a, "a");
      if (c.requires_grad(0)) sv.b = save(b, "b");
    }
  return {y};
}
// Same shapes: d(a+b) = (g, g), d(a-b) = (g, -g), d(ab) = (g b, g a).
Grads add_backward_cuda(const Node& n, const Grads& g, const OpSaved&) {
  return {needs_grad(n, 0) ? g[0] : Tensor(), needs_grad(n, 1) ? g[0] : Tensor()};
}
Grads sub_backward_cuda(const Node& n, const Grads& g, const OpSaved&) {
  return {needs_grad(n, 0) ? g[0] : Tensor(), needs_grad(n, 1) ? neg(g[0]) : Tensor()};
}
Grads mul_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const SavedTwo& s = saved.as<SavedTwo>();
  return {needs_grad(n, 0) ? mul(g[0], s.b.unpack(n)) : Tensor(), needs_grad(n, 1) ? mul(g[0], s.a.unpack(n)) : Tensor()};
}

std::vector<Tensor> neg_cuda(OpCall& c) {
  const Tensor& x = c.in(0);
  check_f32("neg", x, "x");
  const Tensor xc = cuda_contiguous(x);
  Tensor y = empty(x.sizes(), TensorOptions(DType::f32).with_device(x.device()));
  const int dev = cuda_index(c);
  cuda::DeviceGuard g(dev);
  if (y.numel() > 0) cuda::scale(f32(xc), -1.0f, f32_mut(y), y.numel(), cuda::compute_stream(dev));
  return {y};
}
Grads neg_backward_cuda(const Node&, const Grads& g, const OpSaved&) { return {neg(g[0])}; }

std::vector<Tensor> gelu_cuda(OpCall& c) {
  const Tensor& x = c.in(0);
  check_f32("gelu", x, "x");
  if (c.args<GeluApprox>() != GeluApprox::tanh)
    cuda_unsupported("gelu", "the exact (erf) form; use GeluApprox::tanh (GPT-2's), which has a CUDA kernel");
  const Tensor xc = cuda_contiguous(x);
  Tensor y = empty(x.sizes(), TensorOptions(DType::f32).with_device(x.device()));
  const int dev = cuda_index(c);
  cuda::DeviceGuard g(dev);
  if (y.numel() > 0) cuda::gelu_tanh_forward(f32(xc), f32_mut(y), y.numel(), cuda::compute_stream(dev));
  if (c.records()) c.save<SavedOne>().t = save(xc, "x");
  return {y};
}
// dx = dy gelu'(x) (the kernel's formula, elementwise.h).
Grads gelu_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const Tensor x = saved.as<SavedOne>().t.unpack(n);
  check_f32("gelu backward", g[0], "grad");
  const Tensor dy = cuda_contiguous(g[0]);
  Tensor dx = empty(x.sizes(), TensorOptions(DType::f32).with_device(x.device()));
  const int dev = x.device().index;
  cuda::DeviceGuard guard(dev);
  if (dx.numel() > 0) cuda::gelu_tanh_backward(f32(dy), f32(x), f32_mut(dx), dx.numel(), cuda::compute_stream(dev));
  return {dx};
}

}  // namespace

void cuda_elementwise_ops(std::vector<CudaOpEntry>& out) {
  out.push_back({"add", {binary_cuda<Bin::add>, add_backward_cuda}});
  out.push_back({"sub", {binary_cuda<Bin::sub>, sub_backward_cuda}});
  out.push_back({"mul", {binary_cuda<Bin::mul>, mul_backward_cuda}});
  out.push_back({"neg", {neg_cuda, neg_backward_cuda}});
  out.push_back({"gelu", {gelu_cuda, gelu_backward_cuda}});
}

}  // namespace athanor::detail
