// The registry's CUDA slot, checked without a GPU: in a CUDA build the ops whose CUDA
// kernels exist (src/ops/cuda/) have the slot filled, forward and backward, and every other
// op has it empty (an op without a CUDA kernel says so at dispatch:
// tests/core/test_tensor_device.cpp); a CPU-only build fills none. The kernels themselves
// run against the CPU in tests/gpu/test_gpu_ops.cpp.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "athanor/ops/registry.h"

using namespace athanor;

namespace {
// The ops with CUDA kernels today: views and copies (device-generic), the elementwise ops and
// activations, GEMMs (linear, gelu_linear, linear_relu, swiglu, matmul), the norms, softmax,
// dropout, embedding, sum/mean, cross_entropy, mse_loss, the attention ops, rope, and the ConvNet ops.
const std::set<std::string> kCudaOps = {
    "view", "permute", "expand", "unsqueeze", "slice", "split", "clone", "cast",                      // views, copies
    "add", "sub", "mul", "div", "neg", "relu", "tanh", "sigmoid", "silu", "gelu",                     // elementwise
    "linear", "matmul", "gelu_linear", "linear_relu", "swiglu",                                       // GEMMs
    "layer_norm", "rms_norm", "batch_norm", "softmax", "dropout", "embedding", "sum", "mean", "cross_entropy",
    "mse_loss", "causal_self_attention", "scaled_dot_product_attention", "rope", "conv2d", "max_pool2d"};
// The registry ops the models' training steps call (src/nn/gpt.cpp, llama.cpp, mlp.cpp,
// convnet.cpp and their layers; the loss): each must have a CUDA kernel.
const std::set<std::string> kTrainingOps = {
    "embedding", "add", "dropout", "layer_norm", "linear", "causal_self_attention", "gelu_linear", "cross_entropy",  // GPT
    "rms_norm", "rope", "scaled_dot_product_attention", "swiglu", "permute", "view",                                 // Llama
    "linear_relu", "relu", "conv2d", "batch_norm", "max_pool2d", "cast", "clone"};                                   // MLP, ConvNet, autocast
}  // namespace

TEST(CudaSlot, FilledExactlyForTheOpsWithCudaKernels) {
  std::set<std::string> filled;
  for (const OpDef* op : op_registry()) {
    const OpKernels& k = op->kernels[device_slot(DeviceType::cuda)];
    if (k.forward == nullptr) {
      EXPECT_EQ(k.backward, nullptr) << op->name << ": a CUDA backward without a forward";
      continue;
    }
    filled.insert(op->name);
    EXPECT_NE(k.backward, nullptr) << op->name << ": a CUDA forward without its backward";
    EXPECT_TRUE(op->has_kernel(DeviceType::cuda));
  }
#ifdef ATHANOR_HAS_CUDA
  EXPECT_EQ(filled, kCudaOps);
  for (const std::string& op : kTrainingOps) EXPECT_TRUE(filled.count(op)) << op << " (a training op) has no CUDA kernel";
  // Device-generic entries share the CPU's functions; the others have their own.
  const OpDef* view = find_op("view");
  const OpDef* linear = find_op("linear");
  ASSERT_TRUE(view && linear);
  EXPECT_EQ(view->kernels[device_slot(DeviceType::cuda)].forward, view->kernels[device_slot(DeviceType::cpu)].forward);
  EXPECT_NE(linear->kernels[device_slot(DeviceType::cuda)].forward, linear->kernels[device_slot(DeviceType::cpu)].forward);
#else
  EXPECT_TRUE(filled.empty()) << "a CPU-only build has no CUDA kernels";
#endif
}
