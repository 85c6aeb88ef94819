// dropout: inverted dropout, y = x * keep / (1 - p).
//
// The keep mask is a pure function of the generator state: forward makes ONE
// gen.reserve(ceil(n / 4)) call and element i (logical, row-major index) is kept iff
//   uint_to_unit_float(philox4x32(seed, offset + i / 4)[i % 4]) >= p,
// i.e. (word >> 8) >= ceil(p * 2^24) in integers. So the mask is the same for any
// thread count and can be rebuilt from a saved GeneratorState. Backward recomputes
// the mask from the saved (seed, offset) instead of storing it:
//   dx = g * keep / (1 - p).
// p == 1 drops everything (y = 0, dx = 0); eval mode or p == 0 returns x itself.
// The kernel is backend/cpu/dropout.h.
#include <cmath>

#include "athanor/ops/dropout.h"
#include "backend/cpu/dropout.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {

Tensor dropout_apply(const Tensor& x, GeneratorState st, uint32_t threshold, double scale) {
  Tensor y = empty(x.sizes(), TensorOptions(x.dtype()));
  const Tensor xc = detail::contiguous_raw(x);
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (is_float_type_v<T>)
      cpu::dropout_apply<T>(static_cast<const T*>(xc.raw_data()), static_cast<T*>(y.raw_data()), x.numel(), st.seed,
                            st.offset, threshold, scale);
  });
  return y;
}
}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  const char* op = "dropout";
  detail::check_floating(x, op, "x");
  ATH_CHECK(p >= 0.0 && p <= 1.0, op, "probability p must be in [0, 1], got p = ", p, " (input ", x.describe(), ")",
            Hint{"p is the probability of zeroing an element, e.g. 0.1"});
  if (!training || p == 0.0) return x;
  const int64_t n = x.numel();
  const GeneratorState st = gen.reserve(static_cast<uint64_t>((n + 3) / 4));
  if (p == 1.0) {  // everything dropped; the scale 1/(1-p) would be inf
    Tensor y = zeros(x.sizes(), TensorOptions(x.dtype()));
    return record(op, {x}, y, [](const Node& nd, const Grads& g) {
      return Grads{zeros(nd.input_meta[0].sizes, TensorOptions(nd.input_meta[0].dtype))};
    });
  }
  // keep iff word / 2^24 >= p  <=>  word >= ceil(p * 2^24) (p * 2^24 is exact in double)
  const uint32_t threshold = static_cast<uint32_t>(std::ceil(p * 16777216.0));
  const double scale = 1.0 / (1.0 - p);
  Tensor y = dropout_apply(x, st, threshold, scale);
  return record(op, {x}, y, [st, threshold, scale](const Node&, const Grads& g) {
    return Grads{dropout_apply(g[0], st, threshold, scale)};  // same mask, same scale
  });
}

}  // namespace athanor
