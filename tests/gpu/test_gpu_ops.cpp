// The op harness on CUDA: every op with a CUDA kernel (the registry's CUDA slot) runs each of
// its harness cases on the GPU and on the CPU, forward and backward, at f32, at the 16-bit
// dtypes and at f64, and the results must agree within the stated tolerances:
//   f32:  |gpu - cpu| <= 1e-5 + 1e-4 |cpu|   (TF32 off; GEMM sums in another order)
//   f16:  |gpu - cpu| <= 4e-3 + 4e-3 |cpu|   (f32 accumulation, a few ulps of 2^-11)
//   bf16: |gpu - cpu| <= 3e-2 + 2e-2 |cpu|   (f32 accumulation, a few ulps of 2^-8)
//   f64:  |gpu - cpu| <= 1e-12 + 1e-10 |cpu| (f64 math and accumulation on both; sums in
//         another order cost a few ulps of 2^-52 per term)
// And the f64 gradcheck on the GPU (issue 30: "f64 gradchecks run on the GPU"): every harness
// case with a gradient of every op with a CUDA kernel, its inputs on cuda in f64, the CUDA
// backward's gradient against central differences of the CUDA forward (the CPU harness's
// gradcheck, tests/support/op_case_gradcheck.h, its tolerances).
// The inputs keep the case's layout on the device (transposed, strided, broadcast). A case
// the CUDA kernel does not take yet (1-D matmul operands, ...) must say
// "not yet supported on cuda": it is listed, and every op must still run at least one f32
// case. The autocast paths (f32 results from 16-bit inputs, f32-master dW) are checked by
// test_gpu_autocast.cpp on a GPT block.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "athanor/autograd/engine.h"
#include "athanor/autograd/function.h"
#include "athanor/core/error.h"
#include "athanor/ops/op_harness.h"
#include "athanor/ops/dropout.h"
#include "athanor/ops/registry.h"
#include "gpu_test.h"
#include "op_case_gradcheck.h"

using namespace athanor;
using namespace athanor::gpu_test;
using athanor::testing::op_case_gradcheck;

namespace {

struct Tol {
  double atol, rtol;
};
Tol tolerance(DType dt) {
  if (dt == DType::bf16) return {3e-2, 2e-2};
  if (dt == DType::f16) return {4e-3, 4e-3};
  if (dt == DType::f64) return {1e-12, 1e-10};
  return {1e-5, 1e-4};
}

// t (a CPU tensor in `layout`) on cuda:0 in the same layout.
Tensor to_device_in_layout(const Tensor& t, CaseLayout layout) {
  const Device d = Device::cuda(0);
  if (layout == CaseLayout::transposed && t.dim() >= 2) {
    Shape rev(t.dim());
    for (int64_t i = 0; i < t.dim(); ++i) rev[i] = t.dim() - 1 - i;
    return t.permute(rev).contiguous().to(d).permute(rev).detach();
  }
  if (layout == CaseLayout::strided) {
    Tensor buf = zeros({2 * std::max<int64_t>(t.numel(), 1)}, TensorOptions(t.dtype()).with_device(d));
    Shape st = contiguous_strides(t.sizes());
    for (auto& s : st) s *= 2;
    Tensor v = make_view(buf, t.sizes(), st, 0);
    v.copy_(t);
    return v;
  }
  return t.detach().to(d);
}

// The case's inputs (CPU tensors from case_tensors) on cuda:0 in their layouts; those that
// require grad become device leaves that do.
std::vector<Tensor> on_device(const OpCase& c, const std::vector<Tensor>& hin) {
  std::vector<Tensor> din;
  for (std::size_t i = 0; i < hin.size(); ++i) {
    if (!hin[i].defined()) {
      din.push_back(Tensor());
      continue;
    }
    Tensor g = to_device_in_layout(hin[i], c.inputs[i].layout);
    if (hin[i].requires_grad()) g.requires_grad_(true);
    din.push_back(g);
  }
  return din;
}

// g [r, c] -> its transpose's values laid out row-major as [r, c] (a wrong gradient on purpose).
Tensor cuda_copy_transposed(const Tensor& g) {
  return contiguous(g.permute({1, 0})).view(g.sizes());
}

std::vector<double> host_values(const Tensor& t) { return t.device().is_cpu() ? t.to_vector() : t.cpu().to_vector(); }

bool floating_out(const Tensor& t) { return t.defined() && is_floating(t.dtype()) && t.requires_grad(); }

}  // namespace

