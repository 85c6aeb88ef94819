#pragma once
// The inputs an op registers for the op harness (ggml's test-backend-ops, over the
// registry), and the harness's shared pieces: making a case's tensors at a dtype, and
// timing a case (perf mode; `athanor ops --bench NAME`).
//
// A case holds f64 values for its floating inputs; the harness converts them to each
// dtype the op supports, lays them out as the case says (contiguous, transposed, strided)
// and runs the op through the functional API. The checks themselves (fast kernel against
// the reference per dtype, f64 gradcheck, perf) are in tests/ops/test_op_harness.cpp.
#include <functional>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

#include "athanor/ops/registry.h"

namespace athanor {

enum class CaseLayout : uint8_t {
  contiguous,
  transposed,  // >= 2-D: the dims laid out in reverse order in memory
  strided,     // every element at twice its contiguous stride (a slice with step 2)
  transposed12,  // >= 3-D: dims 1 and 2 swapped in memory, the rest in order (a [B, H, T, D] view of
                 // a contiguous [B, T, H, D]: rows contiguous, as attention's q, k, v from a projection)
};

struct CaseInput {
  // f64 values of a floating input (converted to each dtype); an integer or bool input as
  // it is; undefined: the argument is left out (no bias).
  Tensor value;
  CaseLayout layout = CaseLayout::contiguous;
  bool grad = true;  // a floating input the gradcheck differentiates
};

struct OpCase {
  std::string label;  // shapes and layouts, e.g. "x [3, 5] strided, w [5]"
  std::vector<CaseInput> inputs;
  std::shared_ptr<const void> args;  // the op's argument struct, as its public function builds it
  const std::type_info* args_type = &typeid(NoArgs);
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> call;  // the op through the functional API
  std::vector<DType> dtypes;  // empty: every dtype of the op
  // Why finite differences cannot check this case's gradient (empty: they can). A cast to a
  // narrower dtype rounds away the step; embedding's padding row gets no gradient by
  // definition. The harness prints every such reason.
  std::string no_gradcheck;
};

// Case inputs: N(0, 1) or uniform [lo, hi) f64 values from `seed`; an input the gradcheck
// leaves alone (ids, masks, running statistics); a left-out argument.
CaseInput case_randn(const Shape& shape, uint64_t seed, CaseLayout layout = CaseLayout::contiguous);
CaseInput case_uniform(const Shape& shape, double lo, double hi, uint64_t seed, CaseLayout layout = CaseLayout::contiguous);
CaseInput case_fixed(Tensor value, CaseLayout layout = CaseLayout::contiguous);
CaseInput case_none();
// uniform [lo, hi) values at least `gap` away from every point in `kinks` (relu's 0, clamp's
// bounds), so that finite differences do not straddle a kink.
CaseInput case_away_from(const Shape& shape, double lo, double hi, const std::vector<double>& kinks, double gap,
                         uint64_t seed, CaseLayout layout = CaseLayout::contiguous);

template <class A>
OpCase make_case(std::string label, std::vector<CaseInput> inputs, A args,
                 std::function<std::vector<Tensor>(const std::vector<Tensor>&, const A&)> call) {
  OpCase c;
  c.label = std::move(label);
  c.inputs = std::move(inputs);
  auto held = std::make_shared<const A>(std::move(args));
  c.args = held;
  c.args_type = &typeid(A);
  c.call = [held, call = std::move(call)](const std::vector<Tensor>& t) { return call(t, *held); };
  return c;
}

using ApiCall = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
// A case of an op without non-tensor arguments.
OpCase make_case(std::string label, std::vector<CaseInput> inputs, ApiCall call);

// The case's inputs at `dtype` (floating ones; others as they are) in the case's layouts;
// floating inputs with grad set become leaves that require grad when `requires_grad`.
std::vector<Tensor> case_tensors(const OpCase& c, DType dtype, bool requires_grad);
// `t`'s values in `layout` (a new tensor; a leaf).
Tensor with_layout(const Tensor& t, CaseLayout layout);
const char* layout_name(CaseLayout l);

// Perf mode: the median time of the forward (through the functional API) and of the backward
// (from a gradient of ones for every floating output) over `reps` runs, after one warm-up.
// backward_us < 0 when the case has no input that needs a gradient.
struct OpTiming {
  double forward_us = 0, backward_us = -1;
  int reps = 0;
};
OpTiming time_case(const OpCase& c, DType dtype, int reps);

}  // namespace athanor
