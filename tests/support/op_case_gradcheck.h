#pragma once
// The op harness's gradcheck of one case, shared by the CPU harness
// (tests/ops/test_op_harness.cpp) and the GPU's (tests/gpu/test_gpu_ops.cpp: the f64
// gradchecks on cuda). Defined in test_util.cpp.
#include <gtest/gtest.h>

#include <vector>

#include "athanor/ops/op_harness.h"
#include "test_util.h"

namespace athanor::testing {

// The case's floating outputs flattened and joined into one output, checked by gradcheck on
// `inputs` (the case's f64 tensors, on any one device).
::testing::AssertionResult op_case_gradcheck(const OpCase& c, const std::vector<Tensor>& inputs, GradcheckOptions opts = {});
// The defined floating tensors of `outs`, in order.
std::vector<Tensor> floating_outputs(const std::vector<Tensor>& outs);

}  // namespace athanor::testing
