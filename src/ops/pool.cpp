// max_pool2d and avg_pool2d: checks, kernels (backend/cpu/pool) and backward.
//   max: dy goes to the first maximum of each window (indices recorded in the forward);
//   avg: dy / (kH kW) goes to every element of the window (count_include_pad = true).
#include <algorithm>
#include <sstream>

#include "athanor/ops/conv.h"
#include "backend/cpu/pool.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {

std::string pair_str(Pair p) {
  std::ostringstream s;
  s << "(" << p[0] << ", " << p[1] << ")";
  return s.str();
}

using detail::Grads;
using detail::Inputs;

using detail::PoolArgs;  // ops/op_args.h: shared with the CUDA kernel (src/ops/cuda/)
struct PoolSaved : OpSaved {
  SavedTensor idx;  // max: the argmax of each window
  cpu::Pool2dGeom g;
  DType dt = DType::f32;
};

template <bool Max> std::vector<Tensor> pool_cpu(OpCall& c) {
  const Tensor& x = c.in(0);
  const PoolArgs& a = c.args<PoolArgs>();
  const cpu::Pool2dGeom g = detail::pool2d_geometry(c.name(), x, a.kernel, a.stride, a.padding);
  const DType dt = x.dtype();
  const Tensor xc = detail::contiguous_raw(x);
  Tensor y = empty({g.N, g.C, g.OH, g.OW}, TensorOptions(dt));
  Tensor idx = Max ? empty({g.N, g.C, g.OH, g.OW}, TensorOptions(DType::i64)) : Tensor();
  dispatch(dt, [&]<class T>() {
    if constexpr (is_float_type_v<T>) {
      if constexpr (Max) cpu::max_pool2d_forward<T>(xc.data_ptr<T>(), y.data_ptr<T>(), idx.data_ptr<int64_t>(), g);
      else cpu::avg_pool2d_forward<T>(xc.data_ptr<T>(), y.data_ptr<T>(), g);
    }
  });
  if (c.records()) {
    PoolSaved& s = c.save<PoolSaved>();
    if (Max) s.idx = save(idx, "indices");
    s.g = g, s.dt = dt;
  }
  return {y};
}

template <bool Max> Grads pool_backward(const Node& n, const Grads& grads, const OpSaved& saved) {
  const PoolSaved& s = saved.as<PoolSaved>();
  const cpu::Pool2dGeom& g = s.g;
  const Tensor iv = Max ? s.idx.unpack(n) : Tensor();
  if (!grads[0].defined()) return {Tensor()};
  const Tensor dy = detail::to_raw(grads[0], s.dt);
  Tensor dx = empty({g.N, g.C, g.H, g.W}, TensorOptions(s.dt));
  dispatch(s.dt, [&]<class T>() {
    if constexpr (is_float_type_v<T>) {
      if constexpr (Max) cpu::max_pool2d_backward<T>(dy.data_ptr<T>(), iv.data_ptr<int64_t>(), dx.data_ptr<T>(), g);  // dx[argmax] += dy
      else cpu::avg_pool2d_backward<T>(dy.data_ptr<T>(), dx.data_ptr<T>(), g);  // dx[window] += dy / (kH kW)
    }
  });
  return {dx};
}

template <bool Max> std::vector<Tensor> pool_reference(OpCall& c) {
  const PoolArgs& a = c.args<PoolArgs>();
  const Tensor x = detail::ref64(c.in(0));
  const cpu::Pool2dGeom g = detail::pool2d_geometry("reference", x, a.kernel, a.stride, a.padding);
  return {Max ? cpu::ref::max_pool2d(x, g) : cpu::ref::avg_pool2d(x, g)};
}

