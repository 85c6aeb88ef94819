// cat and stack.
//
// cat: the output, viewed as [outer, total * inner] bytes, receives input k
// (viewed as [outer, size_k * inner]) at column offset_k * inner: a parallel
// row copy (cpu::copy_rows) for contiguous inputs of the output's dtype;
// others (strided, or needing a dtype conversion to the promoted dtype) go
// through copy_into into the output's region.
// Backward: out is the identity on each input's block, so d out / d x_k picks
// block k: grad_k = g[..., offset_k : offset_k + size_k, ...] (in x_k's dtype).
// stack(xs, d) = cat(unsqueeze(x_k, d), d), so its backward is cat's.
#include "athanor/ops/shape.h"
#include "backend/cpu/index.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {

std::string shape_list(const std::vector<Tensor>& xs) {
  std::string s;
  for (size_t i = 0; i < xs.size() && i < 8; ++i) s += (i ? ", " : "") + shape_str(xs[i].sizes());
  if (xs.size() > 8) s += ", …";
  return s;
}

// The region [offset, offset + len) of `t` along dim d (a view; no autograd).
Tensor block_view(const Tensor& t, int64_t d, int64_t offset, int64_t len) {
  Shape sz = t.sizes();
  sz[d] = len;
  return make_view(t, sz, t.strides(), t.storage_offset() + (len > 0 ? offset * t.strides()[d] : 0));
}

using detail::Grads;
using detail::Inputs;

struct CatArgs {
  int64_t dim = 0;
};
struct CatSaved : OpSaved {
  int64_t d = 0;
  std::vector<int64_t> offsets;
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
};

std::vector<Tensor> cat_cpu(OpCall& c) {
  const std::vector<Tensor>& xs = c.inputs();
  const int64_t dim = c.args<CatArgs>().dim;
  ATH_CHECK(!xs.empty(), "cat", "expected a non-empty list of tensors", Hint{"pass at least one tensor"});
  for (size_t k = 0; k < xs.size(); ++k)
    ATH_CHECK(xs[k].defined(), "cat", "tensor ", k, " of the list is undefined");
  const Tensor& x0 = xs[0];
  ATH_CHECK(x0.dim() > 0, "cat", "cannot concatenate 0-d tensors (", x0.describe(), ")",
            Hint{"use stack() to join scalars into a 1-D tensor"});
  const int64_t d = detail::wrap_dim(dim, x0.dim(), "cat");
  DType dt = x0.dtype();
  int64_t total = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    const Tensor& x = xs[k];
    ATH_CHECK(x.dim() == x0.dim(), "cat", "tensor ", k, " has ", x.dim(), " dims but tensor 0 has ", x0.dim(),
              " (shapes ", shape_list(xs), ")", Hint{"all tensors must have the same number of dimensions; reshape/unsqueeze first"});
    for (int64_t i = 0; i < x0.dim(); ++i)
      ATH_CHECK(i == d || x.sizes()[i] == x0.sizes()[i], "cat", "sizes must match except in dimension ", d,
                ", but tensor 0 is ", shape_str(x0.sizes()), " and tensor ", k, " is ", shape_str(x.sizes()),
                " (they differ in dimension ", i, ")",
                Hint{"only the concatenation dimension may differ; check the dim argument or the shapes of the inputs"});
    dt = promote_types(dt, x.dtype());
    total += x.sizes()[d];
  }
  Shape out_shape = x0.sizes();
  out_shape[d] = total;
  Tensor out = empty(out_shape, TensorOptions(dt));
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= out_shape[i];
  for (int64_t i = d + 1; i < x0.dim(); ++i) inner *= out_shape[i];
  const int64_t esz = static_cast<int64_t>(dtype_size(dt));
  std::vector<int64_t> offsets;
  int64_t at = 0;
  for (const Tensor& x : xs) {
    offsets.push_back(at);
    const int64_t len = x.sizes()[d];
    if (len > 0 && out.numel() > 0) {
      if (x.is_contiguous() && x.dtype() == dt) {
        char* dst = static_cast<char*>(out.raw_data()) + at * inner * esz;
        cpu::copy_rows(dst, total * inner * esz, x.raw_data(), len * inner * esz, outer, len * inner * esz);
      } else {
        copy_into(block_view(out, d, at, len), x);
      }
    }
    at += len;
  }
  if (c.records()) {
    CatSaved& s = c.save<CatSaved>();
    s.d = d, s.offsets = std::move(offsets);
    for (const Tensor& x : xs) s.shapes.push_back(x.sizes()), s.dtypes.push_back(x.dtype());
  }
  return {out};
}

