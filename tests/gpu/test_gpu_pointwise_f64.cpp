// The pointwise kernel in f64 (src/backend/cuda/pointwise_f64.cu) and the casts from and to
// f64 (pointwise.h's copy, copy.cu): every op against the CPU's f64 kernels (the ops of one
// operation bit for bit, the rest within 1e-14), mixed f64 / f32 / bf16 operands, the casts
// between f64 and f32/bf16/f16 against the CPU's casts bit for bit on edge values, and the
// elementwise ops' CUDA slots in f64, forward and backward, against the same ops on the CPU.
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "athanor/autograd/engine.h"
#include "athanor/core/error.h"
#include "athanor/ops/activation.h"
#include "athanor/ops/elementwise.h"
#include "backend/cpu/activation.h"
#include "backend/cpu/dropout.h"
#include "backend/cpu/swiglu.h"
#include "backend/cuda/candidates.h"
#include "backend/cuda/pointwise.h"
#include "gpu_test.h"
#include "pointwise_test_util.h"

using namespace athanor;
using namespace athanor::gpu_test;
using namespace athanor::pointwise_test;
using cuda::PointwiseKernel;

namespace {

// ---- f64 (GPU): the math against the CPU's f64 kernels, the casts against the CPU's casts

std::vector<double> f64_values(int64_t n, unsigned seed, double lo, double hi) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (double& x : v) x = d(g);
  return v;
}

// The CPU's f64 result of `op` (the kernels the CPU's ops run in f64; for rsqrt_add, whose CPU
// counterpart is inside batch_norm, its formula).
std::vector<double> cpu_f64(PointwiseOp op, const std::vector<double>& a, const std::vector<double>& b,
                            const std::vector<double>& c, double alpha) {
  const int64_t n = static_cast<int64_t>(a.size());
  auto t = [n](const std::vector<double>& v) { return from_vector(v, {n}, TensorOptions(DType::f64)); };
  std::vector<double> r(a.size()), other(a.size());
  using cpu::Activation;
  auto fwd = [&](Activation act) { cpu::activation_forward<double>(act, a.data(), r.data(), n); };
  auto bwd = [&](Activation act) { cpu::activation_backward<double>(act, b.data(), a.data(), r.data(), n); };  // (saved, g)
  switch (op) {
    case PointwiseOp::copy: return a;
    case PointwiseOp::add: return add(t(a), t(b)).to_vector();
    case PointwiseOp::sub: return sub(t(a), t(b)).to_vector();
    case PointwiseOp::mul: return mul(t(a), t(b)).to_vector();
    case PointwiseOp::div: return div(t(a), t(b)).to_vector();
    case PointwiseOp::scale: return mul(t(a), alpha).to_vector();
    case PointwiseOp::relu: fwd(Activation::relu); break;
    case PointwiseOp::relu_backward: bwd(Activation::relu); break;
    case PointwiseOp::gelu_tanh: fwd(Activation::gelu_tanh); break;
    case PointwiseOp::gelu_tanh_backward: bwd(Activation::gelu_tanh); break;
    case PointwiseOp::gelu_erf: fwd(Activation::gelu); break;
    case PointwiseOp::gelu_erf_backward: bwd(Activation::gelu); break;
    case PointwiseOp::silu_mul: cpu::swiglu_forward<double>(a.data(), b.data(), r.data(), n); break;
    case PointwiseOp::silu_mul_grad_gate: cpu::swiglu_backward<double>(c.data(), a.data(), b.data(), r.data(), other.data(), n); break;
    case PointwiseOp::silu_mul_grad_up: cpu::swiglu_backward<double>(c.data(), a.data(), b.data(), other.data(), r.data(), n); break;
    case PointwiseOp::dropout: cpu::dropout_apply<double>(a.data(), r.data(), n, kSeed, kOffset, kThreshold, alpha); break;
    case PointwiseOp::rsqrt_add:
      for (int64_t i = 0; i < n; ++i) r[i] = 1.0 / std::sqrt(a[i] + alpha);
      break;
    case PointwiseOp::tanh: fwd(Activation::tanh); break;
    case PointwiseOp::tanh_backward: bwd(Activation::tanh); break;
    case PointwiseOp::sigmoid: fwd(Activation::sigmoid); break;
    case PointwiseOp::sigmoid_backward: bwd(Activation::sigmoid); break;
    case PointwiseOp::silu: fwd(Activation::silu); break;
    case PointwiseOp::silu_backward: bwd(Activation::silu); break;
  }
  return r;
}

