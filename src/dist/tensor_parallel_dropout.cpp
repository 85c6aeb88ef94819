// Dropout inside tensor-parallel regions (per-rank Philox stream) and on sequence-parallel
// slices (the logical tensor's mask); contract in include/athanor/dist/tensor_parallel_dropout.h.
// The mask rule and arithmetic are ops/dropout.cpp's, so that a slice draws bit for bit what
// the logical tensor draws there.
#include "athanor/dist/tensor_parallel_dropout.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "athanor/autograd/function.h"
#include "athanor/core/convert.h"
#include "athanor/core/error.h"

namespace athanor::dist {

namespace {
// Where element i (row-major in x) sits in the logical tensor: the logical index is
//   (i / (n·B)) · (full·B) + (start·B) + i % (n·B)
// for x = [A, n, B] around `dim`; for the tensor-parallel region the identity.
struct Layout {
  int64_t nB = 1, fullB = 1, startB = 0;
  uint64_t stream = 0;
  int64_t logical(int64_t i) const { return (i / nB) * fullB + startB + i % nB; }
};

template <class T>
void apply_mask(const T* x, T* y, int64_t n, const GeneratorState& st, uint32_t threshold, double scale_d, const Layout& l) {
  using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const S scale = static_cast<S>(scale_d);
#pragma omp parallel if (n > (1 << 14))
  {
    // Consecutive elements mostly share a Philox block (4 words): draw each block once.
    uint64_t cached = UINT64_MAX;
    std::array<uint32_t, 4> r{};
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = l.logical(i);
      const uint64_t block = static_cast<uint64_t>(g / 4);
      if (block != cached) {
        r = philox4x32(st.seed, st.offset + block, l.stream);
        cached = block;
      }
      const bool keep = (r[g % 4] >> 8) >= threshold;
      const S v = cast_value<S>(x[i]) * scale;
      y[i] = cast_value<T>(keep ? v : S(0));
    }
  }
}

Tensor apply(const Tensor& x, const GeneratorState& st, uint32_t threshold, double scale, const Layout& l) {
  const Tensor xc = x.contiguous();
  Tensor y = empty(x.sizes(), TensorOptions(x.dtype()));
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (is_float_type_v<T>)
      apply_mask<T>(static_cast<const T*>(xc.raw_data()), static_cast<T*>(y.raw_data()), x.numel(), st, threshold, scale, l);
  });
  return y;
}

Tensor dropout_with(const char* op, const Tensor& x, double p, int64_t logical_numel, Generator& gen, const Layout& l) {
  const GeneratorState st = gen.reserve(static_cast<uint64_t>((logical_numel + 3) / 4));
  if (p == 1.0) {
    Tensor y = zeros(x.sizes(), TensorOptions(x.dtype()));
    return record(op, {x}, y, [](const Node& nd, const Grads&) {
      return Grads{zeros(nd.input_meta[0].sizes, TensorOptions(nd.input_meta[0].dtype))};
    });
  }
  const uint32_t threshold = static_cast<uint32_t>(std::ceil(p * 16777216.0));  // as ops/dropout.cpp
  const double scale = 1.0 / (1.0 - p);
  Tensor y = apply(x, st, threshold, scale, l);
  return record(op, {x}, y, [st, threshold, scale, l](const Node&, const Grads& g) {
    return Grads{apply(g[0], st, threshold, scale, l)};  // the same mask and scale
  });
}

void check_args(const char* op, const Tensor& x, double p) {
  ATH_CHECK(x.defined() && is_floating(x.dtype()), op, "needs a floating tensor, got ", x.defined() ? x.describe() : "none");
  ATH_CHECK(p >= 0.0 && p <= 1.0, op, "probability p must be in [0, 1], got p = ", p, " (input ", x.describe(), ")",
            Hint{"p is the probability of zeroing an element, e.g. 0.1"});
}
}  // namespace

Tensor tensor_parallel_region_dropout(const Tensor& x, double p, bool training, int tp_index, Generator& gen) {
  const char* op = "tensor_parallel_region_dropout";
  check_args(op, x, p);
  ATH_CHECK(tp_index >= 0, op, "tp_index must be >= 0, got ", tp_index);
  if (!training || p == 0.0) return x;
  Layout l;
  l.nB = l.fullB = std::max<int64_t>(x.numel(), 1);
  l.stream = 1 + static_cast<uint64_t>(tp_index);  // stream 0 is the replicated one
  return dropout_with(op, x, p, x.numel(), gen, l);
}

Tensor sequence_parallel_dropout(const Tensor& x, double p, bool training, int64_t dim, int64_t start, int64_t full,
                                 Generator& gen) {
  const char* op = "sequence_parallel_dropout";
  check_args(op, x, p);
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  ATH_CHECK(d >= 0 && d < x.dim(), op, "dimension ", dim, " is out of range for ", x.describe());
  ATH_CHECK(start >= 0 && start + x.size(d) <= full, op, "the slice [", start, ", ", start + x.size(d), ") of dimension ", d,
            " does not fit the logical size ", full, " (input ", x.describe(), ")");
  if (!training || p == 0.0) return x;
  int64_t B = 1;
  for (int64_t i = d + 1; i < x.dim(); ++i) B *= x.size(i);
  Layout l;
  l.nB = std::max<int64_t>(x.size(d) * B, 1);
  l.fullB = full * B;
  l.startB = start * B;
  return dropout_with(op, x, p, x.numel() / std::max<int64_t>(x.size(d), 1) * full, gen, l);
}

}  // namespace athanor::dist
