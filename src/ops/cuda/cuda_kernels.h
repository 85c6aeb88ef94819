#pragma once
// The registry's CUDA slot (athanor/ops/registry.h): each area file in src/ops/cuda/ (compiled
// only in a CUDA build) lists its ops' CUDA forward and backward; install_cuda_kernels puts
// them into the OpDefs when op_registry() is first built, so no op file has a CUDA branch.
//
// Two kinds of entry:
//  - the op's own CUDA kernels (forward and backward on CUDA tensors, calling
//    src/backend/cuda on the compute stream);
//  - `device_generic`: the op's CPU forward and backward are metadata and core copies only
//    (views, slices, clone, cast), which work on any device's tensors; the CUDA slot takes
//    the CPU slot's functions.
#include <string>
#include <vector>

#include "athanor/ops/registry.h"

namespace athanor::detail {

struct CudaOpEntry {
  std::string op;
  OpKernels kernels;            // unused when device_generic
  bool device_generic = false;
};

// Each area's entries (src/ops/cuda/<area>.cpp).
void cuda_elementwise_ops(std::vector<CudaOpEntry>& out);
void cuda_linalg_ops(std::vector<CudaOpEntry>& out);
void cuda_norm_ops(std::vector<CudaOpEntry>& out);
void cuda_dropout_ops(std::vector<CudaOpEntry>& out);
void cuda_embedding_ops(std::vector<CudaOpEntry>& out);
void cuda_reduction_ops(std::vector<CudaOpEntry>& out);
void cuda_loss_ops(std::vector<CudaOpEntry>& out);
void cuda_attention_ops(std::vector<CudaOpEntry>& out);
void cuda_llama_ops(std::vector<CudaOpEntry>& out);
void cuda_conv_ops(std::vector<CudaOpEntry>& out);

// Every entry, in area order.
std::vector<CudaOpEntry> cuda_op_entries();
// Fills the CUDA slot of every op that has an entry; an entry naming no registered op is
// an internal error (a renamed op must not silently lose its CUDA kernel).
void install_cuda_kernels(const std::vector<const OpDef*>& ops);

// Helpers of the CUDA forwards: the one device of the call as a CUDA index, and a
// contiguous copy on that device.
int cuda_index(const OpCall& c);
Tensor cuda_contiguous(const Tensor& t);
// "not yet supported on cuda: <what>" as an Error naming the op, with the hint to run it on the CPU.
[[noreturn]] void cuda_unsupported(const char* op, const std::string& what);

}  // namespace athanor::detail
