// matmul (batched, broadcasting, transposes handed to the GEMM) and linear
// (one GEMM with the bias added in its epilogue, detail::linear_gemm_t). Under bf16
// autocast with f32 parameters linear records W and b themselves and writes dW, db in f32
// (OpDef::f32_master; the dispatch point hands the kernel the bf16 copies).
#include "athanor/ops/linalg.h"

#include "athanor/ops/reduction.h"
#include "athanor/ops/shape.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/reduce.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
using detail::gemm_t;
using detail::Grads;
using detail::Inputs;

// How a matrix (last two dims of a tensor) can be handed to the GEMM without a copy.
struct MatLayout {
  bool ok = false, trans = false;
  int64_t ld = 0;
};
MatLayout layout_of(const Tensor& t) {
  const int64_t r = t.size(-2), c = t.size(-1), sr = t.stride(-2), sc = t.stride(-1);
  if ((sc == 1 || c == 1) && sr >= std::max<int64_t>(c, 1)) return {true, false, sr};
  if ((sr == 1 || r == 1) && sc >= std::max<int64_t>(r, 1)) return {true, true, sc};
  return {};
}

// out[batch..., M, N] = A[batch..., M, K] @ B[batch..., K, N] for >= 2-D operands,
// broadcasting batch dims. Not recorded.
Tensor matmul_kernel(const Tensor& a_in, const Tensor& b_in) {
  const int64_t M = a_in.size(-2), K = a_in.size(-1), N = b_in.size(-1);
  const Shape abatch(a_in.sizes().begin(), a_in.sizes().end() - 2), bbatch(b_in.sizes().begin(), b_in.sizes().end() - 2);
  const Shape batch = broadcast_shapes(abatch, bbatch, "matmul");
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  Tensor out = empty(out_shape, TensorOptions(a_in.dtype()));
  if (out.numel() == 0) return out;
  Tensor a = a_in, b = b_in;
  MatLayout la = layout_of(a), lb = layout_of(b);
  if (!la.ok) a = detail::contiguous_raw(a), la = layout_of(a);
  if (!lb.ok) b = detail::contiguous_raw(b), lb = layout_of(b);
  dispatch(a.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
      const T* pa = static_cast<const T*>(a.raw_data());
      const T* pb = static_cast<const T*>(b.raw_data());
      T* po = static_cast<T*>(out.raw_data());
      // Fold a's batch into M when b is a single matrix and a's rows are evenly spaced.
      if (bbatch.empty() && !la.trans && a.dim() > 2) {
        bool foldable = true;
        int64_t expect = a.stride(-2) * M;
        for (int64_t i = a.dim() - 3; i >= 0; --i) {
          if (a.sizes()[i] != 1 && a.strides()[i] != expect) { foldable = false; break; }
          expect *= a.sizes()[i];
        }
        if (foldable) {
          gemm_t<T>(false, lb.trans, shape_numel(abatch) * M, N, K, pa, la.ld, pb, lb.ld, 0.0f, po, N);
          return;
        }
      }
      const int64_t nb = shape_numel(batch), nd = static_cast<int64_t>(batch.size());
      for (int64_t i = 0; i < nb; ++i) {
        int64_t rem = i, oa = 0, ob = 0;  // element offsets of this batch entry in a and b (stride 0 if broadcast)
        for (int64_t d = nd - 1; d >= 0; --d) {
          const int64_t c = rem % batch[d];
          rem /= batch[d];
          const int64_t ia = d - (nd - static_cast<int64_t>(abatch.size())), ib = d - (nd - static_cast<int64_t>(bbatch.size()));
          if (ia >= 0 && abatch[ia] != 1) oa += c * a.strides()[ia];
          if (ib >= 0 && bbatch[ib] != 1) ob += c * b.strides()[ib];
        }
        gemm_t<T>(la.trans, lb.trans, M, N, K, pa + oa, la.ld, pb + ob, lb.ld, 0.0f, po + i * M * N, N);
      }
    }
  });
  return out;
}