TEST(GpuOps, EveryCudaKernelMatchesTheCpuForwardAndBackward) {
  ATH_REQUIRE_GPU();
  std::map<std::string, int> f32_runs;
  std::set<std::string> with_cuda;
  std::vector<std::string> unsupported;
  int runs = 0;
  for (const OpDef* op : op_registry()) {
    if (!op->has_kernel(DeviceType::cuda)) continue;
    with_cuda.insert(op->name);
    for (const OpCase& c : op->cases(1)) {
      for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
        const std::vector<DType>& allowed = c.dtypes.empty() ? op->dtypes : c.dtypes;
        if (std::find(allowed.begin(), allowed.end(), dt) == allowed.end()) continue;
        SCOPED_TRACE(op->name + " on cuda, " + dtype_name(dt) + ": " + c.label);
        const std::vector<Tensor> hin = case_tensors(c, dt, true);
        std::vector<Tensor> din = on_device(c, hin);
        std::vector<Tensor> dout;
        try {
          dout = c.call(din);
        } catch (const Error& e) {
          const std::string m = e.what();
          ASSERT_NE(m.find("not yet supported on cuda"), std::string::npos) << m;
          unsupported.push_back(op->name + " " + dtype_name(dt) + " '" + c.label + "': " + m.substr(0, m.find('\n')));
          continue;
        }
        const std::vector<Tensor> hout = c.call(hin);
        ASSERT_EQ(dout.size(), hout.size());
        const Tol tol = tolerance(dt);
        std::vector<Tensor> hroots, droots, hseeds, dseeds;
        for (std::size_t k = 0; k < hout.size(); ++k) {
          EXPECT_EQ(dout[k].device(), Device::cuda(0)) << "output " << k;
          EXPECT_EQ(dout[k].sizes(), hout[k].sizes()) << "output " << k;
          EXPECT_EQ(dout[k].dtype(), hout[k].dtype()) << "output " << k;
          EXPECT_TRUE(all_close(host_values(dout[k]), host_values(hout[k]), tol.atol, tol.rtol)) << "output " << k;
          if (floating_out(hout[k]) && floating_out(dout[k])) {
            const auto sv = random_vector(static_cast<std::size_t>(hout[k].numel()), 7 + static_cast<unsigned>(k));
            const Tensor seed = from_vector(sv, hout[k].sizes(), TensorOptions(hout[k].dtype()));
            hroots.push_back(hout[k]), droots.push_back(dout[k]);
            hseeds.push_back(seed), dseeds.push_back(seed.cuda());
          }
        }
        if (!hroots.empty()) {
          backward(hroots, hseeds);
          try {
            backward(droots, dseeds);
          } catch (const Error& e) {  // a backward that does not take this dtype yet (the forward did)
            const std::string m = e.what();
            ASSERT_NE(m.find("not yet supported on cuda"), std::string::npos) << m;
            unsupported.push_back(op->name + " backward " + dtype_name(dt) + " '" + c.label + "': " + m.substr(0, m.find('\n')));
            continue;
          }
          for (std::size_t i = 0; i < hin.size(); ++i) {
            if (!hin[i].defined() || !hin[i].requires_grad()) continue;
            ASSERT_EQ(hin[i].grad().defined(), din[i].grad().defined()) << "input " << i;
            if (!hin[i].grad().defined()) continue;
            EXPECT_EQ(din[i].grad().device(), Device::cuda(0)) << "input " << i;
            EXPECT_TRUE(all_close(host_values(din[i].grad()), host_values(hin[i].grad()), tol.atol, tol.rtol))
                << "gradient of input " << i;
          }
        }
        if (dt == DType::f32) ++f32_runs[op->name];
        ++runs;
      }
    }
  }
  for (const std::string& u : unsupported) std::printf("[ gpu ops  ] not yet on cuda: %s\n", u.c_str());
  for (const std::string& name : with_cuda) EXPECT_GT(f32_runs[name], 0) << name << " ran no f32 case on cuda";
  std::printf("[ gpu ops  ] %zu ops with a CUDA kernel, %d case x dtype runs against the CPU (forward and backward)\n",
              with_cuda.size(), runs);
}

TEST(GpuOps, DropoutDrawsTheCpusMaskFromTheSameSeed) {
  ATH_REQUIRE_GPU();
  // 100 003 elements (not a multiple of 4: the last Philox word is partly used), p 0.1, two
  // calls in a row (the generator's offset advances identically on both devices).
  const Tensor x = ones({100003});
  Generator gc(1234), gg(1234);
  for (int call = 0; call < 2; ++call) {
    const std::vector<double> yc = dropout(x, 0.1, true, gc).to_vector();
    const std::vector<double> yg = dropout(x.cuda(), 0.1, true, gg).cpu().to_vector();
    ASSERT_EQ(yc.size(), yg.size());
    std::size_t dropped = 0, differ = 0;
    for (std::size_t i = 0; i < yc.size(); ++i) {
      dropped += yc[i] == 0.0;
      differ += (yc[i] == 0.0) != (yg[i] == 0.0) || yc[i] != yg[i];
    }
    EXPECT_EQ(differ, 0u) << "call " << call;
    EXPECT_NEAR(static_cast<double>(dropped) / yc.size(), 0.1, 0.01) << "call " << call;
  }
}

