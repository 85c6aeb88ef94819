#pragma once
#include <array>

#include "athanor/core/tensor.h"

namespace athanor {

using Pair = std::array<int64_t, 2>;

// x: [N, C_in, H, W]; weight: [C_out, C_in/groups, kH, kW]; bias: [C_out] or undefined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Pair stride = {1, 1},
              Pair padding = {0, 0}, Pair dilation = {1, 1}, int64_t groups = 1);
// stride defaults to the kernel size when given as {0, 0}. Padding for max pool is -inf.
Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0});
// Average pool; padded zeros are counted in the average (count_include_pad=true, PyTorch's default).
Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0});

}  // namespace athanor
