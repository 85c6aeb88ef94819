// cross_entropy: fused log-softmax + negative log-likelihood with ignore_index and
// label smoothing (PyTorch semantics), for logits [N, C] (or [C] with a 0-d target).
//
// Forward keeps only the logits and two numbers per row (max, log-sum-exp of the
// shifted row); no probability matrix outlives the call.
//   loss_n = (1 - eps) * nll_n + eps * mean_c(-log p_nc)
// Reductions: none -> [N] (0 for ignored rows); sum; mean = sum / (number of
// non-ignored targets). When every target is ignored the mean is 0/0 = NaN, as in
// PyTorch (its gradient is then all zeros).
// Backward, row by row:  dlogits = (softmax - ((1 - eps) onehot(t) + eps / C)) * g_n
// with g_n = g / count (mean), g (sum) or g[n] (none); ignored rows get 0.
#include <cmath>
#include <limits>
#include <memory>

#include "athanor/ops/loss.h"
#include "backend/cpu/cross_entropy.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
using detail::Grads;
using detail::Inputs;

using detail::CrossEntropyArgs;  // ops/op_args.h: shared with the CUDA kernel (src/ops/cuda/)
struct CrossEntropySaved : OpSaved {
  SavedTensor logits, stats;
  std::shared_ptr<std::vector<int64_t>> targets;  // a private copy: in-place edits after forward cannot change backward
  int64_t N = 0, C = 0, count = 0, ignore_index = -100;
  double label_smoothing = 0;
  Reduction reduction = Reduction::mean;
};

std::vector<Tensor> cross_entropy_cpu(OpCall& c) {
  const char* op = "cross_entropy";
  const Tensor &logits = c.in(0), &target = c.in(1);
  const auto [ignore_index, label_smoothing, reduction] = c.args<CrossEntropyArgs>();
  // Under autocast, bf16/f16 logits reach the kernel as they are (OpDef::reads_lowp): it widens
  // each row in registers and computes in f32 (the f32 category), so the full f32 copy of the
  // [N, vocab] logits is never made. The loss is f32 and dlogits is written in the logits'
  // dtype (what the cast's backward would have produced from f32 dlogits).
  const bool read_lowp_directly = c.autocast() && logits.defined() && (logits.dtype() == DType::bf16 || logits.dtype() == DType::f16);
  const auto [N, C] = detail::check_cross_entropy_args(logits, target, label_smoothing, op);
  const Shape want = logits.dim() == 2 ? Shape{N} : Shape{};  // the target's (and an unreduced loss's) shape

  // Validate and keep a private copy of the targets (in-place edits after forward cannot change backward).
  const Tensor tc = detail::to_raw(target, DType::i64);
  auto tv = std::make_shared<std::vector<int64_t>>(tc.data_ptr<int64_t>(), tc.data_ptr<int64_t>() + N);
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = (*tv)[n];
    if (t == ignore_index) continue;
    ATH_CHECK(t >= 0 && t < C, op, "target value ", t, " at position ", n, " is out of range for C = ", C,
              " classes (logits ", logits.describe(), "; valid targets are 0 to ", C - 1, ", or ignore_index = ",
              ignore_index, ")", Hint{"check the label preprocessing and that the model's output size matches the number of classes"});
    ++count;
  }

  const Tensor lc = detail::contiguous_raw(logits);
  const DType sdt = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor stats = empty({N, 2}, TensorOptions(sdt));
  std::vector<double> loss(N, 0.0);
  if (C > 0) {
    dispatch(logits.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        using S = cpu::loss_stat_t<T>;
        cpu::cross_entropy_forward<T>(static_cast<const T*>(lc.raw_data()), tv->data(), static_cast<S*>(stats.raw_data()),
                                      loss.data(), N, C, ignore_index, label_smoothing);
      }
    });
  }
  const DType out_dtype = read_lowp_directly ? DType::f32 : logits.dtype();
  Tensor out;
  if (reduction == Reduction::none) {
    out = from_vector(loss, want, TensorOptions(out_dtype));
  } else {
    double total = 0;
    for (double l : loss) total += l;
    if (reduction == Reduction::mean) total = count > 0 ? total / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN();
    out = scalar_tensor(total, TensorOptions(out_dtype));
  }
  if (c.records()) {
    CrossEntropySaved& s = c.save<CrossEntropySaved>();
    s.logits = save(logits, "logits"), s.stats = save(stats, "row_stats"), s.targets = std::move(tv);
    s.N = N, s.C = C, s.count = count, s.ignore_index = ignore_index, s.label_smoothing = label_smoothing;
    s.reduction = reduction;
  }
  return {out};
}