// Windows that do not overlap (the default stride), overlap (stride 1) and reach into the
// padding. max: values spaced apart, so no window has a tie and finite differences never
// move its maximum.
template <bool Max> std::vector<OpCase> pool_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const PoolArgs& a) {
    return Inputs{Max ? max_pool2d(t[0], a.kernel, a.stride, a.padding) : avg_pool2d(t[0], a.kernel, a.stride, a.padding)};
  };
  auto in = [](const Shape& shape, uint64_t seed, CaseLayout l) {
    if (!Max) return case_randn(shape, seed, l);
    // a permutation of 0.1, 0.2, ...: distinct values at least 0.1 apart
    CaseInput r = case_randn(shape, seed, l);
    std::vector<double> v = r.value.to_vector(), sorted = v;
    std::sort(sorted.begin(), sorted.end());
    for (double& e : v) e = 0.1 * static_cast<double>(std::lower_bound(sorted.begin(), sorted.end(), e) - sorted.begin() + 1);
    r.value = from_vector(v, shape, TensorOptions(DType::f64));
    return r;
  };
  return {
      make_case<PoolArgs>("x [2, 2, 4, 6], kernel 2x2", {in({2 * s, 2, 4, 6}, 1, CaseLayout::contiguous)}, {{2, 2}, {0, 0}, {0, 0}}, call),
      make_case<PoolArgs>("x [1, 3, 5, 5] transposed, kernel 3x2, stride 1", {in({s, 3, 5, 5}, 2, CaseLayout::transposed)},
                          {{3, 2}, {1, 1}, {0, 0}}, call),
      make_case<PoolArgs>("x [1, 2, 5, 4] strided, kernel 3x3, stride 2, padding 1", {in({s, 2, 5, 4}, 3, CaseLayout::strided)},
                          {{3, 3}, {2, 2}, {1, 1}}, call),
  };
}
}  // namespace

namespace detail {
cpu::Pool2dGeom pool2d_geometry(const char* op, const Tensor& x, Pair kernel, Pair stride, Pair padding) {
  detail::check_floating(x, op, "input");
  ATH_CHECK(x.dim() == 4, op, "input must be 4-D [N, C, H, W], got ", x.describe(),
            Hint{"add a batch dim with unsqueeze(x, 0) for a single image"});
  ATH_CHECK(kernel[0] >= 1 && kernel[1] >= 1, op, "kernel size must be >= 1, got ", pair_str(kernel));
  if (stride[0] == 0 && stride[1] == 0) stride = kernel;  // default: non-overlapping windows
  ATH_CHECK(stride[0] >= 1 && stride[1] >= 1, op, "stride must be >= 1 (or {0, 0} for the kernel size), got ",
            pair_str(stride));
  ATH_CHECK(padding[0] >= 0 && padding[1] >= 0 && 2 * padding[0] <= kernel[0] && 2 * padding[1] <= kernel[1], op,
            "padding must be >= 0 and at most half the kernel size, got padding ", pair_str(padding), " for kernel ",
            pair_str(kernel), Hint{"a window that lies entirely in the padding has no input to pool"});
  cpu::Pool2dGeom g;
  g.N = x.size(0), g.C = x.size(1), g.H = x.size(2), g.W = x.size(3);
  g.KH = kernel[0], g.KW = kernel[1], g.sh = stride[0], g.sw = stride[1], g.ph = padding[0], g.pw = padding[1];
  const int64_t sh = g.H + 2 * g.ph - g.KH, sw = g.W + 2 * g.pw - g.KW;
  g.OH = sh < 0 ? 0 : sh / g.sh + 1;
  g.OW = sw < 0 ? 0 : sw / g.sw + 1;
  ATH_CHECK(g.OH > 0 && g.OW > 0, op, "kernel ", pair_str(kernel), " is larger than the padded input ", x.describe(),
            " with padding ", pair_str(padding), Hint{"use a smaller kernel, more padding, or a larger input"});
  return g;
}
}  // namespace detail

namespace ops {
const OpDef& max_pool2d_op() {
  static const OpDef d{.name = "max_pool2d", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(pool_cpu<true>, pool_backward<true>), .reference = pool_reference<true>,
                       .dtypes = detail::kFloatDTypes, .cases = pool_cases<true>,
                       .derivative = "g to the first max of each window", .file = "src/ops/pool.cpp"};
  return d;
}
const OpDef& avg_pool2d_op() {
  static const OpDef d{.name = "avg_pool2d", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(pool_cpu<false>, pool_backward<false>), .reference = pool_reference<false>,
                       .dtypes = detail::kFloatDTypes, .cases = pool_cases<false>,
                       .derivative = "g / (kH kW) over each window", .file = "src/ops/pool.cpp"};
  return d;
}
}  // namespace ops

Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding) {
  return call_op(ops::max_pool2d_op(), {x}, PoolArgs{kernel, stride, padding});
}
Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding) {
  return call_op(ops::avg_pool2d_op(), {x}, PoolArgs{kernel, stride, padding});
}

}  // namespace athanor
