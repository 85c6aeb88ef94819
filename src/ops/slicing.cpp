// slice, narrow, split: views of a range along one dim (they share storage).
//
// A range view of x along dim d is (start, length, step) -> sizes[d] = length,
// strides[d] *= step, offset += start * strides[d]: no kernel, no copy.
// Backward: each output element is x at one position, so d out_k / d x_j = 1
// when j is the k-th selected position, else 0 — the gradient is written into
// that region of a zero tensor of the input's shape (split: one node for all
// pieces; a piece whose gradient is undefined contributes zeros).
#include <algorithm>

#include "athanor/ops/shape.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {

struct Range {
  int64_t start = 0, length = 0, step = 1;
};

// The view of `base` (any strides) restricted to range `r` along dim d.
Tensor range_view(const Tensor& base, int64_t d, const Range& r) {
  Shape sz = base.sizes(), st = base.strides();
  const int64_t off = r.length > 0 ? base.storage_offset() + r.start * st[d] : base.storage_offset();
  sz[d] = r.length;
  st[d] *= r.step;
  return make_view(base, sz, st, off);
}

// Gradient of a set of range views of an input of shape `in`: zeros, with each
// defined g[i] copied into its region.
Tensor ranges_backward(const Shape& in, DType dt, int64_t d, const std::vector<Range>& ranges, const Grads& g) {
  Tensor gx = zeros(in, TensorOptions(dt));
  for (size_t i = 0; i < ranges.size() && i < g.size(); ++i)
    if (g[i].defined() && ranges[i].length > 0) copy_into(range_view(gx, d, ranges[i]), g[i]);
  return gx;
}

Tensor record_range(const char* op, const Tensor& x, int64_t d, const Range& r) {
  Tensor out = range_view(x, d, r);
  const Shape in = x.sizes();
  const DType dt = x.dtype();
  return record(op, {x}, out, [in, dt, d, r](const Node&, const Grads& g) {
    // d out_k / d x_{start + k*step} = 1: g lands on the selected positions, zeros elsewhere.
    return Grads{ranges_backward(in, dt, d, {r}, g)};
  });
}

int64_t checked_dim(const Tensor& x, int64_t dim, const char* op) {
  detail::check_defined(x, op, "x");
  ATH_CHECK(x.dim() > 0, op, "cannot index a 0-d tensor ", x.describe(), Hint{"unsqueeze or reshape it to 1-D first"});
  return detail::wrap_dim(dim, x.dim(), op);
}

std::vector<Tensor> split_impl(const Tensor& x, const std::vector<int64_t>& sizes, int64_t d) {
  std::vector<Range> ranges;
  std::vector<Tensor> outs;
  int64_t at = 0;
  for (int64_t s : sizes) {
    const Range r{at, s, 1};
    ranges.push_back(r);
    outs.push_back(range_view(x, d, r));
    at += s;
  }
  const Shape in = x.sizes();
  const DType dt = x.dtype();
  return record_multi("split", {x}, std::move(outs), [in, dt, d, ranges](const Node&, const Grads& g) {
    // Each piece is the identity on its own range: concatenate the pieces' gradients (zeros if unused).
    return Grads{ranges_backward(in, dt, d, ranges, g)};
  });
}

}  // namespace

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  const int64_t d = checked_dim(x, dim, "slice");
  ATH_CHECK(step >= 1, "slice", "step must be >= 1, got ", step, " (slicing dim ", d, " of ", x.describe(), ")",
            Hint{"use a positive step; to reverse a dimension, index it explicitly with index_select"});
  const int64_t n = x.sizes()[d];
  auto clamp = [n](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + n : v, 0, n); };  // Python-style bounds
  const int64_t b = clamp(start), e = clamp(end);
  const int64_t len = e > b ? (e - b + step - 1) / step : 0;
  return record_range("slice", x, d, Range{b, len, step});
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  const int64_t d = checked_dim(x, dim, "narrow");
  const int64_t n = x.sizes()[d];
  ATH_CHECK(start >= -n && start <= n, "narrow", "start ", start, " is out of range for dim ", d, " of size ", n, " in ",
            x.describe(), Hint{"start must be in [-size, size]"});
  const int64_t b = start < 0 ? start + n : start;
  ATH_CHECK(length >= 0 && b + length <= n, "narrow", "length ", length, " from start ", b, " does not fit dim ", d,
            " of size ", n, " in ", x.describe(), Hint{"need 0 <= length and start + length <= size; use slice() to clamp"});
  return record_range("narrow", x, d, Range{b, length, 1});
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  const int64_t d = checked_dim(x, dim, "split");
  ATH_CHECK(split_size >= 1, "split", "split_size must be >= 1, got ", split_size, " (splitting dim ", d, " of ",
            x.describe(), ")", Hint{"pass the size of each chunk (the last may be smaller), or a list of sizes"});
  const int64_t n = x.sizes()[d];
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < n; at += split_size) sizes.push_back(std::min(split_size, n - at));
  if (sizes.empty()) sizes.push_back(0);  // an empty dim splits into one empty piece
  return split_impl(x, sizes, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  const int64_t d = checked_dim(x, dim, "split");
  int64_t total = 0;
  std::string list = "[";
  for (size_t i = 0; i < sizes.size(); ++i) list += (i ? ", " : "") + std::to_string(sizes[i]);
  list += "]";
  for (int64_t s : sizes) {
    ATH_CHECK(s >= 0, "split", "split sizes ", list, " contain a negative size (splitting dim ", d, " of ", x.describe(),
              ")", Hint{"every size must be >= 0"});
    total += s;
  }
  ATH_CHECK(total == x.sizes()[d], "split", "split sizes ", list, " sum to ", total, " but dim ", d, " of ",
            x.describe(), " has size ", x.sizes()[d], Hint{"the sizes must add up to the size of the split dimension"});
  return split_impl(x, sizes, d);
}

}  // namespace athanor
