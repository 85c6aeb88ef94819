#include "athanor/core/tensor.h"

#include <cstring>
#include <iomanip>
#include <sstream>

#include "athanor/core/convert.h"
#include "athanor/core/device_hooks.h"
#include "athanor/core/error.h"

namespace athanor {

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

AutogradMeta& TensorImpl::meta() {
  if (!autograd) autograd = std::make_unique<AutogradMeta>();
  return *autograd;
}

namespace detail {
void throw_dtype_mismatch(const Tensor& t, DType want) {
  ATH_FAIL("data_ptr", "tensor ", t.describe(), " accessed as ", dtype_name(want),
           Hint{"convert first with .to(DType::" + std::string(dtype_name(want)) + ")"});
}
void check_item(const Tensor& t) {
  ATH_CHECK(t.defined(), "item", "called on an undefined tensor");
  ATH_CHECK(t.numel() == 1, "item", "needs a tensor with exactly one element, got ", t.describe(),
            Hint{"reduce it first (sum(), mean()) or index one element"});
}
Tensor host_copy(const Tensor& t) {
  if (t.device().is_cpu()) return t;
  Tensor h = empty(t.sizes(), TensorOptions(t.dtype()));
  copy_into(h, t);
  return h;
}
}  // namespace detail

namespace {
const TensorImpl& checked(const std::shared_ptr<TensorImpl>& p) {
  ATH_CHECK(p != nullptr, "tensor", "operation on an undefined tensor",
            Hint{"the tensor was default-constructed or its gradient was never computed"});
  return *p;
}
int64_t wrap_dim(int64_t d, int64_t ndim, const char* op) {
  const int64_t lo = -std::max<int64_t>(ndim, 1), hi = std::max<int64_t>(ndim, 1) - 1;
  ATH_CHECK(d >= lo && d <= hi, op, "dimension ", d, " is out of range for a ", ndim, "-D tensor (valid: ", lo, " to ", hi, ")");
  return d < 0 ? d + std::max<int64_t>(ndim, 1) : d;
}
}  // namespace

const Shape& Tensor::sizes() const { return checked(impl_).sizes; }
const Shape& Tensor::strides() const { return checked(impl_).strides; }
int64_t Tensor::size(int64_t d) const { return sizes()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }
int64_t Tensor::dim() const { return static_cast<int64_t>(sizes().size()); }
int64_t Tensor::numel() const { return shape_numel(sizes()); }
int64_t Tensor::storage_offset() const { return checked(impl_).offset; }
DType Tensor::dtype() const { return checked(impl_).dtype; }
Device Tensor::device() const { return checked(impl_).storage->device(); }
const std::shared_ptr<Storage>& Tensor::storage() const { return checked(impl_).storage; }

bool Tensor::is_contiguous() const {
  const auto& sz = sizes();
  const auto& st = strides();
  int64_t expect = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (sz[i] == 1) continue;
    if (st[i] != expect) return false;
    expect *= sz[i];
  }
  return true;
}

std::string Tensor::describe() const {
  if (!defined()) return "<undefined>";
  return shape_str(sizes()) + " " + dtype_name(dtype());
}

void* Tensor::raw_data() const {
  const auto& t = checked(impl_);
  // Host code (a CPU kernel, data_ptr) must never get a device pointer: it would read
  // garbage or fault far from the cause.
  ATH_CHECK(t.storage->device().is_cpu(), "data_ptr", "host code asked for the data of tensor ", describe(),
            ", which lives on ", t.storage->device().str(), " (a CPU kernel or a host read of a device tensor)",
            Hint{"copy it to the host first with .cpu(), or run the op on inputs that are all on one device"});
  return device_data();
}

void* Tensor::device_data() const {
  const auto& t = checked(impl_);
  return static_cast<char*>(t.storage->data()) + t.offset * static_cast<int64_t>(dtype_size(t.dtype));
}

uint64_t Tensor::version() const { return storage()->version(); }
void Tensor::bump_version() const { storage()->bump_version(); }

// ---- strided copy with conversion --------------------------------------------------

