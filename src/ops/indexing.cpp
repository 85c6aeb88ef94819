// index_select and gather.
//
// Both view the input as [outer, dim, inner] around the indexed dim and call a
// copy kernel (cpu::index_select_3d / cpu::gather_3d). Indices are validated
// first; a bad one raises an Error naming its value, its position and the size
// it must stay under.
// Backward: out[.., j, ..] = x[.., idx(j), ..] so d out_j / d x_v = [idx(j) == v]
// and grad_x[v] = sum_{j : idx(j) == v} g[j]: a scatter-add where duplicate
// indices accumulate (cpu::index_add_3d / cpu::scatter_add_3d, deterministic).
// bf16/f16 gradients are accumulated in f32 and rounded once.
#include <string>

#include "athanor/ops/shape.h"
#include "backend/cpu/index.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {

void check_index_dtype(const Tensor& index, const char* op) {
  detail::check_defined(index, op, "index");
  ATH_CHECK(index.dtype() == DType::i64 || index.dtype() == DType::i32, op, "index must be i64 or i32, got ",
            index.describe(), Hint{"convert the index with .to(DType::i64)"});
}

// "[1, 2]": the coordinates of flat position `flat` in a tensor of shape s.
std::string coords(int64_t flat, const Shape& s) {
  Shape c(s.size());
  for (int64_t d = static_cast<int64_t>(s.size()) - 1; d >= 0; --d) {
    c[d] = s[d] ? flat % s[d] : 0;
    flat = s[d] ? flat / s[d] : 0;
  }
  return shape_str(c);
}

// Raises when a value of the contiguous index `ic` is outside [0, limit).
void check_range(const Tensor& ic, const Shape& index_shape, int64_t limit, const char* op, const Tensor& x, int64_t d) {
  int64_t bad = -1, value = 0;
  if (ic.dtype() == DType::i64) {
    bad = cpu::first_out_of_range(ic.data_ptr<int64_t>(), ic.numel(), limit);
    if (bad >= 0) value = ic.data_ptr<int64_t>()[bad];
  } else {
    bad = cpu::first_out_of_range(ic.data_ptr<int32_t>(), ic.numel(), limit);
    if (bad >= 0) value = ic.data_ptr<int32_t>()[bad];
  }
  ATH_CHECK(bad < 0, op, "index ", value, " at position ", coords(bad, index_shape), " is out of range for dimension ",
            d, " of size ", limit, " (input ", x.describe(), ", index ", shape_str(index_shape), ")",
            Hint{"indices must be in [0, " + std::to_string(limit) + "); negative indices are not wrapped"});
}