Grads cat_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  // d out / d x_k is the identity on block k: grad_k = g restricted to block k.
  const CatSaved& s = saved.as<CatSaved>();
  Grads gx(s.shapes.size());
  for (size_t k = 0; k < s.shapes.size(); ++k) {
    if (!needs_grad(n, k)) continue;
    gx[k] = empty(s.shapes[k], TensorOptions(s.dtypes[k]));
    copy_into(gx[k], block_view(g[0], s.d, s.offsets[k], s.shapes[k][s.d]));
  }
  return gx;
}

std::vector<Tensor> cat_reference(OpCall& c) {  // element by element: which input, and where in it
  const std::vector<Tensor>& xs = c.inputs();
  const int64_t d = c.args<CatArgs>().dim < 0 ? c.args<CatArgs>().dim + xs[0].dim() : c.args<CatArgs>().dim;
  Shape out = xs[0].sizes();
  out[d] = 0;
  for (const Tensor& x : xs) out[d] += x.sizes()[d];
  std::vector<std::vector<double>> vals;
  for (const Tensor& x : xs) vals.push_back(x.to_vector());
  std::vector<double> o;
  o.reserve(static_cast<size_t>(shape_numel(out)));
  Shape oc(out.size(), 0);
  for (int64_t k = 0; k < shape_numel(out); ++k) {
    int64_t at = oc[d];
    size_t which = 0;
    while (at >= xs[which].sizes()[d]) at -= xs[which].sizes()[d], ++which;
    Shape ic = oc;
    ic[d] = at;
    int64_t flat = 0;
    for (size_t i = 0; i < ic.size(); ++i) flat = flat * xs[which].sizes()[i] + ic[i];
    o.push_back(vals[which][static_cast<size_t>(flat)]);
    for (int64_t i = static_cast<int64_t>(oc.size()) - 1; i >= 0; --i) {
      if (++oc[i] < out[i]) break;
      oc[i] = 0;
    }
  }
  return {from_vector(o, out, TensorOptions(DType::f64))};
}

std::vector<OpCase> cat_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const CatArgs& a) { return Inputs{cat(t, a.dim)}; };
  return {
      make_case<CatArgs>("[2, 3] + [4, 3] transposed, dim 0", {case_randn({2 * s, 3}, 1), case_randn({4, 3}, 2, CaseLayout::transposed)},
                         {0}, call),
      make_case<CatArgs>("[3, 1, 2] + [3, 4, 2] strided + [3, 2, 2], dim 1",
                         {case_randn({3 * s, 1, 2}, 3), case_randn({3 * s, 4, 2}, 4, CaseLayout::strided), case_randn({3 * s, 2, 2}, 5)},
                         {1}, call),
      make_case<CatArgs>("[5] + [0] + [2], dim -1", {case_randn({5 * s}, 6), case_randn({0}, 7), case_randn({2}, 8)}, {-1}, call),
  };
}
}  // namespace

namespace ops {
const OpDef& cat_op() {
  static const OpDef d{.name = "cat", .inputs = {"tensors"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(cat_cpu, cat_backward), .reference = cat_reference,
                       .dtypes = detail::kFloatDTypes, .cases = cat_cases,
                       .derivative = "each input gets its block of g", .file = "src/ops/concat.cpp"};
  return d;
}
}  // namespace ops

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) { return call_op(ops::cat_op(), xs, CatArgs{dim}); }



Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  ATH_CHECK(!xs.empty(), "stack", "expected a non-empty list of tensors", Hint{"pass at least one tensor"});
  for (size_t k = 0; k < xs.size(); ++k) {
    ATH_CHECK(xs[k].defined(), "stack", "tensor ", k, " of the list is undefined");
    ATH_CHECK(xs[k].sizes() == xs[0].sizes(), "stack", "all tensors must have the same shape, but tensor 0 is ",
              shape_str(xs[0].sizes()), " and tensor ", k, " is ", shape_str(xs[k].sizes()),
              Hint{"stack adds a new dimension and needs equal shapes; use cat() to join along an existing one"});
  }
  const int64_t d = detail::wrap_dim(dim, xs[0].dim() + 1, "stack");
  std::vector<Tensor> us;
  us.reserve(xs.size());
  for (const Tensor& x : xs) us.push_back(unsqueeze(x, d));
  return cat(us, d);
}

}  // namespace athanor
