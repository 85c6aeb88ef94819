// linear_relu(x, W, b) = relu(linear(x, W, b)), the hidden layer of an MLP, fused:
//
//   forward   y = x W^T + b          one GEMM, the bias in its epilogue (cpu::gemm_bias)
//             y = max(y, 0)          in place, while y is still in cache (f32 at a batch of
//                                    ~128: in the GEMM's epilogue, cpu::small_batch_gemm)
//   backward  g = dy ⊙ [y > 0]        scratch (MemTag::workspace), with
//             db = rowsum(g)          in the same pass (cpu::relu_backward_rowsum)
//             dx = g W,  dW = g^T x   two GEMMs (f32 dx at a batch of ~128: cpu::gemm's small-
//                                     batch tiles; else each thread on its rows of g)
//
// Against the unfused relu(linear(...)): no separate pre-activation tensor, one graph node
// instead of two, the ReLU forward without a second output buffer, and the ReLU backward
// and the bias-gradient reduction as one pass instead of two. The graph keeps x, W and y,
// as the composition does.
//
// Under bf16 autocast with f32 parameters (mixed-precision training), W and b are not cast
// through differentiable "cast" nodes: the op runs on their bf16 copies (the optimizer's
// persistent copies when registered, else the region's cached casts, taken outside the
// graph) but records the f32 tensors themselves as its inputs, and writes dW and db in f32
// straight from the f32 accumulators (cpu::gemm_bf16_f32out, the f32 column sums). That
// drops the bf16 dW/db buffers and the cast-back pass per parameter (cast_backward), and
// dW/db are no longer rounded to bf16 on the way (PyTorch's rounds them; ours are closer to
// the exact gradient). Everything else rounds where the composition rounds (the GEMM output
// to y's dtype; g is exact).
#include "athanor/ops/linear_relu.h"

#include <omp.h>

#include <vector>

#include "backend/cpu/activation.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_row_blocks.h"
#include "backend/cpu/small_batch_gemm.h"
#include "backend/cpu/workspace.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
using detail::Grads;
constexpr const char* kOp = "linear_relu";
constexpr const char* kHint =
    "linear_relu(x, W, b) is relu(linear(x, W, b)): x's last dim is W's in_features (the previous layer's output size)";
using detail::gemm_t;
constexpr int64_t kThreadedMacs = 1 << 18;  // ~50 us of multiply-adds: below, a second thread costs more than it saves

// y = relu(x W^T + b) on contiguous x, W, b of dtype T.
template <class T> void forward_into(const Tensor& xc, const Tensor& wc, const Tensor& bias, Tensor& y, int64_t M, int64_t out_f,
                                     int64_t in) {
  const Tensor bc = bias.defined() ? detail::contiguous_raw(bias) : Tensor();
  T* py = static_cast<T*>(y.raw_data());
  const T* px = static_cast<const T*>(xc.raw_data());
  const T* pb = bc.defined() ? static_cast<const T*>(bc.raw_data()) : nullptr;
  if constexpr (std::is_same_v<T, float>)  // a batch of ~128: the ReLU in the GEMM's epilogue (a pass of 23-36 us saved)
    if (cpu::small_batch_gemm(false, true, M, out_f, in, 1.0f, px, in, static_cast<const float*>(wc.raw_data()), in, 0.0f,
                              pb, py, out_f, /*relu=*/true))
      return;
  detail::linear_gemm_w<T>(M, out_f, in, px, wc, pb, py);
  cpu::activation_forward<T>(cpu::Activation::relu, py, py, M * out_f);  // elementwise: in place is safe
}

Tensor output_like(const Tensor& x, int64_t out_f) {
  Shape s = x.sizes();
  s.back() = out_f;
  return empty(s, TensorOptions(x.dtype()));
}

struct LinearReluSaved : OpSaved {
  SavedTensor x, w, y;  // contiguous; under the f32-master rule the bf16 x and the bf16 copy of W
  int64_t in = 0, out_f = 0, M = 0;
  bool master = false;
};

std::vector<Tensor> linear_relu_cpu(OpCall& c) {
  const Tensor &x = c.in(0), &weight = c.in(1), &bias = c.in(2);
  detail::check_linear_args(x, weight, bias, kOp, kHint);
  const int64_t in = weight.size(1), out_f = weight.size(0), M = x.numel() / std::max<int64_t>(in, 1);
  const Tensor xc = detail::contiguous_raw(x), wc = detail::contiguous_raw(weight);
  Tensor y = output_like(x, out_f);
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) forward_into<T>(xc, wc, bias, y, M, out_f, in);
  });
  if (c.records()) {
    LinearReluSaved& s = c.save<LinearReluSaved>();
    // Under bf16 autocast with f32 W (and b): the bf16 copies were read, the node records the f32
    // parameters, and dW and db are written in f32 (OpDef::f32_master; see the file comment).
    s.master = c.runs_on_master(1);
    s.x = save(xc, "input"), s.w = save(wc, s.master ? "weight (bf16 copy)" : "weight"), s.y = save(y, "result");
    s.in = in, s.out_f = out_f, s.M = M;
  }
  return {y};
}

