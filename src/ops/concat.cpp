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

}  // namespace

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
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
  if (!any_requires_grad(xs)) return out;
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  for (const Tensor& x : xs) shapes.push_back(x.sizes()), dtypes.push_back(x.dtype());
  return record("cat", xs, out, [d, offsets, shapes, dtypes](const Node& n, const Grads& g) {
    // d out / d x_k is the identity on block k: grad_k = g restricted to block k.
    Grads gx(shapes.size());
    for (size_t k = 0; k < shapes.size(); ++k) {
      if (!needs_grad(n, k)) continue;
      gx[k] = empty(shapes[k], TensorOptions(dtypes[k]));
      copy_into(gx[k], block_view(g[0], d, offsets[k], shapes[k][d]));
    }
    return gx;
  });
}

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
