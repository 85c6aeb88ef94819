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
#include "ops/op_def.h"
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

using detail::Grads;
using detail::Inputs;

struct IndexArgs {
  int64_t dim = 0;
};
struct IndexSaved : OpSaved {
  SavedTensor index;
  Shape in, sub;  // x's shape; gather: the part of x the index reaches
  DType dtype = DType::f32;
  int64_t outer = 1, xdim = 1, n = 0, inner = 1;
};

std::vector<Tensor> index_select_cpu(OpCall& c) {
  const Tensor &x = c.in(0), &index = c.in(1);
  const int64_t dim = c.args<IndexArgs>().dim;
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
  if (!is_floating(x.dtype())) c.set_differentiable(false);
  else if (c.records()) {
    IndexSaved& s = c.save<IndexSaved>();
    s.index = save(ic, "index"), s.in = x.sizes(), s.dtype = x.dtype();
    s.outer = outer, s.xdim = xdim, s.n = n, s.inner = inner;
  }
  return {out};
}

Grads index_select_backward(const Node& node, const Grads& g, const OpSaved& saved) {
  const IndexSaved& s = saved.as<IndexSaved>();
  const Tensor ic = s.index.unpack(node);
  // grad_x[.., v, ..] = sum over j with index[j] == v of g[.., j, ..] (duplicates accumulate).
  const DType work = s.dtype == DType::f64 ? DType::f64 : DType::f32;
  const Tensor gc = detail::to_raw(g[0], work);
  Tensor gx = empty(s.in, TensorOptions(work));
  dispatch(work, [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
      dispatch_index(ic.dtype(), [&]<class I>() {
        cpu::index_add_3d<T, I>(static_cast<const T*>(gc.raw_data()), ic.data_ptr<I>(), static_cast<T*>(gx.raw_data()),
                                s.outer, s.xdim, s.n, s.inner);
      });
  });
  return {work == s.dtype ? gx : detail::to_raw(gx, s.dtype), Tensor()};
}

std::vector<Tensor> gather_cpu(OpCall& c) {
  const Tensor &x = c.in(0), &index = c.in(1);
  const int64_t dim = c.args<IndexArgs>().dim;
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
  if (!is_floating(x.dtype())) c.set_differentiable(false);
  else if (c.records()) {
    IndexSaved& s = c.save<IndexSaved>();
    s.index = save(ic, "index"), s.in = x.sizes(), s.sub = sub_sz, s.dtype = x.dtype();
    s.outer = outer, s.xdim = xdim, s.n = n, s.inner = inner;
  }
  return {out};
}

Grads gather_backward(const Node& node, const Grads& g, const OpSaved& saved) {
  const IndexSaved& s = saved.as<IndexSaved>();
  const Tensor ic = s.index.unpack(node);
  // grad_x[.., index[.., j, ..], ..] += g[.., j, ..] (a scatter-add; duplicates accumulate).
  const DType work = s.dtype == DType::f64 ? DType::f64 : DType::f32;
  const Tensor gc = detail::to_raw(g[0], work);
  Tensor gsub = empty(s.sub, TensorOptions(work));
  if (gsub.numel() > 0) {
    dispatch(work, [&]<class T>() {
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
        dispatch_index(ic.dtype(), [&]<class I>() {
          cpu::scatter_add_3d<T, I>(static_cast<const T*>(gc.raw_data()), ic.data_ptr<I>(), static_cast<T*>(gsub.raw_data()),
                                    s.outer, s.xdim, s.n, s.inner);
        });
    });
  }
  if (s.sub == s.in) return {work == s.dtype ? gsub : detail::to_raw(gsub, s.dtype), Tensor()};
  Tensor gx = zeros(s.in, TensorOptions(s.dtype));  // the part of x the index cannot reach gets zero
  copy_into(make_view(gx, s.sub, gx.strides(), 0), gsub);
  return {gx, Tensor()};
}