// t with a size-1 dim inserted at d (a raw view: not recorded).
Tensor raw_unsqueeze(const Tensor& t, int64_t d) {
  Shape sz = t.sizes(), st = t.strides();
  const int64_t stride = d < t.dim() ? t.strides()[d] * t.sizes()[d] : 1;
  sz.insert(sz.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return make_view(t, sz, st, t.storage_offset());
}

struct MatmulSaved : OpSaved {
  SavedTensor a, b;  // the operands as the GEMM saw them: 1-D ones with their size-1 dim added
  Shape a_shape, b_shape, out_nd;
};

// matmul: a 1-D a is a row [1, K], a 1-D b a column [K, 1]; the added dims are dropped from the result.
std::vector<Tensor> matmul_cpu(OpCall& c) {
  const Tensor &a = c.in(0), &b = c.in(1);
  detail::check_floating(a, "matmul", "a");
  detail::check_floating(b, "matmul", "b");
  detail::check_same_dtype(a, b, "matmul");
  ATH_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul", "both operands need at least 1 dimension, got ", a.describe(), " and ",
            b.describe());
  const Tensor A = a.dim() == 1 ? raw_unsqueeze(a, 0) : a;
  const Tensor B = b.dim() == 1 ? raw_unsqueeze(b, 1) : b;
  ATH_CHECK(A.size(-1) == B.size(-2), "matmul", "inner dimensions do not match: a is ", a.describe(), ", b is ",
            b.describe(), " (", A.size(-1), " != ", B.size(-2), ")",
            Hint{"matmul(a, b) needs a.size(-1) == b.size(-2); transpose one operand or check the layer sizes"});
  Tensor out = matmul_kernel(A, B);
  const Shape out_nd = out.sizes();
  if (a.dim() == 1 || b.dim() == 1) {
    Shape sz = out_nd;
    if (b.dim() == 1) sz.pop_back();                              // [..., M, 1] -> [..., M]
    if (a.dim() == 1) sz.erase(sz.end() - (b.dim() == 1 ? 1 : 2));  // [..., 1, N] -> [..., N]
    out = make_view(out, sz, contiguous_strides(sz), 0);
  }
  if (c.records()) {
    MatmulSaved& s = c.save<MatmulSaved>();
    s.a = save(A, "self"), s.b = save(B, "other"), s.a_shape = a.sizes(), s.b_shape = b.sizes(), s.out_nd = out_nd;
  }
  return {out};
}

Grads matmul_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const MatmulSaved& s = saved.as<MatmulSaved>();
  const Tensor av = s.a.unpack(n), bv = s.b.unpack(n);
  const Tensor G = reshape(g[0], s.out_nd);  // the dims a 1-D operand dropped, back as size 1
  Tensor ga, gb;
  if (needs_grad(n, 0)) ga = reshape(sum_to(matmul_kernel(G, transpose(bv, -1, -2)), av.sizes()), s.a_shape);  // dA = dC B^T
  if (needs_grad(n, 1)) {
    if (bv.dim() == 2 && av.dim() > 2) {  // dB = sum over batch of A^T dC = A_flat^T dC_flat
      const int64_t K = av.size(-1), N = G.size(-1);
      gb = matmul_kernel(transpose(reshape(av, {-1, K}), 0, 1), reshape(G, {-1, N}));
    } else {
      gb = sum_to(matmul_kernel(transpose(av, -1, -2), G), bv.sizes());
    }
    gb = reshape(gb, s.b_shape);
  }
  return {ga, gb};
}

std::vector<Tensor> matmul_reference(OpCall& c) {  // batch by batch, cpu::ref::gemm in double
  Tensor a = detail::ref64(c.in(0)), b = detail::ref64(c.in(1));
  const bool a1 = a.dim() == 1, b1 = b.dim() == 1;
  if (a1) a = a.view({1, a.size(0)});
  if (b1) b = b.view({b.size(0), 1});
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  const Shape abatch(a.sizes().begin(), a.sizes().end() - 2), bbatch(b.sizes().begin(), b.sizes().end() - 2);
  Shape out = broadcast_shapes(abatch, bbatch, "reference");
  const Shape batch = out;
  Shape ash = batch, bsh = batch;
  ash.push_back(M), ash.push_back(K), bsh.push_back(K), bsh.push_back(N);
  Tensor ae = empty(ash, TensorOptions(DType::f64)), be = empty(bsh, TensorOptions(DType::f64));
  copy_into(ae, a);
  copy_into(be, b);
  out.push_back(M), out.push_back(N);
  Tensor y = empty(out, TensorOptions(DType::f64));
  for (int64_t i = 0; i < shape_numel(batch); ++i)
    cpu::ref::gemm<double>(false, false, M, N, K, 1.0, ae.data_ptr<double>() + i * M * K, K, be.data_ptr<double>() + i * K * N, N,
                           0.0, y.data_ptr<double>() + i * M * N, N);
  Shape final_shape = out;
  if (b1) final_shape.pop_back();
  if (a1) final_shape.erase(final_shape.end() - (b1 ? 1 : 2));
  return {y.view(final_shape)};
}

