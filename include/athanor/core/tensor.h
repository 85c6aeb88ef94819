#pragma once
// Tensor: a cheap value handle on a shared TensorImpl (storage, sizes, strides,
// offset, dtype, device, autograd metadata). Copying a Tensor copies the handle;
// views (reshape, transpose, slice, expand) share storage and its version counter.
//
// Autograd metadata lives here so the tape can find it; the tape itself is in
// src/autograd. Methods that compute (to, contiguous, reshape, sum, …) are
// differentiable and are implemented by the ops layer (src/ops/tensor_methods.cpp).
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "athanor/core/allocator.h"
#include "athanor/core/device.h"
#include "athanor/core/dtype.h"
#include "athanor/core/storage.h"

namespace athanor {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"
int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);

class Node;
class Tensor;
using GradHook = std::function<Tensor(const Tensor& grad)>;  // may return an undefined Tensor: keep grad
using PostAccumulateHook = std::function<void(Tensor& param)>;

struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;   // null for leaves
  uint32_t output_nr = 0;          // which output of grad_fn this tensor is
  std::shared_ptr<struct TensorImpl> grad;  // accumulated gradient (leaves, or retain_grad)
  std::weak_ptr<Node> grad_accumulator;     // leaves: the one AccumulateGrad node shared by all uses
  std::vector<std::pair<int, GradHook>> hooks;  // leaves: run before accumulation
  std::vector<std::pair<int, PostAccumulateHook>> post_accumulate_hooks;
  std::string name;                // e.g. a parameter's name, used in error messages
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape sizes, strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  std::unique_ptr<AutogradMeta> autograd;  // created on demand
  AutogradMeta& meta();
};

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool requires_grad = false;
  std::optional<MemTag> tag;  // default: the thread's current MemTagScope
  TensorOptions() = default;
  TensorOptions(DType d) : dtype(d) {}  // NOLINT: lets `zeros({2}, DType::f64)` read naturally
  TensorOptions& with_dtype(DType d) { dtype = d; return *this; }
  TensorOptions& with_requires_grad(bool r = true) { requires_grad = r; return *this; }
  TensorOptions& with_tag(MemTag t) { tag = t; return *this; }
  TensorOptions& with_device(Device d) { device = d; return *this; }
};

class Tensor {
 public:
  Tensor() = default;  // undefined
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  // ---- metadata
  const Shape& sizes() const;
  const Shape& strides() const;
  int64_t size(int64_t dim) const;    // negative dims count from the end
  int64_t stride(int64_t dim) const;
  int64_t dim() const;
  int64_t numel() const;
  int64_t storage_offset() const;
  DType dtype() const;
  Device device() const;
  std::size_t element_size() const { return dtype_size(dtype()); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * element_size(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const;
  std::string describe() const;  // "[2, 3] f32"
  std::string to_string(int64_t max_elements = 64) const;

  // ---- data access (CPU; item, to_vector and printing copy a device tensor to the host)
  void* raw_data() const;  // pointer to element 0 (storage + offset); an Error for a device tensor
  // Pointer to element 0 in the memory of the tensor's device, whatever it is: for that
  // device's kernels only (a CUDA tensor's is a device pointer).
  void* device_data() const;
  template <class T> T* data_ptr() const;  // checks dtype
  template <class T> T item() const;       // one-element tensor, converted to T
  double item() const { return item<double>(); }
  std::vector<double> to_vector() const;   // all elements in logical order, as double

  // ---- autograd
  bool requires_grad() const;
  Tensor& requires_grad_(bool r = true);  // leaves only
  bool is_leaf() const;
  Tensor grad() const;
  void set_grad(const Tensor& g) const;
  const std::shared_ptr<Node>& grad_fn() const;
  uint32_t output_nr() const;
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;
  int register_hook(GradHook hook);
  void remove_hook(int handle);
  int register_post_accumulate_grad_hook(PostAccumulateHook hook);  // leaves only
  void retain_grad();  // keep .grad on a non-leaf after backward
  Tensor detach() const;  // shares storage, no history
  const std::string& name() const;
  Tensor& set_name(const std::string& n);

  uint64_t version() const;
  void bump_version() const;

  // ---- in-place (not recorded by autograd; bump the version)
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  Tensor& copy_(const Tensor& src);  // broadcasts src, converts dtype

  // ---- differentiable methods (implemented in src/ops/tensor_methods.cpp)
  Tensor to(DType dt) const;
  // A copy on `device` (this tensor itself when it is there already); differentiable: the
  // gradient flows back to this tensor's device. Errors before any work when the device
  // does not exist (no GPU, cuda:7 on a one-GPU machine, a build without CUDA).
  Tensor to(Device device) const;
  Tensor cuda(int index = 0) const { return to(Device::cuda(index)); }
  Tensor cpu() const { return to(Device::cpu()); }
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor reshape(const Shape& shape) const;
  Tensor view(const Shape& shape) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const Shape& dims) const;
  Tensor t() const;  // 2-D transpose
  Tensor sum() const;
  Tensor mean() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// ---- factories
Tensor empty(const Shape& shape, const TensorOptions& opts = {});
Tensor zeros(const Shape& shape, const TensorOptions& opts = {});
Tensor ones(const Shape& shape, const TensorOptions& opts = {});
Tensor full(const Shape& shape, double value, const TensorOptions& opts = {});
Tensor scalar_tensor(double value, const TensorOptions& opts = {});
Tensor arange(int64_t start, int64_t end, const TensorOptions& opts = {});
Tensor empty_like(const Tensor& t, std::optional<DType> dtype = std::nullopt);  // contiguous, same tag scope
Tensor zeros_like(const Tensor& t, std::optional<DType> dtype = std::nullopt);
Tensor ones_like(const Tensor& t, std::optional<DType> dtype = std::nullopt);
// Copies `values` (converted to opts.dtype) into a new tensor of `shape`.
Tensor from_vector(const std::vector<double>& values, const Shape& shape, const TensorOptions& opts = {});
Tensor from_vector(const std::vector<float>& values, const Shape& shape, const TensorOptions& opts = {});
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape, const TensorOptions& opts = DType::i64);
// A tensor viewing existing storage with explicit geometry (no copy).
Tensor make_view(const Tensor& base, const Shape& sizes, const Shape& strides, int64_t offset);

// Raw, non-differentiable copy of src into dst (same shape, or src broadcastable),
// converting dtypes; used by kernels and by copy_().
void copy_into(const Tensor& dst, const Tensor& src);

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- template definitions
namespace detail {
[[noreturn]] void throw_dtype_mismatch(const Tensor& t, DType want);
void check_item(const Tensor& t);  // exactly one element
Tensor host_copy(const Tensor& t);  // t itself on the CPU; else a contiguous host copy (raw)
}
template <class T> T* Tensor::data_ptr() const {
  if (dtype() != dtype_of<T>) detail::throw_dtype_mismatch(*this, dtype_of<T>);
  return static_cast<T*>(raw_data());
}
template <class T> T Tensor::item() const {
  detail::check_item(*this);
  if (!device().is_cpu()) return detail::host_copy(*this).item<T>();  // waits for the device, as PyTorch's
  T out{};
  dispatch(dtype(), [&]<class S>() { out = static_cast<T>(static_cast<double>(*static_cast<const S*>(raw_data()))); });
  return out;
}

}  // namespace athanor
