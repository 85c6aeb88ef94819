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
#include "athanor/ops/autocast.h"
#include "backend/cpu/cross_entropy.h"
#include "ops/op_utils.h"

namespace athanor {

Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                     Reduction reduction) {
  const char* op = "cross_entropy";
  // Under autocast, bf16/f16 logits are read directly: the kernel widens each row in
  // registers and computes in f32 (the f32 category), so the full f32 copy of the
  // [N, vocab] logits is never made. The loss is f32 and dlogits is written in the
  // logits' dtype (what the cast's backward would have produced from f32 dlogits).
  const bool lowp_logits = logits.defined() && (logits.dtype() == DType::bf16 || logits.dtype() == DType::f16);
  const bool read_lowp_directly = autocast_enabled() && lowp_logits;
  if (!read_lowp_directly && autocast_needs_cast(op, {logits}))
    return cross_entropy(autocast_input(logits, op), target, ignore_index, label_smoothing, reduction);
  detail::check_floating(logits, op, "logits");
  detail::check_defined(target, op, "target");
  ATH_CHECK(logits.dim() == 1 || logits.dim() == 2, op, "logits must be [N, C] or [C], got ", logits.describe(),
            Hint{"flatten extra dims first, e.g. logits.reshape({-1, C}) with target.reshape({-1})"});
  ATH_CHECK(target.dtype() == DType::i64 || target.dtype() == DType::i32, op,
            "target must hold integer class ids (i64 or i32), got ", target.describe(),
            Hint{"class-probability targets are not supported; pass class indices, converted with .to(DType::i64)"});
  const bool batched = logits.dim() == 2;
  const int64_t N = batched ? logits.size(0) : 1, C = logits.size(-1);
  const Shape want = batched ? Shape{N} : Shape{};
  ATH_CHECK(target.sizes() == want, op, "target shape ", shape_str(target.sizes()), " does not match logits ",
            logits.describe(), ": expected target ", shape_str(want),
            Hint{"target needs one class id per row of logits (shape [N] for logits [N, C], [] for logits [C])"});
  ATH_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op, "label_smoothing must be in [0, 1], got ",
            label_smoothing);

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
  if (!any_requires_grad({logits})) return out;

  SavedTensor sl = save(logits, "logits"), ss = save(stats, "row_stats");
  return record(op, {logits}, out, [=](const Node& nd, const Grads& g) {
    const Tensor xv = detail::contiguous_raw(sl.unpack(nd)), sv = ss.unpack(nd);
    const std::vector<double> gv = g[0].to_vector();
    const int64_t stride = reduction == Reduction::none ? 1 : 0;
    const double scale = reduction == Reduction::mean ? 1.0 / static_cast<double>(count) : 1.0;
    Tensor dx = empty(xv.sizes(), TensorOptions(xv.dtype()));
    if (C > 0) {
      dispatch(xv.dtype(), [&]<class T>() {
        if constexpr (is_float_type_v<T>) {
          using S = cpu::loss_stat_t<T>;
          cpu::cross_entropy_backward<T>(static_cast<const T*>(xv.raw_data()), tv->data(),
                                         static_cast<const S*>(sv.raw_data()), gv.data(), stride, scale,
                                         static_cast<T*>(dx.raw_data()), N, C, ignore_index, label_smoothing);
        }
      });
    }
    return Grads{dx};
  });
}

}  // namespace athanor