std::vector<OpCase> matmul_cases(int scale) {
  const int64_t s = scale;
  const ApiCall call = [](const Inputs& t) { return Inputs{matmul(t[0], t[1])}; };
  return {
      make_case("a [5, 4], b [4, 3] transposed", {case_randn({5 * s, 4}, 1), case_randn({4, 3}, 2, CaseLayout::transposed)}, call),
      make_case("a [2, 3, 4] (batch folded), b [4, 5]", {case_randn({2 * s, 3, 4}, 3), case_randn({4, 5}, 4)}, call),
      make_case("a [2, 1, 3, 4] strided, b [3, 4, 2] (batch broadcast)",
                {case_randn({2 * s, 1, 3, 4}, 5, CaseLayout::strided), case_randn({3, 4, 2}, 6)}, call),
      make_case("a [4] (1-D), b [2, 4, 3]", {case_randn({4}, 7), case_randn({2 * s, 4, 3}, 8)}, call),
      make_case("a [3, 4], b [4] (1-D)", {case_randn({3 * s, 4}, 9), case_randn({4}, 10)}, call),
      make_case("a [4] (1-D), b [4] (1-D)", {case_randn({4 * s}, 11), case_randn({4 * s}, 12)}, call),
  };
}

// ---- linear: y = x W^T + b, one GEMM with the bias in its epilogue
struct LinearSaved : OpSaved {
  SavedTensor x, w;  // contiguous; under the f32-master rule the bf16 x and the bf16 copy of W
  int64_t in = 0, out_f = 0, M = 0;
  bool master = false;
};

std::vector<Tensor> linear_cpu(OpCall& c) {
  const Tensor &x = c.in(0), &weight = c.in(1), &bias = c.in(2);
  detail::check_linear_args(x, weight, bias, "linear", "check the layer's in_features against the previous layer's output size");
  const int64_t in = weight.size(1), out_f = weight.size(0), M = x.numel() / std::max<int64_t>(in, 1);
  const Tensor xc = detail::contiguous_raw(x), wc = detail::contiguous_raw(weight);
  Shape out_shape = x.sizes();
  out_shape.back() = out_f;
  Tensor y = empty(out_shape, TensorOptions(x.dtype()));
  dispatch(x.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
      const Tensor bc = bias.defined() ? detail::contiguous_raw(bias) : Tensor();
      detail::linear_gemm_w<T>(M, out_f, in, static_cast<const T*>(xc.raw_data()), wc,
                               bc.defined() ? static_cast<const T*>(bc.raw_data()) : nullptr, static_cast<T*>(y.raw_data()));
    }
  });
  if (c.records()) {
    LinearSaved& s = c.save<LinearSaved>();
    // Under bf16 autocast with f32 W (and b) the GEMMs ran on the bf16 copies; the node's inputs
    // are the f32 parameters, and dW, db are written in f32 (OpDef::f32_master).
    s.master = c.runs_on_master(1);
    s.x = save(xc, "input"), s.w = save(wc, s.master ? "weight (bf16 copy)" : "weight");
    s.in = in, s.out_f = out_f, s.M = M;
  }
  return {y};
}

Grads linear_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const LinearSaved& s = saved.as<LinearSaved>();
  const int64_t in = s.in, out_f = s.out_f, M = s.M;
  Tensor dx, dw, db;
  if (s.master) {
    const Tensor dy = detail::to_raw(g[0], DType::bf16);
    const bfloat16* pdy = static_cast<const bfloat16*>(dy.raw_data());
    detail::lowp_linear_backward_gemms(n, pdy, s.x, s.w, M, in, out_f, dx, dw);  // dx = dy W, dW = dy^T x (f32)
    if (needs_grad(n, 2)) {  // db = sum over rows of dy, f32 sums kept in f32
      db = empty({out_f}, TensorOptions(DType::f32));
      cpu::sum_3d_lowp_input<bfloat16>(pdy, static_cast<float*>(db.raw_data()), 1, M, out_f);
    }
    return {dx, dw, db};
  }
  // x is unpacked only for dW: a split backward's input pass (autograd/engine.h) does not
  // need it, and a saved-tensor hook may rebuild it at a cost (sequence parallelism re-gathers it).
  const Tensor wv = s.w.unpack(n);
  const Tensor dy = detail::contiguous_raw(g[0]);
  dispatch(dy.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
      const T* pdy = static_cast<const T*>(dy.raw_data());
      if (needs_grad(n, 0)) {  // dx = dy W            [M, out] @ [out, in]
        dx = empty(n.input_meta[0].sizes, TensorOptions(dy.dtype()));
        detail::input_grad_gemm<T>(M, in, out_f, pdy, wv, static_cast<T*>(dx.raw_data()));
      }
      if (needs_grad(n, 1)) {  // dW = dy^T x          [out, M] @ [M, in]
        const Tensor xv = s.x.unpack(n);
        dw = empty(wv.sizes(), TensorOptions(dy.dtype()));
        gemm_t<T>(true, false, out_f, in, M, pdy, out_f, static_cast<const T*>(xv.raw_data()), in, 0.0f,
                  static_cast<T*>(dw.raw_data()), in);
      }
      if (needs_grad(n, 2)) {  // db = sum over rows of dy
        db = empty({out_f}, TensorOptions(dy.dtype()));
        cpu::sum_3d<T>(pdy, static_cast<T*>(db.raw_data()), 1, M, out_f);
      }
    }
  });
  return {dx, dw, db};
}

