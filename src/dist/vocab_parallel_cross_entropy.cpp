// Cross-entropy over a vocabulary split across the tp group: three all-reduces of one value
// per row forward, no communication backward (contract in
// include/athanor/dist/vocab_parallel_cross_entropy.h).
#include "athanor/dist/vocab_parallel_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "athanor/autograd/function.h"
#include "athanor/core/convert.h"
#include "athanor/core/error.h"

namespace athanor::dist {

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target, int64_t vocab, const GroupPtr& tp,
                                    int64_t ignore_index, Reduction reduction) {
  const char* op = "vocab_parallel_cross_entropy";
  ATH_CHECK(tp != nullptr, op, "got no tensor-parallel group");
  ATH_CHECK(logits.defined() && is_floating(logits.dtype()) && logits.dim() == 2, op,
            "logits must be a floating [N, vocab shard] tensor, got ", logits.defined() ? logits.describe() : "none",
            Hint{"flatten the batch and sequence dims: logits.reshape({-1, shard})"});
  ATH_CHECK(target.defined() && (target.dtype() == DType::i64 || target.dtype() == DType::i32) && target.dim() == 1 &&
                target.size(0) == logits.size(0),
            op, "target must be [N] integer ids for logits ", logits.describe(), ", got ",
            target.defined() ? target.describe() : "none");
  const int64_t N = logits.size(0), Vl = logits.size(1), start = static_cast<int64_t>(tp->rank()) * Vl;
  ATH_CHECK(vocab > 0 && vocab <= Vl * tp->size(), op, "vocab ", vocab, " does not fit ", tp->size(), " shards of ", Vl,
            " columns");
  const int64_t valid = std::clamp<int64_t>(vocab - start, 0, Vl);  // real columns of this shard

  auto tv = std::make_shared<std::vector<int64_t>>(N);
  {
    const Tensor tc = target.to(DType::i64).contiguous();
    const int64_t* p = tc.data_ptr<int64_t>();
    for (int64_t n = 0; n < N; ++n) {
      const int64_t t = (*tv)[n] = p[n];
      if (t == ignore_index) continue;
      ATH_CHECK(t >= 0 && t < vocab, op, "target value ", t, " at position ", n, " is out of range for a vocabulary of ",
                vocab, " (valid targets are 0 to ", vocab - 1, ", or ignore_index = ", ignore_index, ")",
                Hint{"check the tokenizer's vocabulary against model.vocab_size"});
    }
  }
  int64_t count = 0;
  for (int64_t t : *tv) count += t != ignore_index;

  const DType sdt = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor lc = logits.detach().contiguous();
  Tensor mx = empty({N}, TensorOptions(sdt)), se = empty({N}, TensorOptions(sdt)), zt = empty({N}, TensorOptions(sdt));
  // 1. the row maxima over the real columns of every shard
  dispatch(lc.dtype(), [&]<class T>() {
    if constexpr (is_float_type_v<T>) {
      dispatch(sdt, [&]<class S>() {
        if constexpr (std::is_floating_point_v<S>) {
          const T* l = static_cast<const T*>(lc.raw_data());
          S* m = static_cast<S*>(mx.raw_data());
          for (int64_t n = 0; n < N; ++n) {
            double v = -std::numeric_limits<double>::infinity();
            for (int64_t c = 0; c < valid; ++c) v = std::max(v, cast_value<double>(l[n * Vl + c]));
            m[n] = static_cast<S>(v);
          }
        }
      });
    }
  });
  tp->all_reduce(mx, ReduceOp::max);
  // 2. Σ exp(logit - m) and 3. the target's logit
  dispatch(lc.dtype(), [&]<class T>() {
    if constexpr (is_float_type_v<T>) {
      dispatch(sdt, [&]<class S>() {
        if constexpr (std::is_floating_point_v<S>) {
          const T* l = static_cast<const T*>(lc.raw_data());
          const S* m = static_cast<const S*>(mx.raw_data());
          S* s = static_cast<S*>(se.raw_data());
          S* z = static_cast<S*>(zt.raw_data());
#pragma omp parallel for if (N * valid > (1 << 16)) schedule(static)
          for (int64_t n = 0; n < N; ++n) {
            double acc = 0;
            const double mn = static_cast<double>(m[n]);
            for (int64_t c = 0; c < valid; ++c) acc += std::exp(cast_value<double>(l[n * Vl + c]) - mn);
            s[n] = static_cast<S>(acc);
            const int64_t t = (*tv)[n] - start;
            z[n] = (*tv)[n] != ignore_index && t >= 0 && t < valid ? static_cast<S>(cast_value<double>(l[n * Vl + t])) : S(0);
          }
        }
      });
    }
  });
  tp->all_reduce(se, ReduceOp::sum);
  tp->all_reduce(zt, ReduceOp::sum);

  std::vector<double> loss(N, 0.0);
  {
    const std::vector<double> m = mx.to_vector(), s = se.to_vector(), z = zt.to_vector();
    for (int64_t n = 0; n < N; ++n)
      if ((*tv)[n] != ignore_index) loss[n] = std::log(s[n]) + m[n] - z[n];
  }
  const DType out_dtype = sdt;  // f32 for f32/bf16/f16 logits (cross_entropy's f32 category), f64 for f64
  Tensor out;
  if (reduction == Reduction::none) {
    out = from_vector(loss, {N}, TensorOptions(out_dtype));
  } else {
    double total = 0;
    for (double v : loss) total += v;
    if (reduction == Reduction::mean)
      total = count > 0 ? total / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN();
    out = scalar_tensor(total, TensorOptions(out_dtype));
  }
  if (!any_requires_grad({logits})) return out;

  SavedTensor sl = save(logits, "logits (vocabulary shard)");
  return record(op, {logits}, out, [=](const Node& nd, const Grads& g) {
    const Tensor xv = sl.unpack(nd).contiguous();
    const std::vector<double> gv = g[0].to_vector(), m = mx.to_vector(), s = se.to_vector();
    const double scale = reduction == Reduction::mean ? 1.0 / static_cast<double>(count) : 1.0;
    Tensor dx = zeros(xv.sizes(), TensorOptions(xv.dtype()));
    dispatch(xv.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        const T* l = static_cast<const T*>(xv.raw_data());
        T* d = static_cast<T*>(dx.raw_data());
#pragma omp parallel for if (N * valid > (1 << 16)) schedule(static)
        for (int64_t n = 0; n < N; ++n) {
          if ((*tv)[n] == ignore_index) continue;
          // d loss_n / d logit_c = softmax_c - [c = target]; padding columns stay 0
          const double gn = gv[reduction == Reduction::none ? n : 0] * scale, inv = 1.0 / s[n];
          const int64_t t = (*tv)[n] - start;
          for (int64_t c = 0; c < valid; ++c) {
            const double p = std::exp(cast_value<double>(l[n * Vl + c]) - m[n]) * inv;
            d[n * Vl + c] = cast_value<T>((p - (c == t ? 1.0 : 0.0)) * gn);
          }
        }
      }
    });
    return Grads{dx};
  });
}

}  // namespace athanor::dist
