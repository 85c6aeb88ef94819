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
// The ops with CUDA kernels today: views and copies (device-generic), elementwise, GEMMs,
// layer_norm, rms_norm, softmax, dropout, embedding, sum/mean, cross_entropy, gelu_linear,
// and the two attention ops.
const std::set<std::string> kCudaOps = {"view", "permute", "unsqueeze", "slice", "split", "clone", "cast",
                                        "add",  "sub",     "mul",       "neg",   "gelu",  "linear", "matmul",
                                        "layer_norm", "rms_norm", "softmax", "dropout", "embedding", "sum", "mean",
                                        "cross_entropy", "gelu_linear", "causal_self_attention",
                                        "scaled_dot_product_attention"};
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
