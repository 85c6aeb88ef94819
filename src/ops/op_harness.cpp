// The op harness's shared pieces (athanor/ops/op_harness.h): case inputs, their tensors
// at a dtype and layout, and perf mode.
#include "athanor/ops/op_harness.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "athanor/autograd/engine.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/core/rng.h"

namespace athanor {

const char* layout_name(CaseLayout l) {
  switch (l) {
    case CaseLayout::contiguous: return "contiguous";
    case CaseLayout::transposed: return "transposed";
    case CaseLayout::strided: return "strided";
    case CaseLayout::transposed12: return "dims 1, 2 transposed";
  }
  return "?";
}

CaseInput case_randn(const Shape& shape, uint64_t seed, CaseLayout layout) {
  Generator g(seed);
  return CaseInput{randn(shape, TensorOptions(DType::f64), g), layout, true};
}

CaseInput case_uniform(const Shape& shape, double lo, double hi, uint64_t seed, CaseLayout layout) {
  Generator g(seed);
  Tensor t = empty(shape, TensorOptions(DType::f64));
  uniform_(t, lo, hi, g);
  return CaseInput{t, layout, true};
}

CaseInput case_away_from(const Shape& shape, double lo, double hi, const std::vector<double>& kinks, double gap,
                         uint64_t seed, CaseLayout layout) {
  CaseInput in = case_uniform(shape, lo, hi, seed, layout);
  std::vector<double> v = in.value.to_vector();
  for (double& e : v)
    for (double k : kinks)
      if (std::fabs(e - k) < gap) e = e < k ? k - 2 * gap : k + 2 * gap;
  in.value = from_vector(v, shape, TensorOptions(DType::f64));
  return in;
}

OpCase make_case(std::string label, std::vector<CaseInput> inputs, ApiCall call) {
  return make_case<NoArgs>(std::move(label), std::move(inputs), NoArgs{},
                           [call = std::move(call)](const std::vector<Tensor>& t, const NoArgs&) { return call(t); });
}

CaseInput case_fixed(Tensor value, CaseLayout layout) { return CaseInput{std::move(value), layout, false}; }
CaseInput case_none() { return CaseInput{Tensor(), CaseLayout::contiguous, false}; }

Tensor with_layout(const Tensor& t, CaseLayout layout) {
  Tensor v;
  if (layout == CaseLayout::transposed && t.dim() >= 2) {
    const Shape rev(t.sizes().rbegin(), t.sizes().rend());
    const Tensor base = empty(rev, TensorOptions(t.dtype()));
    Shape st(t.dim());
    for (int64_t i = 0; i < t.dim(); ++i) st[i] = base.strides()[t.dim() - 1 - i];
    v = make_view(base, t.sizes(), st, 0);
  } else if (layout == CaseLayout::transposed12 && t.dim() >= 3) {
    Shape sw = t.sizes();
    std::swap(sw[1], sw[2]);
    const Tensor base = empty(sw, TensorOptions(t.dtype()));
    Shape st = base.strides();
    std::swap(st[1], st[2]);
    v = make_view(base, t.sizes(), st, 0);
  } else if (layout == CaseLayout::strided && t.dim() >= 1) {
    Shape st = contiguous_strides(t.sizes());
    for (int64_t& s : st) s *= 2;
    const Tensor base = empty({std::max<int64_t>(2 * t.numel(), 1)}, TensorOptions(t.dtype()));
    v = make_view(base, t.sizes(), st, 0);
  } else {
    v = empty(t.sizes(), TensorOptions(t.dtype()));
  }
  copy_into(v, t);
  return v;
}

std::vector<Tensor> case_tensors(const OpCase& c, DType dtype, bool requires_grad) {
  std::vector<Tensor> out;
  out.reserve(c.inputs.size());
  for (const CaseInput& in : c.inputs) {
    if (!in.value.defined()) {
      out.emplace_back();
      continue;
    }
    const bool floating = is_floating(in.value.dtype());
    Tensor t = with_layout(floating ? in.value.detach().to(dtype) : in.value.detach(), in.layout);
    if (floating && in.grad && requires_grad) t.requires_grad_(true);
    out.push_back(t);
  }
  return out;
}

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

OpTiming time_case(const OpCase& c, DType dtype, int reps) {
  OpTiming r;
  r.reps = std::max(reps, 1);
  const std::vector<Tensor> in = case_tensors(c, dtype, true);
  bool any_grad = false;
  for (const Tensor& t : in) any_grad = any_grad || (t.defined() && t.requires_grad());
  std::vector<double> fwd, bwd;
  for (int i = 0; i <= r.reps; ++i) {  // run 0 warms up
    const double t0 = now_us();
    std::vector<Tensor> out = c.call(in);
    const double t1 = now_us();
    if (i > 0) fwd.push_back(t1 - t0);
    if (!any_grad) continue;
    std::vector<Tensor> roots, grads;
    for (const Tensor& o : out)
      if (o.defined() && o.requires_grad()) roots.push_back(o), grads.push_back(ones(o.sizes(), TensorOptions(o.dtype())));
    if (roots.empty()) continue;
    for (const Tensor& t : in)
      if (t.defined() && t.requires_grad()) t.set_grad(Tensor());
    const double t2 = now_us();
    backward(roots, grads);
    const double t3 = now_us();
    if (i > 0) bwd.push_back(t3 - t2);
  }
  r.forward_us = median(fwd);
  if (!bwd.empty()) r.backward_us = median(bwd);
  return r;
}

}  // namespace athanor
