// slice, narrow, split: views of a range along one dim (they share storage).
//
// A range view of x along dim d is (start, length, step) -> sizes[d] = length,
// strides[d] *= step, offset += start * strides[d]: no kernel, no copy.
// Backward: each output element is x at one position, so d out_k / d x_j = 1
// when j is the k-th selected position, else 0 — the gradient is written into
// that region of a zero tensor of the input's shape (split: one node for all
// pieces; a piece whose gradient is undefined contributes zeros). slice and split are
// registered ops; narrow is slice with a checked length.
#include <algorithm>

#include "athanor/ops/shape.h"
#include "ops/op_def.h"
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
  Device dev = Device::cpu();  // the gradient's device (any defined piece's)
  for (const Tensor& t : g)
    if (t.defined()) dev = t.device();
  Tensor gx = zeros(in, TensorOptions(dt).with_device(dev));
  for (size_t i = 0; i < ranges.size() && i < g.size(); ++i)
    if (g[i].defined() && ranges[i].length > 0) copy_into(range_view(gx, d, ranges[i]), g[i]);
  return gx;
}

int64_t checked_dim(const Tensor& x, int64_t dim, const char* op) {
  detail::check_defined(x, op, "x");
  ATH_CHECK(x.dim() > 0, op, "cannot index a 0-d tensor ", x.describe(), Hint{"unsqueeze or reshape it to 1-D first"});
  return detail::wrap_dim(dim, x.dim(), op);
}

using detail::Grads;
using detail::Inputs;

struct SliceArgs {
  int64_t dim = 0, start = 0, end = 0, step = 1;
};
struct SplitArgs {
  std::vector<int64_t> sizes;
  int64_t dim = 0;
};
struct RangesSaved : OpSaved {
  Shape in;
  DType dtype = DType::f32;
  int64_t d = 0;
  std::vector<Range> ranges;
};

// The range of a slice call (Python-style bounds clamped to the dim).
Range slice_range(const Tensor& x, int64_t d, const SliceArgs& a) {
  ATH_CHECK(a.step >= 1, "slice", "step must be >= 1, got ", a.step, " (slicing dim ", d, " of ", x.describe(), ")",
            Hint{"use a positive step; to reverse a dimension, index it explicitly with index_select"});
  const int64_t n = x.sizes()[d];
  auto clamp = [n](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + n : v, 0, n); };
  const int64_t b = clamp(a.start), e = clamp(a.end);
  return Range{b, e > b ? (e - b + a.step - 1) / a.step : 0, a.step};
}

std::vector<Tensor> slice_cpu(OpCall& c) {
  const Tensor& x = c.in(0);
  const int64_t d = checked_dim(x, c.args<SliceArgs>().dim, "slice");
  const Range r = slice_range(x, d, c.args<SliceArgs>());
  if (c.records()) {
    RangesSaved& s = c.save<RangesSaved>();
    s.in = x.sizes(), s.dtype = x.dtype(), s.d = d, s.ranges = {r};
  }
  return {range_view(x, d, r)};
}
// d out_k / d x_{start + k*step} = 1: each piece's g lands on its positions, zeros elsewhere.
Grads ranges_backward_fn(const Node&, const Grads& g, const OpSaved& saved) {
  const RangesSaved& s = saved.as<RangesSaved>();
  return {ranges_backward(s.in, s.dtype, s.d, s.ranges, g)};
}
std::vector<Tensor> slice_reference(OpCall& c) {
  const int64_t d = checked_dim(c.in(0), c.args<SliceArgs>().dim, "slice");
  const Range r = slice_range(c.in(0), d, c.args<SliceArgs>());
  Shape out = c.in(0).sizes();
  out[d] = r.length;
  return {detail::ref_gather(c.in(0), out, [&](const Shape& oc) {
    Shape ic = oc;
    ic[d] = r.start + oc[d] * r.step;
    return ic;
  })};
}