std::vector<Tensor> linear_reference(OpCall& c) {  // x W^T + b row by row, cpu::ref::gemm in double
  const Tensor x = detail::ref64(c.in(0)).contiguous(), w = detail::ref64(c.in(1)).contiguous();
  const int64_t in = w.size(1), out_f = w.size(0), M = x.numel() / std::max<int64_t>(in, 1);
  Shape out = x.sizes();
  out.back() = out_f;
  Tensor y = zeros(out, TensorOptions(DType::f64));
  if (c.in(2).defined()) copy_into(y, detail::ref64(c.in(2)));  // broadcast over rows
  cpu::ref::gemm<double>(false, true, M, out_f, in, 1.0, x.data_ptr<double>(), in, w.data_ptr<double>(), in, 1.0,
                         y.data_ptr<double>(), out_f);
  return {y};
}
}  // namespace

namespace detail {
// Shared with gelu_linear and linear_relu: x [M, in] (2-D, 3-D, 1-D, strided) with and
// without a bias.
std::vector<OpCase> linear_like_cases(int scale, Tensor (*fn)(const Tensor&, const Tensor&, const Tensor&)) {
  const int64_t s = scale;
  const ApiCall call = [fn](const Inputs& t) { return Inputs{fn(t[0], t[1], t[2])}; };
  return {
      make_case("x [5, 6], W [4, 6], b [4]", {case_randn({5 * s, 6}, 1), case_randn({4, 6}, 2), case_randn({4}, 3)}, call),
      make_case("x [2, 3, 6], W [4, 6] transposed, no bias",
                {case_randn({2 * s, 3, 6}, 4), case_randn({4, 6}, 5, CaseLayout::transposed), case_none()}, call),
      make_case("x [6] (1-D), W [3, 6], b [3]", {case_randn({6}, 6), case_randn({3, 6}, 7), case_randn({3}, 8)}, call),
      make_case("x [4, 6] strided, W [5, 6], b [5] strided",
                {case_randn({4 * s, 6}, 9, CaseLayout::strided), case_randn({5, 6}, 10), case_randn({5}, 11, CaseLayout::strided)}, call),
  };
}
}  // namespace detail

namespace ops {
const OpDef& matmul_op() {
  static const OpDef d{.name = "matmul", .inputs = {"a", "b"}, .category = AutocastCategory::lower_precision,
                       .kernels = detail::cpu_kernels(matmul_cpu, matmul_backward), .reference = matmul_reference,
                       .dtypes = detail::kFloatDTypes, .cases = matmul_cases,
                       .derivative = "dA = dC B^T, dB = A^T dC", .file = "src/ops/linalg.cpp"};
  return d;
}
const OpDef& linear_op() {
  static const OpDef d{.name = "linear", .inputs = {"x", "weight", "bias"}, .category = AutocastCategory::lower_precision,
                       .f32_master = 0b110u, .kernels = detail::cpu_kernels(linear_cpu, linear_backward),
                       .reference = linear_reference, .dtypes = detail::kFloatDTypes,
                       .cases = [](int s) { return detail::linear_like_cases(s, linear); },
                       .derivative = "dx = dy W, dW = dy^T x, db = rowsum(dy)", .file = "src/ops/linalg.cpp"};
  return d;
}
}  // namespace ops

Tensor matmul(const Tensor& a, const Tensor& b) { return call_op(ops::matmul_op(), {a, b}); }
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) { return call_op(ops::linear_op(), {x, weight, bias}); }

}  // namespace athanor