Grads linear_relu_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const LinearReluSaved& s = saved.as<LinearReluSaved>();
  const int64_t in = s.in, out_f = s.out_f, M = s.M;
  if (s.master) {
    const Tensor yv = s.y.unpack(n);
    const Tensor dy = detail::to_raw(g[0], DType::bf16);
    Tensor dx, dw, db;
    const cpu::Workspace gw(static_cast<std::size_t>(M * out_f) * sizeof(bfloat16));  // dy ⊙ [y > 0]
    bfloat16* pg = gw.as<bfloat16>();
    if (needs_grad(n, 2)) db = empty({out_f}, TensorOptions(DType::f32));
    cpu::relu_backward_rowsum<bfloat16>(static_cast<const bfloat16*>(yv.raw_data()), static_cast<const bfloat16*>(dy.raw_data()),
                                        pg, db.defined() ? static_cast<float*>(db.raw_data()) : nullptr, M, out_f);
    detail::lowp_linear_backward_gemms(n, pg, s.x, s.w, M, in, out_f, dx, dw);  // dx = g W, dW = g^T x (f32)
    return {dx, dw, db};
  }
    const Tensor yv = s.y.unpack(n);
    const Tensor dy = detail::to_raw(g[0], yv.dtype());
    Tensor dx, dw, db;
    dispatch(dy.dtype(), [&]<class T>() {
      if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
        using A = cpu::rowsum_acc_t<T>;
        const cpu::Workspace gbuf(static_cast<std::size_t>(M * out_f) * sizeof(T));  // dy ⊙ [y > 0], dropped on return
        T* pg = gbuf.as<T>();
        // The bias gradient's sums: straight into db for f32/f64, else f32 sums rounded once to T.
        std::vector<A> db_acc;
        A* pdb = nullptr;
        if (needs_grad(n, 2)) {
          db = empty({out_f}, TensorOptions(dy.dtype()));
          if constexpr (std::is_same_v<A, T>) pdb = static_cast<T*>(db.raw_data());
          else pdb = (db_acc.resize(out_f), db_acc.data());
        }
        // g = dy ⊙ [y > 0] and db = rowsum(g), one pass (0 at the kink y = 0, like PyTorch)
        cpu::relu_backward_rowsum<T>(static_cast<const T*>(yv.raw_data()), static_cast<const T*>(dy.raw_data()), pg, pdb, M,
                                     out_f);
        if (!db_acc.empty())
          for (int64_t j = 0; j < out_f; ++j) static_cast<T*>(db.raw_data())[j] = cast_value<T>(db_acc[j]);
        if (needs_grad(n, 0)) {  // dx = g W            [M, out] @ [out, in]
          const Tensor wv = s.w.unpack(n);
          dx = empty(Shape(s.x.unpack(n).sizes()), TensorOptions(dy.dtype()));
          if constexpr (std::is_same_v<T, float>) {
            const float* w = static_cast<const float*>(wv.raw_data());
            float* pdx = static_cast<float*>(dx.raw_data());
            if (cpu::small_batch_gemm_enabled() && cpu::small_batch_gemm_applies(false, false, M, in, out_f, 1.0f)) {
              // A batch of ~128 rows: the small-batch tiles with both threads on all rows (each
              // reading half of W) beat an sgemm per half of the rows (each reading all of W):
              // MLP step 0.956x [0.949-0.983] over 8 interleaved pairs.
              cpu::gemm(false, false, M, in, out_f, 1.0f, pg, out_f, w, in, 0.0f, pdx, in);
            } else {  // each thread on its rows (gemm_row_blocks.h); tiny: one
              const detail::PackedWeight pw = detail::input_grad_packed(wv, M, in, out_f);
              cpu::gemm_row_blocks(M, in, out_f, pg, out_f, w, in, pdx, in,
                                   M * in * out_f >= kThreadedMacs ? omp_get_max_threads() : 1, [](int64_t, int64_t) {},
                                   pw ? &pw.layout : nullptr, static_cast<const float*>(pw.data));
            }
          } else {
            detail::input_grad_gemm<T>(M, in, out_f, pg, wv, static_cast<T*>(dx.raw_data()));
          }
        }
        if (needs_grad(n, 1)) {  // dW = g^T x          [out, M] @ [M, in]
          const Tensor xv = s.x.unpack(n);
          dw = empty({out_f, in}, TensorOptions(dy.dtype()));
          gemm_t<T>(true, false, out_f, in, M, pg, out_f, static_cast<const T*>(xv.raw_data()), in, 0.0f,
                    static_cast<T*>(dw.raw_data()), in);
        }
      }
    });
  return {dx, dw, db};
}

// relu(x W^T + b): the reference GEMM in double, then the reference activation.
std::vector<Tensor> linear_relu_reference(OpCall& c) {
  const Tensor x = detail::ref64(c.in(0)).contiguous(), w = detail::ref64(c.in(1)).contiguous();
  const int64_t in = w.size(1), out_f = w.size(0), M = x.numel() / std::max<int64_t>(in, 1);
  Shape out = x.sizes();
  out.back() = out_f;
  Tensor y = zeros(out, TensorOptions(DType::f64));
  if (c.in(2).defined()) copy_into(y, detail::ref64(c.in(2)));
  cpu::ref::gemm<double>(false, true, M, out_f, in, 1.0, x.data_ptr<double>(), in, w.data_ptr<double>(), in, 1.0,
                         y.data_ptr<double>(), out_f);
  return {cpu::ref::activation_forward(cpu::Activation::relu, y)};
}
}  // namespace

namespace ops {
const OpDef& linear_relu_op() {
  static const OpDef d{.name = "linear_relu", .inputs = {"x", "weight", "bias"}, .category = AutocastCategory::lower_precision,
                       .f32_master = 0b110u, .kernels = detail::cpu_kernels(linear_relu_cpu, linear_relu_backward),
                       .reference = linear_relu_reference, .dtypes = detail::kFloatDTypes,
                       .cases = [](int s) { return detail::linear_like_cases(s, linear_relu); },
                       .derivative = "g = dy [y > 0], db = rowsum(g), dx = g W, dW = g^T x", .file = "src/ops/linear_relu.cpp"};
  return d;
}
}  // namespace ops

Tensor linear_relu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return call_op(ops::linear_relu_op(), {x, weight, bias});
}

}  // namespace athanor