// The references: each output element read by its index, coordinate by coordinate.
std::vector<int64_t> index_values(const Tensor& index) {
  std::vector<int64_t> v;
  for (double e : index.to_vector()) v.push_back(static_cast<int64_t>(e));
  return v;
}
std::vector<Tensor> index_select_reference(OpCall& c) {
  const Tensor& x = c.in(0);
  const int64_t d = detail::wrap_dim(c.args<IndexArgs>().dim, x.dim(), "reference");
  const std::vector<int64_t> idx = index_values(c.in(1));
  Shape out = x.sizes();
  if (x.dim() > 0) out[d] = static_cast<int64_t>(idx.size());
  return {detail::ref_gather(x, out, [&](const Shape& oc) {
    Shape ic = oc;
    if (!ic.empty()) ic[d] = idx[static_cast<size_t>(oc[d])];
    return ic;
  })};
}
std::vector<Tensor> gather_reference(OpCall& c) {
  const Tensor& x = c.in(0);
  const Tensor& index = c.in(1);
  const int64_t d = detail::wrap_dim(c.args<IndexArgs>().dim, x.dim(), "reference");
  const std::vector<int64_t> idx = index_values(index);
  const Shape ist = contiguous_strides(index.sizes());
  return {detail::ref_gather(x, index.sizes(), [&](const Shape& oc) {
    int64_t flat = 0;
    for (size_t i = 0; i < oc.size(); ++i) flat += oc[i] * ist[i];
    Shape ic = oc;
    if (!ic.empty()) ic[d] = idx[static_cast<size_t>(flat)];
    return ic;
  })};
}

std::vector<OpCase> index_select_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const IndexArgs& a) { return Inputs{index_select(t[0], a.dim, t[1])}; };
  return {
      make_case<IndexArgs>("x [5, 3], dim 0, index [4] with a repeat", {case_randn({5, 3 * s}, 1), case_fixed(from_vector(std::vector<int64_t>{4, 0, 4, 2}, {4}))},
                           {0}, call),
      make_case<IndexArgs>("x [2, 6] transposed, dim 1, i32 index [3]",
                           {case_randn({2 * s, 6}, 2, CaseLayout::transposed), case_fixed(from_vector(std::vector<int64_t>{5, 1, 3}, {3}).to(DType::i32))},
                           {1}, call),
      make_case<IndexArgs>("x [3, 4, 2] strided, dim -2, index [2] strided",
                           {case_randn({3 * s, 4, 2}, 3, CaseLayout::strided),
                            case_fixed(from_vector(std::vector<int64_t>{3, 3}, {2}), CaseLayout::strided)}, {-2}, call),
  };
}
std::vector<OpCase> gather_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const IndexArgs& a) { return Inputs{gather(t[0], a.dim, t[1])}; };
  return {
      make_case<IndexArgs>("x [3, 4], dim 1, index [3, 2]", {case_randn({3, 4 * s}, 1),
                                                                   case_fixed(from_vector(std::vector<int64_t>{0, 3, 2, 2, 1, 0}, {3, 2}))},
                           {1}, call),
      make_case<IndexArgs>("x [4, 3] transposed, dim 0, index [2, 2] (reaches part of x)",
                           {case_randn({4 * s, 3}, 2, CaseLayout::transposed), case_fixed(from_vector(std::vector<int64_t>{3, 0, 1, 1}, {2, 2}))},
                           {0}, call),
  };
}
}  // namespace

namespace ops {
const OpDef& index_select_op() {
  static const OpDef d{.name = "index_select", .inputs = {"x", "index"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(index_select_cpu, index_select_backward), .reference = index_select_reference,
                       .dtypes = detail::kFloatDTypes, .cases = index_select_cases,
                       .derivative = "scatter-add of g at the indices", .file = "src/ops/indexing.cpp"};
  return d;
}
const OpDef& gather_op() {
  static const OpDef d{.name = "gather", .inputs = {"x", "index"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(gather_cpu, gather_backward), .reference = gather_reference,
                       .dtypes = detail::kFloatDTypes, .cases = gather_cases,
                       .derivative = "scatter-add of g at the indices", .file = "src/ops/indexing.cpp"};
  return d;
}
}  // namespace ops

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  return call_op(ops::index_select_op(), {x, index}, IndexArgs{dim});
}
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) { return call_op(ops::gather_op(), {x, index}, IndexArgs{dim}); }

}  // namespace athanor
