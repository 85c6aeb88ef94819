// Broadcasting and the view ops (view, reshape, flatten, permute, transpose,
// expand, squeeze, unsqueeze) plus contiguous/clone/cast. Views share storage;
// each backward maps the gradient back to the input's geometry. view, permute, expand,
// unsqueeze, clone and cast are registered ops; reshape, flatten, transpose, squeeze and
// contiguous are built from them.
#include <functional>
#include <numeric>
#include <optional>

#include "athanor/ops/reduction.h"
#include "athanor/ops/shape.h"
#include "backend/cpu/unary.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
using detail::wrap_dim;

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t nd = std::max(a.size(), b.size());
  Shape out(nd);
  for (size_t i = 0; i < nd; ++i) {
    const int64_t ia = static_cast<int64_t>(i) - static_cast<int64_t>(nd - a.size());
    const int64_t ib = static_cast<int64_t>(i) - static_cast<int64_t>(nd - b.size());
    const int64_t sa = ia >= 0 ? a[ia] : 1, sb = ib >= 0 ? b[ib] : 1;
    ATH_CHECK(sa == sb || sa == 1 || sb == 1, op, "shapes ", shape_str(a), " and ", shape_str(b),
              " cannot be broadcast: dimension ", i, " is ", sa, " vs ", sb,
              Hint{"sizes must match or one of them must be 1 (align shapes from the right; use reshape/unsqueeze)"});
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.sizes() == shape) return grad;
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  ATH_CHECK(lead >= 0, "sum_to", "cannot reduce ", grad.describe(), " to ", shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < grad.dim(); ++i)
    if (i < lead || (shape[i - lead] == 1 && grad.sizes()[i] != 1)) dims.push_back(i);
  Tensor r = dims.empty() ? grad : sum(grad, dims, /*keepdim=*/true);
  return reshape(r, shape);
}