// The ops of one operation: the CPU's bits (pointwise_f64.cu).
bool one_operation(PointwiseOp op) {
  switch (op) {
    case PointwiseOp::copy: case PointwiseOp::add: case PointwiseOp::sub: case PointwiseOp::mul: case PointwiseOp::div:
    case PointwiseOp::scale: case PointwiseOp::relu: case PointwiseOp::relu_backward: case PointwiseOp::dropout:
    case PointwiseOp::rsqrt_add: return true;
    default: return false;
  }
}

TEST(GpuPointwiseF64, EveryOpMatchesTheCpusF64Kernels) {
  ATH_REQUIRE_GPU();
  const int64_t n = 10007;
  const std::vector<double> x = f64_values(n, 1, -4.0, 4.0), y = f64_values(n, 2, -4.0, 4.0);
  const std::vector<double> g = f64_values(n, 3, -1.0, 1.0), unit = f64_values(n, 4, 0.0, 1.0);
  for (int k = 0; k < kOps; ++k) {
    const PointwiseOp op = op_at(k);
    // The inputs in the op's domain: a gradient first for the backward ops, an output of tanh
    // in (-1, 1) or of sigmoid in (0, 1) where the op takes one, a non-negative rsqrt_add.
    std::vector<double> in[3] = {x, y, g};
    switch (op) {
      case PointwiseOp::relu_backward: case PointwiseOp::gelu_tanh_backward: case PointwiseOp::gelu_erf_backward:
      case PointwiseOp::silu_backward: in[0] = g; break;
      case PointwiseOp::tanh_backward: in[0] = g, in[1] = f64_values(n, 5, -1.0, 1.0); break;
      case PointwiseOp::sigmoid_backward: in[0] = g, in[1] = unit; break;
      case PointwiseOp::rsqrt_add: in[0] = unit; break;
      default: break;
    }
    PointwiseArgs a = args_1d(op, n, DType::f64, DType::f64, DType::f64);
    std::vector<std::unique_ptr<DeviceBuffer<double>>> dev;
    for (int i = 0; i < a.n_in; ++i) {
      dev.push_back(std::make_unique<DeviceBuffer<double>>(in[i]));
      a.in[i].data = dev.back()->ptr;
    }
    DeviceBuffer<double> out(static_cast<std::size_t>(n));
    a.out = out.ptr;
    for (bool candidate : {false, true}) {  // f64 takes the f64 kernel either way
      SCOPED_TRACE("op " + std::to_string(k) + (candidate ? ", candidate on" : ""));
      ASSERT_EQ(cuda::plan_pointwise(a, candidate).kernel, PointwiseKernel::generic_f64);
      ATH_CUDA(cudaMemsetAsync(out.ptr, 0xff, n * sizeof(double), stream()));
      cuda::CandidateOverride o(cuda::Candidate::pointwise_vectorized, candidate);
      cuda::pointwise(a, stream());
      const std::vector<double> got = out.host(), want = cpu_f64(op, in[0], in[1], in[2], a.alpha);
      if (one_operation(op)) {
        const Tensor gt = from_vector(got, {n}, TensorOptions(DType::f64)), wt = from_vector(want, {n}, TensorOptions(DType::f64));
        EXPECT_TRUE(same_bits_or_nan(gt, wt));
      } else {
        EXPECT_TRUE(all_close(got, want, 1e-14, 1e-14));
      }
    }
  }
}

TEST(GpuPointwiseF64, MixedDtypesComputeInF64) {
  ATH_REQUIRE_GPU();
  const int64_t n = 4099;
  const Tensor a = from_vector(f64_values(n, 6, -3.0, 3.0), {n}, TensorOptions(DType::f64));
  const Tensor b = from_vector(f64_values(n, 7, -3.0, 3.0), {n}, TensorOptions(DType::f64));
  const Tensor b32 = b.to(DType::f32), b16 = b.to(DType::bf16);
  // f64 op f32 and f64 op bf16 -> f64: the 32/16-bit operand widens exactly (the CPU's promotion).
  EXPECT_TRUE(same_bits_or_nan(add(a.cuda(), b32.cuda()), add(a, b32)));
  EXPECT_TRUE(same_bits_or_nan(mul(b16.cuda(), a.cuda()), mul(b16, a)));
  // f64 math written to bf16 / f16 / f32: rounded as the CPU's cast of the f64 result.
  for (DType out : kFloat3) {
    PointwiseArgs p = args_1d(PointwiseOp::sub, n, DType::f64, DType::f64, out);
    const Tensor da = a.cuda(), db = b.cuda();
    Tensor y = empty({n}, TensorOptions(out).with_device(Device::cuda(0)));
    p.in[0].data = da.device_data(), p.in[1].data = db.device_data(), p.out = y.device_data();
    cuda::pointwise(p, stream());
    EXPECT_TRUE(same_bits_or_nan(y, sub(a, b).to(out))) << dtype_name(out);
  }
}