namespace {
// Visits every element of `sizes` in row-major order, calling fn(dst_off, src_off)
// with element offsets computed from the two stride vectors. The innermost
// dimension is handed to fn_row as a whole to keep the loop tight.
template <class RowFn>
void for_each_row(const Shape& sizes, const Shape& dst_st, const Shape& src_st, RowFn fn_row) {
  const int64_t nd = static_cast<int64_t>(sizes.size());
  if (nd == 0) { fn_row(0, 0, 1, 1, 1); return; }
  const int64_t inner = sizes[nd - 1];
  const int64_t rows = inner == 0 ? 0 : shape_numel(sizes) / inner;
  std::vector<int64_t> idx(nd, 0);
  int64_t d_off = 0, s_off = 0;
  for (int64_t r = 0; r < rows; ++r) {
    fn_row(d_off, s_off, inner, dst_st[nd - 1], src_st[nd - 1]);
    for (int64_t k = nd - 2; k >= 0; --k) {  // odometer increment over the outer dims
      ++idx[k];
      d_off += dst_st[k];
      s_off += src_st[k];
      if (idx[k] < sizes[k]) break;
      d_off -= dst_st[k] * sizes[k];
      s_off -= src_st[k] * sizes[k];
      idx[k] = 0;
    }
  }
}
StridedRegion region(const Tensor& t) { return {t.device_data(), t.dtype(), t.sizes(), t.strides()}; }
StridedRegion region(const Tensor& t, const Shape& strides) { return {t.device_data(), t.dtype(), t.sizes(), strides}; }

// copy_into where either side is on a device; `sst` is src's strides broadcast to dst's shape.
// Host <-> device moves contiguous bytes of one dtype; broadcasting and conversion happen on
// the host side for an upload and on the device (copy_strided) otherwise.
void copy_across_devices(const Tensor& dst, const Tensor& src, const Shape& sst) {
  const Device dd = dst.device(), sd = src.device();
  if (!dd.is_cpu() && dd == sd) {  // within one device
    require_device_hooks(dd, "copy_").copy_strided(region(dst), region(src, sst), dd.index, "copy_");
    return;
  }
  if (!dd.is_cpu() && sd.is_cpu()) {  // upload: convert and broadcast on the host, then the bytes
    DeviceHooks& h = require_device_hooks(dd, "copy_");
    Tensor staged = empty(dst.sizes(), TensorOptions(dst.dtype()));
    copy_into(staged, src);
    if (dst.is_contiguous()) {
      h.copy_to_device(dst.device_data(), dd.index, staged.device_data(), staged.nbytes());
    } else {
      Tensor tmp = empty(dst.sizes(), TensorOptions(dst.dtype()).with_device(dd).with_tag(MemTag::workspace));
      h.copy_to_device(tmp.device_data(), dd.index, staged.device_data(), staged.nbytes());
      h.copy_strided(region(dst), region(tmp), dd.index, "copy_");
    }
    return;
  }
  // From a device: src's elements made contiguous there (same dtype), then moved.
  DeviceHooks& h = require_device_hooks(sd, "copy_");
  Tensor packed = src;
  if (!src.is_contiguous()) {
    packed = empty(src.sizes(), TensorOptions(src.dtype()).with_device(sd).with_tag(MemTag::workspace));
    h.copy_strided(region(packed), region(src), sd.index, "copy_");
  }
  if (dd.is_cpu()) {  // download, then broadcast and convert on the host
    Tensor host = empty(src.sizes(), TensorOptions(src.dtype()));
    h.copy_to_host(host.device_data(), packed.device_data(), sd.index, packed.nbytes());
    copy_into(dst, host);
    return;
  }
  // Device to another device: the bytes, then broadcast and convert on the destination.
  DeviceHooks& hd = require_device_hooks(dd, "copy_");
  Tensor moved = empty(src.sizes(), TensorOptions(src.dtype()).with_device(dd).with_tag(MemTag::workspace));
  hd.copy_between(moved.device_data(), dd.index, packed.device_data(), sd.index, packed.nbytes());
  Shape mst(dst.dim(), 0);
  for (int64_t i = 0; i < moved.dim(); ++i) {
    const int64_t di = dst.dim() - moved.dim() + i;
    mst[di] = moved.size(i) == 1 ? 0 : moved.stride(i);
  }
  hd.copy_strided(region(dst), region(moved, mst), dd.index, "copy_");
}
}  // namespace