namespace {
Shape infer_size(const Shape& shape, int64_t numel, const char* op) {
  Shape out = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      ATH_CHECK(infer < 0, op, "only one dimension can be -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      ATH_CHECK(out[i] >= 0, op, "invalid size ", out[i], " in ", shape_str(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    ATH_CHECK(known != 0 && numel % known == 0, op, "shape ", shape_str(shape), " is invalid for ", numel, " elements");
    out[infer] = numel / known;
  }
  ATH_CHECK(shape_numel(out) == numel, op, "shape ", shape_str(shape), " is invalid for an input of ", numel,
            " elements", Hint{"the product of the new sizes must equal the number of elements"});
  return out;
}

// Strides for viewing (old sizes, old strides) as `shape` without a copy, if possible
// (the algorithm of PyTorch's computeStride: dims may merge/split only within
// chunks that are contiguous in memory).
std::optional<Shape> view_strides(const Shape& old_sz, const Shape& old_st, const Shape& shape) {
  if (old_sz.empty()) return Shape(shape.size(), 1);
  const int64_t numel = shape_numel(old_sz);
  if (numel == 0) return contiguous_strides(shape);
  Shape st(shape.size());
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base = old_st.back(), tensor_numel = 1, view_numel = 1;
  for (int64_t td = static_cast<int64_t>(old_sz.size()) - 1; td >= 0; --td) {
    tensor_numel *= old_sz[td];
    if (td == 0 || (old_sz[td - 1] != 1 && old_st[td - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        st[view_d] = view_numel * chunk_base;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (td > 0) {
        chunk_base = old_st[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return st;
}

using detail::Grads;
using detail::Inputs;

struct ShapeArgs {
  Shape shape;  // view, expand: the new sizes; permute: the permutation
};
struct DimArgs {
  int64_t dim = 0;
};
struct CastArgs {
  DType to = DType::f32;
};
// What a view's backward needs: the input's sizes (view, unsqueeze, expand) or the
// inverse permutation (permute).
struct ViewSaved : OpSaved {
  Shape in;
};

// ---- view: the same elements under new sizes (one may be -1), without a copy
std::vector<Tensor> view_cpu(OpCall& c) {
  const Tensor& x = c.in(0);
  detail::check_defined(x, "view", "x");
  const Shape sz = infer_size(c.args<ShapeArgs>().shape, x.numel(), "view");
  auto st = view_strides(x.sizes(), x.strides(), sz);
  ATH_CHECK(st.has_value(), "view", "cannot view ", x.describe(), " with strides ", shape_str(x.strides()), " as ",
            shape_str(sz), Hint{"the tensor is not contiguous in the needed way; use reshape() (which copies) or contiguous() first"});
  if (c.records()) c.save<ViewSaved>().in = x.sizes();
  return {make_view(x, sz, *st, x.storage_offset())};
}
Grads reshape_back(const Node&, const Grads& g, const OpSaved& s) { return {reshape(g[0], s.as<ViewSaved>().in)}; }

// ---- permute: dims reordered (strides permuted)
std::vector<Tensor> permute_cpu(OpCall& c) {
  const Tensor& x = c.in(0);
  const std::vector<int64_t>& dims = c.args<ShapeArgs>().shape;
  detail::check_defined(x, "permute", "x");
  ATH_CHECK(static_cast<int64_t>(dims.size()) == x.dim(), "permute", "got ", dims.size(), " dims for a ", x.dim(), "-D tensor ",
            x.describe());
  std::vector<int64_t> p(dims.size()), inv(dims.size());
  std::vector<bool> seen(dims.size(), false);
  Shape sz(dims.size()), st(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    p[i] = wrap_dim(dims[i], x.dim(), "permute");
    ATH_CHECK(!seen[p[i]], "permute", "dimension ", p[i], " repeated in the permutation");
    seen[p[i]] = true;
    inv[p[i]] = static_cast<int64_t>(i);
    sz[i] = x.sizes()[p[i]];
    st[i] = x.strides()[p[i]];
  }
  if (c.records()) c.save<ViewSaved>().in = inv;
  return {make_view(x, sz, st, x.storage_offset())};
}
Grads permute_backward(const Node&, const Grads& g, const OpSaved& s) { return {permute(g[0], s.as<ViewSaved>().in)}; }

// ---- expand: size-1 dims repeated (stride 0), new leading dims
std::vector<Tensor> expand_cpu(OpCall& c) {
  const Tensor& x = c.in(0);
  const Shape& shape = c.args<ShapeArgs>().shape;
  detail::check_defined(x, "expand", "x");
  const int64_t nd = static_cast<int64_t>(shape.size());
  ATH_CHECK(nd >= x.dim(), "expand", "cannot expand ", x.describe(), " to fewer dimensions ", shape_str(shape));
  Shape sz(nd), st(nd);
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t xi = i - (nd - x.dim());
    const int64_t xs = xi >= 0 ? x.sizes()[xi] : 1;
    const int64_t want = shape[i] == -1 ? xs : shape[i];
    ATH_CHECK(xi >= 0 || shape[i] != -1, "expand", "-1 is not allowed for a new leading dimension in ", shape_str(shape));
    ATH_CHECK(xs == want || xs == 1, "expand", "cannot expand ", x.describe(), " to ", shape_str(shape), ": dimension ", i,
              " has size ", xs, Hint{"only dimensions of size 1 can be expanded"});
    sz[i] = want;
    st[i] = (xi >= 0 && xs == want) ? x.strides()[xi] : 0;
  }
  if (c.records()) c.save<ViewSaved>().in = x.sizes();
  return {make_view(x, sz, st, x.storage_offset())};
}
Grads expand_backward(const Node&, const Grads& g, const OpSaved& s) { return {sum_to(g[0], s.as<ViewSaved>().in)}; }

// ---- unsqueeze: a new dim of size 1
std::vector<Tensor> unsqueeze_cpu(OpCall& c) {
  const Tensor& x = c.in(0);
  detail::check_defined(x, "unsqueeze", "x");
  const int64_t d = wrap_dim(c.args<DimArgs>().dim, x.dim() + 1, "unsqueeze");
  Shape sz = x.sizes(), st = x.strides();
  const int64_t new_stride = d < x.dim() ? x.strides()[d] * x.sizes()[d] : 1;
  sz.insert(sz.begin() + d, 1);
  st.insert(st.begin() + d, new_stride);
  if (c.records()) c.save<ViewSaved>().in = x.sizes();
  return {make_view(x, sz, st, x.storage_offset())};
}

// ---- clone: a contiguous copy
std::vector<Tensor> clone_cpu(OpCall& c) {
  detail::check_defined(c.in(0), "clone", "x");
  Tensor out = empty(c.in(0).sizes(), TensorOptions(c.in(0).dtype()).with_device(c.in(0).device()));
  copy_into(out, c.in(0));  // any device: core's copy (a strided copy kernel on CUDA)
  return {out};
}
Grads identity_backward(const Node&, const Grads& g, const OpSaved&) { return {g[0]}; }

// ---- cast: the values converted to another dtype (no gradient into integer dtypes)
struct CastSaved : OpSaved {
  DType in = DType::f32;
};
std::vector<Tensor> cast_cpu(OpCall& c) {
  const Tensor& x = c.in(0);
  const DType dtype = c.args<CastArgs>().to;
  detail::check_defined(x, "cast", "x");
  Tensor out = empty(x.sizes(), TensorOptions(dtype).with_device(x.device()));
  if (!x.device().is_cpu() || !x.is_contiguous() || !cpu::convert(x.dtype(), dtype, x.raw_data(), out.raw_data(), x.numel()))
    copy_into(out, x);  // on a device: core's copy converts there
  if (!is_floating(dtype)) c.set_differentiable(false);
  else if (c.records()) c.save<CastSaved>().in = x.dtype();
  return {out};
}
Grads cast_backward(const Node&, const Grads& g, const OpSaved& s) { return {cast(g[0], s.as<CastSaved>().in)}; }

// ---- the references: each output element read from the logical input by plain index
// arithmetic (out coordinates -> in coordinates), in f64.
Shape unravel(int64_t flat, const Shape& shape) {
  Shape c(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) c[d] = flat % shape[d], flat /= shape[d];
  return c;
}
int64_t ravel(const Shape& c, const Shape& shape) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + c[d];
  return f;
}
std::vector<Tensor> view_reference(OpCall& c) {  // row-major order kept: out element k is input element k
  const Shape in = c.in(0).sizes(), out = infer_size(c.args<ShapeArgs>().shape, c.in(0).numel(), "reference");
  return {detail::ref_gather(c.in(0), out, [&](const Shape& oc) { return unravel(ravel(oc, out), in); })};
}
std::vector<Tensor> permute_reference(OpCall& c) {
  const Shape& p = c.args<ShapeArgs>().shape;
  const int64_t nd = c.in(0).dim();
  Shape out(p.size());
  for (size_t i = 0; i < p.size(); ++i) out[i] = c.in(0).sizes()[(p[i] + nd) % nd];
  return {detail::ref_gather(c.in(0), out, [&](const Shape& oc) {
    Shape ic(oc.size());
    for (size_t i = 0; i < p.size(); ++i) ic[(p[i] + nd) % nd] = oc[i];
    return ic;
  })};
}
std::vector<Tensor> expand_reference(OpCall& c) {
  const Shape in = c.in(0).sizes(), want = c.args<ShapeArgs>().shape;
  const size_t lead = want.size() - in.size();
  Shape out = want;
  for (size_t i = 0; i < in.size(); ++i)
    if (out[lead + i] == -1) out[lead + i] = in[i];
  return {detail::ref_gather(c.in(0), out, [&](const Shape& oc) {
    Shape ic(in.size());
    for (size_t i = 0; i < in.size(); ++i) ic[i] = in[i] == 1 ? 0 : oc[lead + i];
    return ic;
  })};
}
std::vector<Tensor> unsqueeze_reference(OpCall& c) {
  Shape out = c.in(0).sizes();
  const int64_t d = c.args<DimArgs>().dim;
  out.insert(out.begin() + (d < 0 ? d + c.in(0).dim() + 1 : d), 1);
  return {detail::ref64(c.in(0)).contiguous().view(out)};
}
std::vector<Tensor> clone_reference(OpCall& c) {
  return {from_vector(c.in(0).to_vector(), c.in(0).sizes(), TensorOptions(DType::f64))};
}
std::vector<Tensor> cast_reference(OpCall& c) {  // rounded to the target dtype by from_vector, then widened
  return {detail::ref64(from_vector(c.in(0).to_vector(), c.in(0).sizes(), TensorOptions(c.args<CastArgs>().to)))};
}

std::vector<OpCase> view_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const ShapeArgs& a) { return Inputs{view(t[0], a.shape)}; };
  return {
      make_case<ShapeArgs>("x [4, 6] as [2, -1, 3]", {case_randn({4 * s, 6}, 1)}, {{2, -1, 3}}, call),
      make_case<ShapeArgs>("x [3, 4] as [12]", {case_randn({3 * s, 4}, 2)}, {{-1}}, call),
      // a transposed tensor can split its leading dim (stride 1), not merge the two
      make_case<ShapeArgs>("x [6, 2] transposed as [3, 2, 2]", {case_randn({6 * s, 2}, 3, CaseLayout::transposed)},
                           {{3, 2 * s, 2}}, call),
  };
}
std::vector<OpCase> permute_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const ShapeArgs& a) { return Inputs{permute(t[0], a.shape)}; };
  return {
      make_case<ShapeArgs>("x [2, 3, 4], {2, 0, 1}", {case_randn({2 * s, 3, 4}, 1)}, {{2, 0, 1}}, call),
      make_case<ShapeArgs>("x [3, 5] transposed, {1, 0}", {case_randn({3 * s, 5}, 2, CaseLayout::transposed)}, {{1, 0}}, call),
      make_case<ShapeArgs>("x [4, 2, 3] strided, {-1, 1, 0}", {case_randn({4 * s, 2, 3}, 3, CaseLayout::strided)}, {{-1, 1, 0}}, call),
  };
}
std::vector<OpCase> expand_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const ShapeArgs& a) { return Inputs{expand(t[0], a.shape)}; };
  return {
      make_case<ShapeArgs>("x [3, 1] to [3, 4]", {case_randn({3 * s, 1}, 1)}, {{3 * s, 4}}, call),
      make_case<ShapeArgs>("x [4] to [2, 3, 4] (new dims)", {case_randn({4}, 2)}, {{2 * s, 3, 4}}, call),
      make_case<ShapeArgs>("x [1, 5] strided to [3, -1]", {case_randn({1, 5}, 3, CaseLayout::strided)}, {{3 * s, -1}}, call),
  };
}
std::vector<OpCase> unsqueeze_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const DimArgs& a) { return Inputs{unsqueeze(t[0], a.dim)}; };
  return {
      make_case<DimArgs>("x [3, 4], dim 1", {case_randn({3 * s, 4}, 1)}, {1}, call),
      make_case<DimArgs>("x [2, 3] transposed, dim -1", {case_randn({2 * s, 3}, 2, CaseLayout::transposed)}, {-1}, call),
      make_case<DimArgs>("x [] (0-d), dim 0", {case_randn({}, 3)}, {0}, call),
  };
}
std::vector<OpCase> cast_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const CastArgs& a) { return Inputs{cast(t[0], a.to)}; };
  std::vector<OpCase> cases = {
      make_case<CastArgs>("x [4, 5] to f32", {case_randn({4 * s, 5}, 1)}, {DType::f32}, call),
      make_case<CastArgs>("x [3, 4] transposed to f64", {case_randn({3 * s, 4}, 2, CaseLayout::transposed)}, {DType::f64}, call),
      make_case<CastArgs>("x [6] strided to bf16", {case_randn({6 * s}, 3, CaseLayout::strided)}, {DType::bf16}, call),
      make_case<CastArgs>("x [2, 3] to f16", {case_randn({2 * s, 3}, 4)}, {DType::f16}, call),
  };
  // In f64 every cast but the identity narrows: its backward (the gradient cast back) is
  // checked by tests/ops/test_shape_ops.cpp (ViewOps.CastBackwardReturnsInputDtype).
  for (OpCase& c : cases)
    c.no_gradcheck = "from f64 a cast narrows (or is the identity, no op): the rounding swallows a finite-difference step";
  return cases;
}
}  // namespace