// Values at the edges of f32, bf16 and f16: ties, the cases where rounding twice (f64 -> f32 ->
// 16 bits, the CPU's cast) and rounding once differ, subnormals, overflow, ±0, ±inf, NaN; and
// random values across the exponents; each with both signs.
std::vector<double> edge_doubles() {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> v = {0.0, 1.0, inf, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::max(),
                           std::numeric_limits<double>::min(), std::numeric_limits<double>::denorm_min(),
                           // f32: max, the overflow threshold (max + half an ulp ties to inf), ties, subnormals
                           3.4028234663852886e38, 3.4028235677973366e38, std::nextafter(3.4028235677973366e38, 0.0),
                           1.0 + std::ldexp(1.0, -24), 1.0 + 3 * std::ldexp(1.0, -24), 1.0 + std::ldexp(1.0, -24) + std::ldexp(1.0, -60),
                           std::ldexp(1.0, -126), std::ldexp(1.0, -127), std::ldexp(1.0, -149), std::ldexp(1.0, -150),
                           1.5 * std::ldexp(1.0, -150), std::ldexp(1.0, -151),
                           // bf16: ties, twice-rounded ties (1 + 2^-8 + 2^-40 is 1 by way of f32, 1 + 2^-7 at once), subnormals
                           1.0 + std::ldexp(1.0, -8), 1.0 + 3 * std::ldexp(1.0, -8), 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40),
                           1.0 + std::ldexp(1.0, -8) - std::ldexp(1.0, -40), 3.3895313892515355e38, 3.3961775292304135e38,
                           std::ldexp(1.0, -133), std::ldexp(1.0, -134), 3 * std::ldexp(1.0, -135),
                           // f16: max, overflow, ties, twice-rounded ties, subnormals
                           65504.0, 65519.0, 65520.0, 65519.99, 1.0 + std::ldexp(1.0, -11), 1.0 + 3 * std::ldexp(1.0, -11),
                           1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40), std::ldexp(1.0, -14), std::ldexp(1.0, -15),
                           std::ldexp(1.0, -24), std::ldexp(1.0, -25), std::ldexp(1.0, -25) + std::ldexp(1.0, -60),
                           3 * std::ldexp(1.0, -26), std::ldexp(1.0, -26)};
  std::mt19937_64 g(99);
  std::uniform_real_distribution<double> m(1.0, 2.0);
  std::uniform_int_distribution<int> e(-160, 130);
  for (int i = 0; i < 4000; ++i) v.push_back(std::ldexp(m(g), e(g)));
  const std::size_t half = v.size();
  for (std::size_t i = 0; i < half; ++i) v.push_back(-v[i]);
  if (v.size() % 2) v.push_back(0.5);
  return v;
}

TEST(GpuPointwiseF64, CastsFromF64MatchTheCpuBitForBit) {
  ATH_REQUIRE_GPU();
  const std::vector<double> vals = edge_doubles();
  const int64_t n = static_cast<int64_t>(vals.size());
  const Tensor h = from_vector(vals, {n}, TensorOptions(DType::f64));
  const Tensor d = h.cuda();
  const Tensor ht = h.view({n / 2, 2}).t(), dt = d.view({n / 2, 2}).t();  // transposed: copy.cu's strided path
  for (DType to : kFloat3) {
    SCOPED_TRACE(std::string("f64 -> ") + dtype_name(to));
    const Tensor want = h.to(to);
    EXPECT_TRUE(same_bits_or_nan(d.to(to), want));  // core's copy (copy.cu), the cast op's path
    EXPECT_TRUE(same_bits_or_nan(dt.to(to), ht.to(to)));
    // The pointwise kernel's copy (cuda_as: layer outputs, losses).
    Tensor y = empty({n}, TensorOptions(to).with_device(Device::cuda(0)));
    PointwiseArgs p = args_1d(PointwiseOp::copy, n, DType::f64, DType::f64, to);
    p.in[0].data = d.device_data(), p.out = y.device_data();
    cuda::pointwise(p, stream());
    EXPECT_TRUE(same_bits_or_nan(y, want));
  }
}

