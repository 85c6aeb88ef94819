// Tensor's differentiable convenience methods, forwarding to the functional ops.
#include "athanor/autograd/function.h"
#include "athanor/core/device_hooks.h"
#include "athanor/core/storage.h"
#include "athanor/core/tensor.h"
#include "athanor/ops/reduction.h"
#include "athanor/ops/shape.h"

namespace athanor {

Tensor Tensor::to(DType dt) const { return cast(*this, dt); }
// A device move is not a registry op (it has no kernel of one device: it is the edge
// between two), so it records its node itself; its backward moves the gradient back.
Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  if (!device.is_cpu()) require_device_hooks(device, "to");  // no GPU, cuda:7: before any work
  Tensor out;
  if (this->device().is_cpu()) {
    // An upload: into memory of the device's copy stream (Storage::allocate_upload), so the
    // copy overlaps the compute still queued (the trainer's prefetch of the next batch).
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = Storage::allocate_upload(static_cast<std::size_t>(numel()) * dtype_size(dtype()), storage()->tag(), device);
    impl->sizes = sizes();
    impl->strides = contiguous_strides(sizes());
    impl->dtype = dtype();
    out = Tensor(std::move(impl));
  } else {
    out = empty(sizes(), TensorOptions(dtype()).with_device(device).with_tag(storage()->tag()));
  }
  copy_into(out, *this);
  const Device from = this->device();
  return record("to", {*this}, out, [from](const Node&, const Grads& g) { return Grads{g[0].to(from)}; });
}
Tensor Tensor::contiguous() const { return athanor::contiguous(*this); }
Tensor Tensor::clone() const { return athanor::clone(*this); }
Tensor Tensor::reshape(const Shape& shape) const { return athanor::reshape(*this, shape); }
Tensor Tensor::view(const Shape& shape) const { return athanor::view(*this, shape); }
Tensor Tensor::transpose(int64_t d0, int64_t d1) const { return athanor::transpose(*this, d0, d1); }
Tensor Tensor::permute(const Shape& dims) const { return athanor::permute(*this, dims); }
Tensor Tensor::t() const { return athanor::transpose(*this, 0, 1); }
Tensor Tensor::sum() const { return athanor::sum(*this); }
Tensor Tensor::mean() const { return athanor::mean(*this); }

}  // namespace athanor
