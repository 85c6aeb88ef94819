// CUDA kernel of embedding (an f32, bf16, f16 or f64 table, i64 ids; src/backend/cuda/elementwise.h).
// Forward: out[p, :] = weight[ids[p], :], the ids validated on the device (no host read of
// the ids in the step): an out-of-range id is recorded (backend/cuda/device_error.h), its row
// left zero, and raised as an Error naming the id and its position at the next read from the
// device (the loss's), or at the call itself under anomaly mode, never an illegal address.
// A 16-bit table is read in place (its rows copied bit for bit into a 16-bit output): no f32
// copy of the table. Backward beside it: grad_weight[v, :] = Σ_{p : ids[p] = v} g[p, :] (0 for
// padding_idx), summed in f32 in p order whatever g's dtype and rounded once to the table's
// dtype (the CPU's order and rounding; an f64 table: summed in f64), deterministic without float atomics (each thread owns a
// column), as a dense [num, dim] gradient (the CPU's row-sparse emission has no CUDA twin yet).
#include <string>

#include "athanor/autograd/anomaly.h"
#include "athanor/autograd/function.h"
#include "athanor/ops/embedding.h"
#include "backend/cuda/device_error.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/runtime.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor::detail {
namespace {

struct EmbeddingCudaSaved : OpSaved {
  SavedTensor ids;
  int64_t num = 0, dim = 0, pad = -1;
  DType dtype = DType::f32;  // the table's
};

std::vector<Tensor> embedding_cuda(OpCall& c) {
  const Tensor &weight = c.in(0), &ids = c.in(1);
  const char* op = "embedding";
  ATH_CHECK(ids.defined(), op, "ids is undefined");
  const DType dt = weight.dtype();
  if (dt != DType::f32 && dt != DType::bf16 && dt != DType::f16 && dt != DType::f64)
    cuda_unsupported(op, "weight is " + weight.describe() + " (the CUDA kernel takes f32, bf16, f16 or f64)");
  if (ids.dtype() != DType::i64) cuda_unsupported(op, "ids are " + ids.describe() + " (the CUDA kernel takes i64)");
  ATH_CHECK(weight.dim() == 2, op, "weight must be 2-D [num_embeddings, dim], got ", weight.describe(),
            Hint{"reshape the table to [num_embeddings, embedding_dim]"});
  const int64_t num = weight.size(0), dim = weight.size(1);
  int64_t pad = -1;
  if (const auto p = c.args<EmbeddingArgs>().padding_idx) {
    ATH_CHECK(*p >= -num && *p < num, op, "padding_idx ", *p, " is out of range for a table of ", num, " embeddings (weight ",
              weight.describe(), ")", Hint{"padding_idx must be in [-num_embeddings, num_embeddings)"});
    pad = *p < 0 ? *p + num : *p;
  }
  const Tensor ic = cuda_contiguous(ids);
  Shape out_shape = ids.sizes();
  out_shape.push_back(dim);
  Tensor out = empty(out_shape, TensorOptions(dt).with_device(weight.device()));
  const Tensor wc = cuda_contiguous(weight);
  const int dev = cuda_index(c);
  cuda::DeviceGuard g(dev);
  if (out.numel() > 0)
    cuda::embedding_forward(wc.device_data(), dt, static_cast<const int64_t*>(ic.device_data()), out.device_data(),
                            ic.numel(), num, dim, cuda::device_error_record(dev), cuda::compute_stream(dev));
  if (anomaly_mode_enabled()) cuda::check_device_errors_now(dev);  // the debugging mode: raised at the call, as on the CPU
  if (c.records()) {
    EmbeddingCudaSaved& s = c.save<EmbeddingCudaSaved>();
    s.ids = save(ic, "ids"), s.num = num, s.dim = dim, s.pad = pad, s.dtype = dt;
  }
  return {out};
}

Grads embedding_backward_cuda(const Node& n, const Grads& g, const OpSaved& saved) {
  const EmbeddingCudaSaved& s = saved.as<EmbeddingCudaSaved>();
  const DType gdt = g[0].dtype();
  if (gdt != DType::f32 && gdt != DType::bf16 && gdt != DType::f16 && gdt != DType::f64)
    cuda_unsupported("embedding backward", "grad is " + g[0].describe() + " (f32, bf16, f16 or f64)");
  const Tensor ids = s.ids.unpack(n), gy = cuda_contiguous(g[0]);
  if (s.dtype == DType::f64 || gdt == DType::f64) {  // f64: summed in f64 into an f64 gradient
    if (s.dtype != DType::f64 || gdt != DType::f64)
      cuda_unsupported("embedding backward", "grad is " + g[0].describe() + " for a " + dtype_name(s.dtype) + " table");
    Tensor dw = zeros({s.num, s.dim}, TensorOptions(DType::f64).with_device(gy.device()));
    const int dev = gy.device().index;
    cuda::DeviceGuard guard(dev);
    if (ids.numel() > 0 && s.dim > 0)
      cuda::embedding_backward(static_cast<const double*>(gy.device_data()), static_cast<const int64_t*>(ids.device_data()),
                               static_cast<double*>(dw.device_data()), ids.numel(), s.num, s.dim, s.pad,
                               cuda::compute_stream(dev));
    return {dw, Tensor()};
  }
  Tensor dw = zeros({s.num, s.dim}, TensorOptions(DType::f32).with_device(gy.device()));
  const int dev = gy.device().index;
  cuda::DeviceGuard guard(dev);
  if (ids.numel() > 0 && s.dim > 0)
    cuda::embedding_backward(gy.device_data(), gdt, static_cast<const int64_t*>(ids.device_data()),
                             static_cast<float*>(dw.device_data()), ids.numel(), s.num, s.dim, s.pad,
                             cuda::compute_stream(dev));
  return {s.dtype == DType::f32 ? dw : to_raw(dw, s.dtype), Tensor()};  // rounded once, as the CPU's
}

}  // namespace

void cuda_embedding_ops(std::vector<CudaOpEntry>& out) {
  out.push_back({"embedding", {embedding_cuda, embedding_backward_cuda}});
}

}  // namespace athanor::detail