TEST(GpuPointwiseF64, CastsToF64MatchTheCpuBitForBit) {
  ATH_REQUIRE_GPU();
  // Every bf16 and f16 bit pattern, and f32 values with subnormals, ±0, ±inf and NaN.
  std::vector<Tensor> hosts;
  for (DType dt : {DType::bf16, DType::f16}) {
    Tensor t = empty({65536}, TensorOptions(dt));
    auto* p = static_cast<uint16_t*>(t.raw_data());
    for (uint32_t i = 0; i < 65536; ++i) p[i] = static_cast<uint16_t>(i);
    hosts.push_back(t);
  }
  hosts.push_back(from_vector(input_values(100003, 2), {100003}, TensorOptions(DType::f32)));
  for (const Tensor& h : hosts) {
    SCOPED_TRACE(std::string(dtype_name(h.dtype())) + " -> f64");
    const Tensor want = h.to(DType::f64), d = h.cuda();
    EXPECT_TRUE(same_bits_or_nan(d.to(DType::f64), want));
    Tensor y = empty(h.sizes(), TensorOptions(DType::f64).with_device(Device::cuda(0)));
    PointwiseArgs p = args_1d(PointwiseOp::copy, h.numel(), h.dtype(), h.dtype(), DType::f64);
    p.in[0].data = d.device_data(), p.out = y.device_data();
    cuda::pointwise(p, stream());
    EXPECT_TRUE(same_bits_or_nan(y, want));
  }
}

// The elementwise ops' CUDA slots (src/ops/cuda/elementwise.cpp) in f64, forward and backward,
// against the same ops on the CPU in f64.
TEST(GpuPointwiseF64, ElementwiseOpsTakeF64OnCuda) {
  ATH_REQUIRE_GPU();
  const Shape shape = {37, 29};
  const int64_t n = 37 * 29;
  const std::vector<double> av = f64_values(n, 8, -3.0, 3.0), bv = f64_values(n, 9, 0.5, 3.0), sv = f64_values(n, 10, -1.0, 1.0);
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&)> f;
    bool exact_forward;
  };
  const std::vector<Case> cases = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, true},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, true},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, true},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, true},
      {"neg", [](const Tensor& a, const Tensor&) { return neg(a); }, true},
      {"relu", [](const Tensor& a, const Tensor&) { return relu(a); }, true},
      {"tanh", [](const Tensor& a, const Tensor&) { return tanh(a); }, false},
      {"sigmoid", [](const Tensor& a, const Tensor&) { return sigmoid(a); }, false},
      {"silu", [](const Tensor& a, const Tensor&) { return silu(a); }, false},
      {"gelu", [](const Tensor& a, const Tensor&) { return gelu(a); }, false},
      {"gelu_tanh", [](const Tensor& a, const Tensor&) { return gelu(a, GeluApprox::tanh); }, false},
      {"add f64 + f32", [](const Tensor& a, const Tensor& b) { return add(a, b.to(DType::f32)); }, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor out[2], ga[2], gb[2];
    for (int dev = 0; dev < 2; ++dev) {
      Tensor a = from_vector(av, shape, TensorOptions(DType::f64)), b = from_vector(bv, shape, TensorOptions(DType::f64));
      Tensor seed = from_vector(sv, shape, TensorOptions(DType::f64));
      if (dev == 1) a = a.cuda(), b = b.cuda(), seed = seed.cuda();
      a.requires_grad_(true), b.requires_grad_(true);
      out[dev] = c.f(a, b);
      ASSERT_EQ(out[dev].dtype(), DType::f64);
      backward({out[dev]}, {seed});
      ga[dev] = a.grad(), gb[dev] = b.grad();
    }
    EXPECT_EQ(out[1].device(), Device::cuda(0));
    if (c.exact_forward) {
      EXPECT_TRUE(same_bits_or_nan(out[1].detach(), out[0].detach()));
    } else {
      EXPECT_TRUE(all_close(out[1].cpu().to_vector(), out[0].to_vector(), 1e-14, 1e-14));
    }
    ASSERT_EQ(ga[1].defined(), ga[0].defined());
    ASSERT_EQ(gb[1].defined(), gb[0].defined());
    if (ga[0].defined()) {
      EXPECT_TRUE(all_close(ga[1].cpu().to_vector(), ga[0].to_vector(), 1e-14, 1e-14)) << "d a";
    }
    if (gb[0].defined()) {
      EXPECT_TRUE(all_close(gb[1].cpu().to_vector(), gb[0].to_vector(), 1e-14, 1e-14)) << "d b";
    }
  }
}

}  // namespace