std::vector<Tensor> split_cpu(OpCall& c) {
  const Tensor& x = c.in(0);
  const SplitArgs& a = c.args<SplitArgs>();
  const int64_t d = checked_dim(x, a.dim, "split");
  std::vector<Range> ranges;
  std::vector<Tensor> outs;
  int64_t at = 0;
  for (int64_t s : a.sizes) {
    const Range r{at, s, 1};
    ranges.push_back(r);
    outs.push_back(range_view(x, d, r));
    at += s;
  }
  if (c.records()) {
    RangesSaved& s = c.save<RangesSaved>();
    s.in = x.sizes(), s.dtype = x.dtype(), s.d = d, s.ranges = std::move(ranges);
  }
  return outs;
}
std::vector<Tensor> split_reference(OpCall& c) {
  const SplitArgs& a = c.args<SplitArgs>();
  const int64_t d = checked_dim(c.in(0), a.dim, "split");
  std::vector<Tensor> outs;
  int64_t at = 0;
  for (int64_t len : a.sizes) {
    Shape out = c.in(0).sizes();
    out[d] = len;
    outs.push_back(detail::ref_gather(c.in(0), out, [&](const Shape& oc) {
      Shape ic = oc;
      ic[d] = at + oc[d];
      return ic;
    }));
    at += len;
  }
  return outs;
}

std::vector<OpCase> slice_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const SliceArgs& a) { return Inputs{slice(t[0], a.dim, a.start, a.end, a.step)}; };
  return {
      make_case<SliceArgs>("x [5, 4], dim 0 [1, 4)", {case_randn({5 * s, 4}, 1)}, {0, 1, 4, 1}, call),
      make_case<SliceArgs>("x [3, 7] transposed, dim 1 [-6, 7) step 2", {case_randn({3 * s, 7}, 2, CaseLayout::transposed)},
                           {1, -6, 7, 2}, call),
      make_case<SliceArgs>("x [2, 6, 3] strided, dim -2 [2, 100) step 3", {case_randn({2 * s, 6, 3}, 3, CaseLayout::strided)},
                           {-2, 2, 100, 3}, call),
  };
}
std::vector<OpCase> split_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const SplitArgs& a) { return split(t[0], a.sizes, a.dim); };
  return {
      make_case<SplitArgs>("x [7, 3], dim 0 into {3, 3, 1}", {case_randn({7, 3 * s}, 1)}, {{3, 3, 1}, 0}, call),
      make_case<SplitArgs>("x [4, 5] transposed, dim 1 into {2, 0, 3}", {case_randn({4 * s, 5}, 2, CaseLayout::transposed)},
                           {{2, 0, 3}, 1}, call),
      make_case<SplitArgs>("x [2, 6] strided, dim -1 into {1, 5}", {case_randn({2 * s, 6}, 3, CaseLayout::strided)}, {{1, 5}, -1},
                           call),
  };
}
}  // namespace

namespace ops {
const OpDef& slice_op() {
  static const OpDef d{.name = "slice", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(slice_cpu, ranges_backward_fn), .reference = slice_reference,
                       .dtypes = detail::kFloatDTypes, .cases = slice_cases,
                       .derivative = "g into the sliced region of zeros", .file = "src/ops/slicing.cpp"};
  return d;
}
const OpDef& split_op() {
  static const OpDef d{.name = "split", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(split_cpu, ranges_backward_fn), .reference = split_reference,
                       .dtypes = detail::kFloatDTypes, .cases = split_cases,
                       .derivative = "each piece's g to its range (zeros for a piece without one)", .file = "src/ops/slicing.cpp"};
  return d;
}
}  // namespace ops

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return call_op(ops::slice_op(), {x}, SliceArgs{dim, start, end, step});
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  const int64_t d = checked_dim(x, dim, "narrow");
  const int64_t n = x.sizes()[d];
  ATH_CHECK(start >= -n && start <= n, "narrow", "start ", start, " is out of range for dim ", d, " of size ", n, " in ",
            x.describe(), Hint{"start must be in [-size, size]"});
  const int64_t b = start < 0 ? start + n : start;
  ATH_CHECK(length >= 0 && b + length <= n, "narrow", "length ", length, " from start ", b, " does not fit dim ", d,
            " of size ", n, " in ", x.describe(), Hint{"need 0 <= length and start + length <= size; use slice() to clamp"});
  return slice(x, d, b, b + length, 1);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  const int64_t d = checked_dim(x, dim, "split");
  ATH_CHECK(split_size >= 1, "split", "split_size must be >= 1, got ", split_size, " (splitting dim ", d, " of ",
            x.describe(), ")", Hint{"pass the size of each chunk (the last may be smaller), or a list of sizes"});
  const int64_t n = x.sizes()[d];
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < n; at += split_size) sizes.push_back(std::min(split_size, n - at));
  if (sizes.empty()) sizes.push_back(0);  // an empty dim splits into one empty piece
  return call_op_multi(ops::split_op(), {x}, SplitArgs{sizes, d});
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
  return call_op_multi(ops::split_op(), {x}, SplitArgs{sizes, d});
}

}  // namespace athanor