// Calls fn.template operator()<I>() with the C++ type of an i32/i64 index.
template <class Fn> void dispatch_index(DType dt, Fn&& fn) {
  if (dt == DType::i64) fn.template operator()<int64_t>();
  else fn.template operator()<int32_t>();
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  const char* op = "index_select";
  detail::check_defined(x, op, "x");
  check_index_dtype(index, op);
  ATH_CHECK(index.dim() <= 1, op, "index must be 1-D, got ", index.describe(),
            Hint{"flatten the index (reshape({-1})) and reshape the result, or use gather for per-element indices"});
  const bool scalar_x = x.dim() == 0;
  const int64_t d = detail::wrap_dim(dim, x.dim(), op);
  const int64_t xdim = scalar_x ? 1 : x.sizes()[d];
  const Tensor ic = detail::contiguous_raw(index);
  const int64_t n = ic.numel();
  check_range(ic, {n}, xdim, op, x, d);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i < d) outer *= x.sizes()[i];
    if (i > d) inner *= x.sizes()[i];
  }
  Shape out_shape = x.sizes();
  if (!scalar_x) out_shape[d] = n;  // a 0-d x with a 0-d/1-element index stays 0-d
  else ATH_CHECK(n == 1, op, "a 0-d input takes exactly one index, got ", index.describe());
  Tensor out = empty(out_shape, TensorOptions(x.dtype()));
  const Tensor xc = detail::contiguous_raw(x);
  dispatch(x.dtype(), [&]<class T>() {
    dispatch_index(ic.dtype(), [&]<class I>() {
      cpu::index_select_3d<T, I>(static_cast<const T*>(xc.raw_data()), ic.data_ptr<I>(), static_cast<T*>(out.raw_data()),
                                 outer, xdim, n, inner);
    });
  });
  if (!is_floating(x.dtype()) || !any_requires_grad({x})) return out;
  const Shape in = x.sizes();
  const DType dt = x.dtype();
  return record(op, {x}, out, [si = save(ic, "index"), in, dt, outer, xdim, n, inner](const Node& node, const Grads& g) {
    const Tensor ic = si.unpack(node);
    // grad_x[.., v, ..] = sum over j with index[j] == v of g[.., j, ..] (duplicates accumulate).
    const DType work = dt == DType::f64 ? DType::f64 : DType::f32;
    const Tensor gc = detail::to_raw(g[0], work);
    Tensor gx = empty(in, TensorOptions(work));
    dispatch(work, [&]<class T>() {
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
        dispatch_index(ic.dtype(), [&]<class I>() {
          cpu::index_add_3d<T, I>(static_cast<const T*>(gc.raw_data()), ic.data_ptr<I>(), static_cast<T*>(gx.raw_data()),
                                  outer, xdim, n, inner);
        });
    });
    return Grads{work == dt ? gx : detail::to_raw(gx, dt)};
  });
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  const char* op = "gather";
  detail::check_defined(x, op, "x");
  check_index_dtype(index, op);
  ATH_CHECK(index.dim() == x.dim(), op, "index must have the same number of dims as the input: index ",
            index.describe(), ", input ", x.describe(),
            Hint{"unsqueeze the index so that it has one entry per output element (e.g. idx.unsqueeze(-1))"});
  const int64_t d = detail::wrap_dim(dim, x.dim(), op);
  const bool scalar_x = x.dim() == 0;
  for (int64_t i = 0; i < x.dim(); ++i)
    ATH_CHECK(i == d || index.sizes()[i] <= x.sizes()[i], op, "index ", shape_str(index.sizes()),
              " is larger than the input ", shape_str(x.sizes()), " in dimension ", i,
              Hint{"index.size(i) must be <= input.size(i) for every dim i != dim"});
  const int64_t xdim = scalar_x ? 1 : x.sizes()[d];
  const Tensor ic = detail::contiguous_raw(index);
  check_range(ic, index.sizes(), xdim, op, x, d);
  // The part of x that index can reach: index's sizes except along d (a view, copied only if strided).
  Shape sub_sz = index.sizes();
  if (!scalar_x) sub_sz[d] = xdim;
  const Tensor xs = detail::contiguous_raw(make_view(x, sub_sz, x.strides(), x.storage_offset()));
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i < d) outer *= sub_sz[i];
    if (i > d) inner *= sub_sz[i];
  }
  const int64_t n = scalar_x ? 1 : index.sizes()[d];
  Tensor out = empty(index.sizes(), TensorOptions(x.dtype()));
  if (out.numel() > 0) {
    dispatch(x.dtype(), [&]<class T>() {
      dispatch_index(ic.dtype(), [&]<class I>() {
        cpu::gather_3d<T, I>(static_cast<const T*>(xs.raw_data()), ic.data_ptr<I>(), static_cast<T*>(out.raw_data()),
                             outer, xdim, n, inner);
      });
    });
  }
  if (!is_floating(x.dtype()) || !any_requires_grad({x})) return out;
  const Shape in = x.sizes();
  const DType dt = x.dtype();
  return record(op, {x}, out, [si = save(ic, "index"), in, sub_sz, dt, outer, xdim, n, inner](const Node& node,
                                                                                              const Grads& g) {
    const Tensor ic = si.unpack(node);
    // grad_x[.., index[.., j, ..], ..] += g[.., j, ..] (a scatter-add; duplicates accumulate).
    const DType work = dt == DType::f64 ? DType::f64 : DType::f32;
    const Tensor gc = detail::to_raw(g[0], work);
    Tensor gsub = empty(sub_sz, TensorOptions(work));
    if (gsub.numel() > 0) {
      dispatch(work, [&]<class T>() {
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
          dispatch_index(ic.dtype(), [&]<class I>() {
            cpu::scatter_add_3d<T, I>(static_cast<const T*>(gc.raw_data()), ic.data_ptr<I>(),
                                      static_cast<T*>(gsub.raw_data()), outer, xdim, n, inner);
          });
      });
    }
    if (sub_sz == in) return Grads{work == dt ? gsub : detail::to_raw(gsub, dt)};
    Tensor gx = zeros(in, TensorOptions(dt));  // the part of x the index cannot reach gets zero
    copy_into(make_view(gx, sub_sz, gx.strides(), 0), gsub);
    return Grads{gx};
  });
}

}  // namespace athanor