void copy_into(const Tensor& dst, const Tensor& src) {
  ATH_CHECK(dst.defined() && src.defined(), "copy_", "undefined tensor");
  // Broadcast src to dst's shape (right-aligned, size-1 dims get stride 0).
  const int64_t nd = dst.dim(), ns = src.dim();
  ATH_CHECK(ns <= nd, "copy_", "cannot broadcast source ", src.describe(), " to destination ", dst.describe());
  Shape sst(nd, 0);
  for (int64_t i = 0; i < ns; ++i) {
    const int64_t di = nd - ns + i;
    ATH_CHECK(src.sizes()[i] == dst.sizes()[di] || src.sizes()[i] == 1, "copy_", "cannot broadcast source ",
              src.describe(), " to destination ", dst.describe());
    sst[di] = src.sizes()[i] == 1 ? 0 : src.strides()[i];
  }
  if (dst.numel() == 0) return;
  if (!dst.device().is_cpu() || !src.device().is_cpu()) {
    copy_across_devices(dst, src, sst);
    return;
  }
  const bool flat = dst.is_contiguous() && src.is_contiguous() && src.sizes() == dst.sizes();
  if (flat && src.dtype() == dst.dtype()) {
    if (dst.raw_data() != src.raw_data()) std::memmove(dst.raw_data(), src.raw_data(), dst.nbytes());
    return;
  }
  dispatch(dst.dtype(), [&]<class D>() {
    dispatch(src.dtype(), [&]<class S>() {
      D* d = static_cast<D*>(dst.raw_data());
      const S* s = static_cast<const S*>(src.raw_data());
      if (flat) {
        const int64_t n = dst.numel();
#pragma omp parallel for if (n > (1 << 16)) schedule(static)
        for (int64_t i = 0; i < n; ++i) d[i] = cast_value<D>(s[i]);
        return;
      }
      for_each_row(dst.sizes(), dst.strides(), sst, [&](int64_t doff, int64_t soff, int64_t n, int64_t dstep, int64_t sstep) {
        for (int64_t i = 0; i < n; ++i) d[doff + i * dstep] = cast_value<D>(s[soff + i * sstep]);
      });
    });
  });
}

Tensor& Tensor::copy_(const Tensor& src) {
  copy_into(*this, src);
  bump_version();
  return *this;
}

Tensor& Tensor::fill_(double value) {
  if (!device().is_cpu()) {
    require_device_hooks(device(), "fill_").fill(region(*this), value, device().index);
    bump_version();
    return *this;
  }
  dispatch(dtype(), [&]<class T>() {
    const T v = cast_value<T>(value);
    T* d = static_cast<T*>(raw_data());
    if (is_contiguous()) {
      const int64_t n = numel();
#pragma omp parallel for if (n > (1 << 16)) schedule(static)
      for (int64_t i = 0; i < n; ++i) d[i] = v;
    } else {
      for_each_row(sizes(), strides(), strides(), [&](int64_t off, int64_t, int64_t n, int64_t step, int64_t) {
        for (int64_t i = 0; i < n; ++i) d[off + i * step] = v;
      });
    }
  });
  bump_version();
  return *this;
}

std::vector<double> Tensor::to_vector() const {
  std::vector<double> out(numel());
  if (out.empty()) return out;
  Tensor tmp = empty(sizes(), TensorOptions(DType::f64));
  copy_into(tmp, *this);
  std::memcpy(out.data(), tmp.raw_data(), out.size() * sizeof(double));
  return out;
}

// ---- factories ------------------------------------------------------------------------