namespace ops {
const OpDef& view_op() {
  static const OpDef d{.name = "view", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(view_cpu, reshape_back), .reference = view_reference,
                       .dtypes = detail::kFloatDTypes, .cases = view_cases,
                       .derivative = "reshape(g, input shape)", .file = "src/ops/shape_views.cpp"};
  return d;
}
const OpDef& permute_op() {
  static const OpDef d{.name = "permute", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(permute_cpu, permute_backward), .reference = permute_reference,
                       .dtypes = detail::kFloatDTypes, .cases = permute_cases,
                       .derivative = "permute(g, inverse)", .file = "src/ops/shape_views.cpp"};
  return d;
}
const OpDef& expand_op() {
  static const OpDef d{.name = "expand", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(expand_cpu, expand_backward), .reference = expand_reference,
                       .dtypes = detail::kFloatDTypes, .cases = expand_cases,
                       .derivative = "sum_to(g, input shape)", .file = "src/ops/shape_views.cpp"};
  return d;
}
const OpDef& unsqueeze_op() {
  static const OpDef d{.name = "unsqueeze", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(unsqueeze_cpu, reshape_back), .reference = unsqueeze_reference,
                       .dtypes = detail::kFloatDTypes, .cases = unsqueeze_cases,
                       .derivative = "reshape(g, input shape)", .file = "src/ops/shape_views.cpp"};
  return d;
}
const OpDef& clone_op() {
  static const OpDef d{.name = "clone", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(clone_cpu, identity_backward), .reference = clone_reference,
                       .dtypes = detail::kFloatDTypes,
                       .cases = [](int s) { return detail::unary_cases(s, [](const Inputs& t) { return Inputs{clone(t[0])}; }, -3, 3); },
                       .derivative = "g", .file = "src/ops/shape_views.cpp"};
  return d;
}
const OpDef& cast_op() {
  static const OpDef d{.name = "cast", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(cast_cpu, cast_backward), .reference = cast_reference,
                       .dtypes = detail::kFloatDTypes, .cases = cast_cases,
                       .derivative = "cast(g, input dtype)", .file = "src/ops/shape_views.cpp"};
  return d;
}
}  // namespace ops