Grads cross_entropy_backward(const Node& nd, const Grads& g, const OpSaved& saved) {
  const CrossEntropySaved& s = saved.as<CrossEntropySaved>();
  const Tensor xv = detail::contiguous_raw(s.logits.unpack(nd)), sv = s.stats.unpack(nd);
  const std::vector<double> gv = g[0].to_vector();
  const int64_t stride = s.reduction == Reduction::none ? 1 : 0;
  const double scale = s.reduction == Reduction::mean ? 1.0 / static_cast<double>(s.count) : 1.0;
  Tensor dx = empty(xv.sizes(), TensorOptions(xv.dtype()));
  if (s.C > 0) {
    dispatch(xv.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        using S = cpu::loss_stat_t<T>;
        cpu::cross_entropy_backward<T>(static_cast<const T*>(xv.raw_data()), s.targets->data(),
                                       static_cast<const S*>(sv.raw_data()), gv.data(), stride, scale,
                                       static_cast<T*>(dx.raw_data()), s.N, s.C, s.ignore_index, s.label_smoothing);
      }
    });
  }
  return {dx, Tensor()};  // targets are class ids: no gradient
}

std::vector<Tensor> cross_entropy_reference(OpCall& c) {
  const CrossEntropyArgs& a = c.args<CrossEntropyArgs>();
  const Tensor x = detail::ref64(c.in(0)).contiguous();
  const int64_t N = x.dim() == 2 ? x.size(0) : 1, C = x.size(-1);
  std::vector<int64_t> t;
  for (double v : c.in(1).to_vector()) t.push_back(static_cast<int64_t>(v));
  std::vector<double> stats(static_cast<size_t>(2 * N)), loss(static_cast<size_t>(N), 0.0);
  cpu::ref::cross_entropy_forward<double>(x.data_ptr<double>(), t.data(), stats.data(), loss.data(), N, C, a.ignore_index,
                                          a.label_smoothing);
  if (a.reduction == Reduction::none) return {from_vector(loss, x.dim() == 2 ? Shape{N} : Shape{}, TensorOptions(DType::f64))};
  double total = 0;
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n)
    if (t[static_cast<size_t>(n)] != a.ignore_index) total += loss[static_cast<size_t>(n)], ++count;
  if (a.reduction == Reduction::mean) total /= static_cast<double>(count);
  return {scalar_tensor(total, TensorOptions(DType::f64))};
}

std::vector<OpCase> cross_entropy_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const CrossEntropyArgs& a) {
    return Inputs{cross_entropy(t[0], t[1], a.ignore_index, a.label_smoothing, a.reduction)};
  };
  auto ids = [](std::vector<int64_t> v, int64_t repeat) {
    std::vector<int64_t> r;
    for (int64_t k = 0; k < repeat; ++k) r.insert(r.end(), v.begin(), v.end());
    return from_vector(r, {static_cast<int64_t>(r.size())});
  };
  return {
      make_case<CrossEntropyArgs>("logits [4, 5], mean", {case_randn({4 * s, 5}, 1), case_fixed(ids({0, 4, 2, 2}, s))}, {}, call),
      make_case<CrossEntropyArgs>("logits [3, 6] transposed, ignore_index 1, smoothing 0.1, sum",
                                  {case_randn({3 * s, 6}, 2, CaseLayout::transposed), case_fixed(ids({5, 1, 0}, s).to(DType::i32))},
                                  {1, 0.1, Reduction::sum}, call),
      make_case<CrossEntropyArgs>("logits [5, 3] strided, none", {case_randn({5 * s, 3}, 3, CaseLayout::strided), case_fixed(ids({2, 0, 1, 1, 0}, s))},
                                  {-100, 0.0, Reduction::none}, call),
      make_case<CrossEntropyArgs>("logits [7] (one row), target [] (0-d)",
                                  {case_randn({7}, 4), case_fixed(scalar_tensor(3, TensorOptions(DType::i64)))}, {}, call),
  };
}
}  // namespace

namespace ops {
const OpDef& cross_entropy_op() {
  static const OpDef d{.name = "cross_entropy", .inputs = {"logits", "target"}, .category = AutocastCategory::f32,
                       .reads_lowp = 1u, .kernels = detail::cpu_kernels(cross_entropy_cpu, cross_entropy_backward),
                       .reference = cross_entropy_reference, .dtypes = detail::kFloatDTypes, .cases = cross_entropy_cases,
                       .derivative = "(softmax - smoothed onehot) g / count", .file = "src/ops/cross_entropy.cpp"};
  return d;
}
}  // namespace ops

Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                     Reduction reduction) {
  return call_op(ops::cross_entropy_op(), {logits, target}, CrossEntropyArgs{ignore_index, label_smoothing, reduction});
}

}  // namespace athanor