// The ops GPT, MLP and ConvNet training runs (src/nn/gpt.cpp, mlp.cpp, convnet.cpp, layers.cpp
// and the losses): their CUDA kernels must take f64, so that the f64 gradcheck below covers
// the whole of a training step on the GPU.
namespace {
const std::set<std::string>& training_ops() {
  static const std::set<std::string> ops = {
      "linear",     "gelu_linear", "linear_relu", "matmul",  "embedding", "layer_norm", "causal_self_attention",
      "cross_entropy", "dropout",   "add",         "mul",     "gelu",      "relu",       "tanh",
      "sum",        "mean",        "softmax",     "conv2d",  "max_pool2d", "batch_norm", "view"};
  return ops;
}
}  // namespace

TEST(GpuOps, F64GradcheckOnTheGpuForEveryCudaKernel) {
  ATH_REQUIRE_GPU();
  std::set<std::string> with_cuda, checked, unsupported_ops;
  std::vector<std::string> unsupported;
  int cases = 0;
  for (const OpDef* op : op_registry()) {
    if (!op->has_kernel(DeviceType::cuda)) continue;
    with_cuda.insert(op->name);
    for (const OpCase& c : op->cases(1)) {
      SCOPED_TRACE(op->name + " f64 gradcheck on cuda: " + c.label);
      if (!c.no_gradcheck.empty()) {  // listed as the CPU harness lists them
        std::printf("[ gpu ops  ] gradcheck: %s, case '%s' not checked: %s\n", op->name.c_str(), c.label.c_str(),
                    c.no_gradcheck.c_str());
        continue;
      }
      const std::vector<Tensor> hin = case_tensors(c, DType::f64, true);
      bool any = false;
      for (const Tensor& t : hin) any = any || (t.defined() && t.requires_grad());
      if (!any) continue;
      const std::vector<Tensor> din = on_device(c, hin);
      try {
        EXPECT_TRUE(op_case_gradcheck(c, din));
      } catch (const Error& e) {
        const std::string m = e.what();
        if (m.find("not yet supported on cuda") == std::string::npos) {
          ADD_FAILURE() << m;
          continue;
        }
        unsupported.push_back(op->name + " '" + c.label + "': " + m.substr(0, m.find('\n')));
        unsupported_ops.insert(op->name);
        continue;
      }
      checked.insert(op->name);
      ++cases;
    }
  }
  for (const std::string& u : unsupported) std::printf("[ gpu ops  ] f64 not yet supported on cuda: %s\n", u.c_str());
  std::string names;
  for (const std::string& n : unsupported_ops) names += " " + n;
  std::printf("[ gpu ops  ] f64 gradcheck on cuda: %zu of %zu ops with a CUDA kernel, %d cases; not yet supported in f64:%s\n",
              checked.size(), with_cuda.size(), cases, names.empty() ? " none" : names.c_str());
  // An op of a training step whose CUDA kernel does not take f64 (in any of its cases) fails.
  std::string missing;
  for (const std::string& n : unsupported_ops)
    if (training_ops().count(n)) missing += " " + n;
  EXPECT_TRUE(missing.empty()) << "ops GPT/MLP/ConvNet training uses whose CUDA kernel does not take f64 yet:" << missing;
  // Every op of the training list that has a CUDA kernel was gradchecked on the GPU.
  for (const std::string& n : training_ops()) {
    if (with_cuda.count(n)) {
      EXPECT_TRUE(checked.count(n) || unsupported_ops.count(n)) << n << " had no f64 gradcheck on cuda";
    }
  }
}

// The device path of the gradcheck can fail: an identity op whose backward hands back the
// upstream gradient transposed (the same values, in the wrong places) and one whose backward
// is zero are caught on cuda; the true backward passes.
TEST(GpuOps, F64GradcheckOnTheGpuCatchesAWrongBackward) {
  ATH_REQUIRE_GPU();
  Tensor x = athanor::testing::randn64({2, 3}, 3).detach().cuda();
  x.requires_grad_(true);
  auto identity = [](const char* name, int variant) {
    return [name, variant](const std::vector<Tensor>& in) {
      return record(name, {in[0]}, clone(in[0].detach()), [variant](const Node&, const Grads& g) {
        if (variant == 1) return Grads{cuda_copy_transposed(g[0])};
        if (variant == 2) return Grads{zeros(g[0].sizes(), TensorOptions(g[0].dtype()).with_device(g[0].device()))};
        return Grads{clone(g[0])};
      });
    };
  };
  EXPECT_TRUE(athanor::testing::gradcheck(identity("right", 0), {x}));
  EXPECT_FALSE(athanor::testing::gradcheck(identity("transposed", 1), {x}));
  EXPECT_FALSE(athanor::testing::gradcheck(identity("zero", 2), {x}));
}