Tensor view(const Tensor& x, const Shape& shape) { return call_op(ops::view_op(), {x}, ShapeArgs{shape}); }

Tensor reshape(const Tensor& x, const Shape& shape) {
  detail::check_defined(x, "reshape", "x");
  const Shape sz = infer_size(shape, x.numel(), "reshape");
  if (view_strides(x.sizes(), x.strides(), sz)) return view(x, sz);
  return view(contiguous(x), sz);
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.dim() == 0) return reshape(x, {1});
  const int64_t s = wrap_dim(start_dim, x.dim(), "flatten"), e = wrap_dim(end_dim, x.dim(), "flatten");
  ATH_CHECK(s <= e, "flatten", "start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape sz;
  for (int64_t i = 0; i < s; ++i) sz.push_back(x.sizes()[i]);
  int64_t m = 1;
  for (int64_t i = s; i <= e; ++i) m *= x.sizes()[i];
  sz.push_back(m);
  for (int64_t i = e + 1; i < x.dim(); ++i) sz.push_back(x.sizes()[i]);
  return reshape(x, sz);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) { return call_op(ops::permute_op(), {x}, ShapeArgs{dims}); }

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  detail::check_defined(x, "transpose", "x");
  if (x.dim() < 2 && d0 == d1) return permute(x, x.dim() == 1 ? std::vector<int64_t>{0} : std::vector<int64_t>{});
  std::vector<int64_t> p(x.dim());
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[wrap_dim(d0, x.dim(), "transpose")], p[wrap_dim(d1, x.dim(), "transpose")]);
  return permute(x, p);
}

Tensor expand(const Tensor& x, const Shape& shape) { return call_op(ops::expand_op(), {x}, ShapeArgs{shape}); }

Tensor squeeze(const Tensor& x, int64_t dim) {
  const int64_t d = wrap_dim(dim, x.dim(), "squeeze");
  if (x.dim() == 0) return view(x, {});  // squeezing a scalar is the identity
  if (x.sizes()[d] != 1) return view(x, x.sizes());
  Shape sz = x.sizes();
  sz.erase(sz.begin() + d);
  return reshape(x, sz);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) { return call_op(ops::unsqueeze_op(), {x}, DimArgs{dim}); }

Tensor contiguous(const Tensor& x) {
  detail::check_defined(x, "contiguous", "x");
  if (x.is_contiguous()) return x;
  return clone(x);
}

Tensor clone(const Tensor& x) { return call_op(ops::clone_op(), {x}); }

Tensor cast(const Tensor& x, DType dtype) {
  detail::check_defined(x, "cast", "x");
  if (x.dtype() == dtype) return x;
  return call_op(ops::cast_op(), {x}, CastArgs{dtype});
}

}  // namespace athanor
