// Broadcasting and the view ops (view, reshape, flatten, permute, transpose,
// expand, squeeze, unsqueeze) plus contiguous/clone/cast. Views share storage;
// each backward maps the gradient back to the input's geometry.
#include <numeric>
#include <optional>

#include "athanor/ops/reduction.h"
#include "athanor/ops/shape.h"
#include "backend/cpu/unary.h"
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

// Records a view `out` of `x` whose gradient maps back with `back`.
Tensor record_view(const char* op, const Tensor& x, Tensor out, std::function<Tensor(const Tensor&)> back) {
  return record(op, {x}, out, [back = std::move(back)](const Node&, const Grads& g) { return Grads{back(g[0])}; });
}
}  // namespace

Tensor view(const Tensor& x, const Shape& shape) {
  detail::check_defined(x, "view", "x");
  const Shape sz = infer_size(shape, x.numel(), "view");
  auto st = view_strides(x.sizes(), x.strides(), sz);
  ATH_CHECK(st.has_value(), "view", "cannot view ", x.describe(), " with strides ", shape_str(x.strides()), " as ",
            shape_str(sz), Hint{"the tensor is not contiguous in the needed way; use reshape() (which copies) or contiguous() first"});
  const Shape in = x.sizes();
  return record_view("view", x, make_view(x, sz, *st, x.storage_offset()), [in](const Tensor& g) { return reshape(g, in); });
}

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

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
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
  return record_view("permute", x, make_view(x, sz, st, x.storage_offset()), [inv](const Tensor& g) { return permute(g, inv); });
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  detail::check_defined(x, "transpose", "x");
  if (x.dim() < 2 && d0 == d1) return permute(x, x.dim() == 1 ? std::vector<int64_t>{0} : std::vector<int64_t>{});
  std::vector<int64_t> p(x.dim());
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[wrap_dim(d0, x.dim(), "transpose")], p[wrap_dim(d1, x.dim(), "transpose")]);
  return permute(x, p);
}

Tensor expand(const Tensor& x, const Shape& shape) {
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
  const Shape in = x.sizes();
  return record_view("expand", x, make_view(x, sz, st, x.storage_offset()), [in](const Tensor& g) { return sum_to(g, in); });
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  const int64_t d = wrap_dim(dim, x.dim(), "squeeze");
  if (x.dim() == 0) return view(x, {});  // squeezing a scalar is the identity
  if (x.sizes()[d] != 1) return view(x, x.sizes());
  Shape sz = x.sizes();
  sz.erase(sz.begin() + d);
  return reshape(x, sz);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  const int64_t d = wrap_dim(dim, x.dim() + 1, "unsqueeze");
  Shape sz = x.sizes(), st = x.strides();
  const int64_t new_stride = d < x.dim() ? x.strides()[d] * x.sizes()[d] : 1;
  sz.insert(sz.begin() + d, 1);
  st.insert(st.begin() + d, new_stride);
  const Shape in = x.sizes();
  return record_view("unsqueeze", x, make_view(x, sz, st, x.storage_offset()), [in](const Tensor& g) { return reshape(g, in); });
}

Tensor contiguous(const Tensor& x) {
  detail::check_defined(x, "contiguous", "x");
  if (x.is_contiguous()) return x;
  return clone(x);
}

Tensor clone(const Tensor& x) {
  detail::check_defined(x, "clone", "x");
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()));
  copy_into(out, x);
  return record("clone", {x}, out, [](const Node&, const Grads& g) { return Grads{g[0]}; });
}

Tensor cast(const Tensor& x, DType dtype) {
  detail::check_defined(x, "cast", "x");
  if (x.dtype() == dtype) return x;
  Tensor out = empty(x.sizes(), TensorOptions(dtype));
  if (!x.is_contiguous() || !cpu::convert(x.dtype(), dtype, x.raw_data(), out.raw_data(), x.numel())) copy_into(out, x);
  if (!is_floating(dtype)) return out;  // no gradient through integer casts
  const DType in = x.dtype();
  return record("cast", {x}, out, [in](const Node&, const Grads& g) { return Grads{cast(g[0], in)}; });
}

}  // namespace athanor
