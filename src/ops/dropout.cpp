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
#include "ops/op_args.h"
#include "ops/op_def.h"
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
using detail::Grads;
using detail::Inputs;

using detail::DropoutArgs;  // shared with the CUDA kernel (ops/op_args.h)
struct DropoutSaved : OpSaved {
  GeneratorState st;
  uint32_t threshold = 0;
  double scale = 1.0;
  bool all_dropped = false;  // p == 1
  Shape shape;
  DType dtype = DType::f32;
};

std::vector<Tensor> dropout_cpu(OpCall& c) {
  const Tensor& x = c.in(0);
  const auto [p, gen] = c.args<DropoutArgs>();
  const int64_t n = x.numel();
  const GeneratorState st = gen->reserve(static_cast<uint64_t>((n + 3) / 4));
  DropoutSaved* s = c.records() ? &c.save<DropoutSaved>() : nullptr;
  if (p == 1.0) {  // everything dropped; the scale 1/(1-p) would be inf
    if (s) s->all_dropped = true, s->shape = x.sizes(), s->dtype = x.dtype();
    return {zeros(x.sizes(), TensorOptions(x.dtype()))};
  }
  // keep iff word / 2^24 >= p  <=>  word >= ceil(p * 2^24) (p * 2^24 is exact in double)
  const uint32_t threshold = static_cast<uint32_t>(std::ceil(p * 16777216.0));
  const double scale = 1.0 / (1.0 - p);
  if (s) s->st = st, s->threshold = threshold, s->scale = scale;
  return {dropout_apply(x, st, threshold, scale)};
}

Grads dropout_backward(const Node&, const Grads& g, const OpSaved& saved) {
  const DropoutSaved& s = saved.as<DropoutSaved>();
  if (s.all_dropped) return {zeros(s.shape, TensorOptions(s.dtype))};
  return {dropout_apply(g[0], s.st, s.threshold, s.scale)};  // same mask, same scale
}

// The mask element by element from the generator's state (peeked, not reserved), in double.
std::vector<Tensor> dropout_reference(OpCall& c) {
  const auto [p, gen] = c.args<DropoutArgs>();
  const GeneratorState st = gen->state();
  std::vector<double> x = c.in(0).to_vector();
  for (size_t i = 0; i < x.size(); ++i) {
    const float u = uint_to_unit_float(philox4x32(st.seed, st.offset + i / 4)[i % 4]);
    x[i] = p == 1.0 || static_cast<double>(u) < p ? 0.0 : x[i] / (1.0 - p);
  }
  return {from_vector(x, c.in(0).sizes(), TensorOptions(DType::f64))};
}

std::vector<OpCase> dropout_cases(int scale) {
  const int64_t s = scale;
  // Each call draws from a fresh generator of the case's seed; the reference peeks at an
  // unused one of the same seed, so both see the same stream.
  auto make = [](std::string label, CaseInput x, double p, uint64_t seed) {
    auto peek = std::make_shared<Generator>(seed);
    return make_case<DropoutArgs>(std::move(label), {std::move(x)}, {p, peek.get()},
                                  [peek, seed](const Inputs& t, const DropoutArgs& a) {
                                    Generator g(seed);
                                    return Inputs{dropout(t[0], a.p, true, g)};
                                  });
  };
  return {
      make("x [6, 5], p 0.3", case_randn({6 * s, 5}, 1), 0.3, 11),
      make("x [4, 3] transposed, p 0.5", case_randn({4 * s, 3}, 2, CaseLayout::transposed), 0.5, 12),
      make("x [9] strided, p 1 (all dropped)", case_randn({9 * s}, 3, CaseLayout::strided), 1.0, 13),
  };
}
}  // namespace

namespace ops {
const OpDef& dropout_op() {
  static const OpDef d{.name = "dropout", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(dropout_cpu, dropout_backward), .reference = dropout_reference,
                       .dtypes = detail::kFloatDTypes, .cases = dropout_cases,
                       .derivative = "g mask / (1 - p), the mask rebuilt from (seed, offset)", .file = "src/ops/dropout.cpp"};
  return d;
}
}  // namespace ops

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  const char* op = "dropout";
  detail::check_floating(x, op, "x");
  ATH_CHECK(p >= 0.0 && p <= 1.0, op, "probability p must be in [0, 1], got p = ", p, " (input ", x.describe(), ")",
            Hint{"p is the probability of zeroing an element, e.g. 0.1"});
  if (!training || p == 0.0) return x;  // the identity: no op runs
  return call_op(ops::dropout_op(), {x}, DropoutArgs{p, &gen});
}

}  // namespace athanor