Tensor empty(const Shape& shape, const TensorOptions& opts) {
  for (int64_t d : shape)
    ATH_CHECK(d >= 0, "empty", "negative dimension in shape ", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  const std::size_t nbytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(opts.dtype);
  impl->storage = Storage::allocate(nbytes, opts.tag.value_or(default_mem_tag()), opts.device);
  impl->sizes = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = opts.dtype;
  Tensor t(std::move(impl));
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor full(const Shape& shape, double value, const TensorOptions& opts) {
  TensorOptions o = opts;
  o.requires_grad = false;
  Tensor t = empty(shape, o);
  t.fill_(value);
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}
Tensor zeros(const Shape& shape, const TensorOptions& opts) { return full(shape, 0.0, opts); }
Tensor ones(const Shape& shape, const TensorOptions& opts) { return full(shape, 1.0, opts); }
Tensor scalar_tensor(double value, const TensorOptions& opts) { return full({}, value, opts); }

Tensor arange(int64_t start, int64_t end, const TensorOptions& opts) {
  ATH_CHECK(end >= start, "arange", "end (", end, ") < start (", start, ")");
  if (!opts.device.is_cpu()) {  // made on the host, then uploaded
    Tensor d = empty({end - start}, opts);
    copy_into(d, arange(start, end, TensorOptions(opts.dtype)));
    return d;
  }
  Tensor t = empty({end - start}, opts);
  dispatch(t.dtype(), [&]<class T>() {
    T* d = t.data_ptr<T>();
    for (int64_t i = 0; i < end - start; ++i) d[i] = cast_value<T>(static_cast<double>(start + i));
  });
  return t;
}

// On t's device, as in PyTorch.
Tensor empty_like(const Tensor& t, std::optional<DType> dtype) {
  return empty(t.sizes(), TensorOptions(dtype.value_or(t.dtype())).with_device(t.device()));
}
Tensor zeros_like(const Tensor& t, std::optional<DType> dtype) {
  return zeros(t.sizes(), TensorOptions(dtype.value_or(t.dtype())).with_device(t.device()));
}
Tensor ones_like(const Tensor& t, std::optional<DType> dtype) {
  return ones(t.sizes(), TensorOptions(dtype.value_or(t.dtype())).with_device(t.device()));
}

namespace {
template <class V> Tensor from_values(const std::vector<V>& values, const Shape& shape, const TensorOptions& opts) {
  ATH_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector", "got ", values.size(),
            " values for shape ", shape_str(shape), " (", shape_numel(shape), " elements)");
  TensorOptions o = opts;
  o.requires_grad = false;
  if (!opts.device.is_cpu()) {  // made on the host, then uploaded
    Tensor d = empty(shape, o);
    copy_into(d, from_values(values, shape, TensorOptions(opts.dtype)));
    if (opts.requires_grad) d.requires_grad_(true);
    return d;
  }
  Tensor t = empty(shape, o);
  dispatch(t.dtype(), [&]<class T>() {
    T* d = static_cast<T*>(t.raw_data());
    for (size_t i = 0; i < values.size(); ++i) d[i] = cast_value<T>(values[i]);
  });
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}
}  // namespace
Tensor from_vector(const std::vector<double>& v, const Shape& s, const TensorOptions& o) { return from_values(v, s, o); }
Tensor from_vector(const std::vector<float>& v, const Shape& s, const TensorOptions& o) { return from_values(v, s, o); }
Tensor from_vector(const std::vector<int64_t>& v, const Shape& s, const TensorOptions& o) { return from_values(v, s, o); }

Tensor make_view(const Tensor& base, const Shape& sizes, const Shape& strides, int64_t offset) {
  ATH_ASSERT(sizes.size() == strides.size());
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->sizes = sizes;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

// ---- printing -------------------------------------------------------------------------

std::string Tensor::to_string(int64_t max_elements) const {
  if (!defined()) return "tensor(<undefined>)";
  std::ostringstream o;
  o << "tensor(" << shape_str(sizes()) << ", " << dtype_name(dtype());
  if (requires_grad()) o << ", requires_grad";
  o << ") [";
  const int64_t n = numel();
  const int64_t shown = std::min(n, max_elements);
  Tensor flat = empty(sizes(), TensorOptions(DType::f64));
  copy_into(flat, *this);
  const double* d = flat.data_ptr<double>();
  o << std::setprecision(6);
  for (int64_t i = 0; i < shown; ++i) o << (i ? ", " : "") << d[i];
  if (shown < n) o << ", … (" << n - shown << " more)";
  o << "]";
  return o.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.to_string(); }

}  // namespace athanor
