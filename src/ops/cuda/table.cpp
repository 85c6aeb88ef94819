// The CUDA slot's table and its installation (cuda_kernels.h).
#include <algorithm>

#include "ops/cuda/cuda_kernels.h"

namespace athanor::detail {

std::vector<CudaOpEntry> cuda_op_entries() {
  std::vector<CudaOpEntry> out;
  // Views and copies: their CPU kernels only set sizes/strides/offset or copy through core
  // (copy_into, zeros), which run on the tensor's own device.
  for (const char* op : {"view", "permute", "expand", "unsqueeze", "slice", "split", "clone", "cast"})
    out.push_back(CudaOpEntry{.op = op, .kernels = {}, .device_generic = true});
  cuda_elementwise_ops(out);
  cuda_linalg_ops(out);
  cuda_norm_ops(out);
  cuda_dropout_ops(out);
  cuda_embedding_ops(out);
  cuda_reduction_ops(out);
  cuda_loss_ops(out);
  cuda_attention_ops(out);
  cuda_llama_ops(out);
  cuda_conv_ops(out);
  return out;
}

void install_cuda_kernels(const std::vector<const OpDef*>& ops) {
  for (const CudaOpEntry& e : cuda_op_entries()) {
    auto it = std::find_if(ops.begin(), ops.end(), [&](const OpDef* d) { return d->name == e.op; });
    ATH_CHECK(it != ops.end(), "registry", "src/ops/cuda lists CUDA kernels for '", e.op, "', which is no registered op",
              Hint{"rename the entry with the op (src/ops/cuda/*.cpp)"});
    const OpDef& d = **it;
    d.kernels[device_slot(DeviceType::cuda)] = e.device_generic ? d.kernels[device_slot(DeviceType::cpu)] : e.kernels;
  }
}

int cuda_index(const OpCall& c) { return c.device().index; }

Tensor cuda_contiguous(const Tensor& t) {
  if (!t.defined() || t.is_contiguous()) return t;
  Tensor c = empty(t.sizes(), TensorOptions(t.dtype()).with_device(t.device()));
  copy_into(c, t);
  return c;
}

void cuda_unsupported(const char* op, const std::string& what) {
  ATH_FAIL(op, "not yet supported on cuda: ", what,
           Hint{"run this op on the CPU (.cpu()), or see `athanor ops` for what runs on cuda"});
}

}  // namespace athanor::detail
