#include "ops/op_utils.h"

#include <algorithm>

#include "backend/cpu/weight_packing.h"
#include "ops/packed_weights.h"

namespace athanor::detail {

int64_t wrap_dim(int64_t d, int64_t ndim, const char* op) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  ATH_CHECK(d >= -n && d < n, op, "dimension ", d, " is out of range for a ", ndim, "-D tensor (valid: ", -n, " to ", n - 1, ")");
  return d < 0 ? d + n : d;
}

std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t i = 0; i < ndim; ++i) out.push_back(i);
    return out;
  }
  for (int64_t d : dims) out.push_back(wrap_dim(d, ndim, op));
  if (ndim == 0) return {};  // a 0-d tensor accepts dim 0/-1, which reduces over nothing
  std::sort(out.begin(), out.end());
  ATH_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), op, "a dimension appears twice in the dims list");
  return out;
}

Shape reduced_shape(const Shape& in, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t i = 0; i < static_cast<int64_t>(in.size()); ++i) {
    const bool reduced = std::find(dims.begin(), dims.end(), i) != dims.end();
    if (!reduced) out.push_back(in[i]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

ReduceLayout reduce_layout(const Tensor& x, const std::vector<int64_t>& dims) {
  ReduceLayout l{x};
  const bool block = !dims.empty() && dims.back() - dims.front() + 1 == static_cast<int64_t>(dims.size());
  if (block && x.is_contiguous()) {
    for (int64_t i = 0; i < dims.front(); ++i) l.outer *= x.sizes()[i];
    for (int64_t d : dims) l.r *= x.sizes()[d];
    for (int64_t i = dims.back() + 1; i < x.dim(); ++i) l.inner *= x.sizes()[i];
    return l;
  }
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < x.dim(); ++i)
    if (std::find(dims.begin(), dims.end(), i) == dims.end()) perm.push_back(i), l.outer *= x.sizes()[i];
  for (int64_t d : dims) perm.push_back(d), l.r *= x.sizes()[d];
  Shape sz, st;
  for (int64_t p : perm) sz.push_back(x.sizes()[p]), st.push_back(x.strides()[p]);
  l.src = contiguous_raw(make_view(x, sz, st, x.storage_offset()));
  return l;
}

InputGrad norm_input_grad(const Node& n, const Shape& sizes, TensorOptions opts, bool take) {
  if (!needs_grad(n, 0)) return {};
  if (take)
    if (Tensor pending = n.take_pending_grad(0); pending.defined()) {
      ATH_CHECK(pending.device() == opts.device && pending.is_contiguous() && pending.sizes() == sizes, n.name(),
                "the gradient waiting at x is ", pending.describe(), " for x of shape ", shape_str(sizes),
                Hint{"this is a bug in athanor (take_pending_grad promises x's shape, dtype and a contiguous tensor); "
                     "please report it"});
      return {std::move(pending), true};
    }
  return {empty(sizes, opts), false};
}

void check_normalized_shape(const Tensor& x, const Shape& normalized_shape, const char* op) {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  bool match = k >= 1 && k <= x.dim();
  for (int64_t i = 0; match && i < k; ++i) match = x.size(x.dim() - k + i) == normalized_shape[i];
  ATH_CHECK(match, op, "normalized_shape ", shape_str(normalized_shape), " does not match the trailing dims of input ",
            x.describe(),
            Hint{"normalized_shape must equal the last dims of the input (e.g. {" +
                 std::to_string(x.dim() > 0 ? x.size(-1) : 0) + "} to normalize over the last dim)"});
}

void check_defined(const Tensor& t, const char* op, const char* arg) {
  ATH_CHECK(t.defined(), op, "argument '", arg, "' is an undefined tensor");
}

bool dense_rows_layout(const Tensor& t) {
  if (t.numel() == 0 || (t.size(3) > 1 && t.stride(3) != 1)) return false;
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < 3; ++i)
    if (t.size(i) > 1) dims.push_back(i);
  std::sort(dims.begin(), dims.end(), [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  int64_t expect = t.size(3);
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
    if (t.stride(*it) != expect) return false;
    expect *= t.size(*it);
  }
  return true;
}

void check_mse_args(const Tensor& input, const Tensor& target, const char* op) {
  check_floating(input, op, "input");
  check_floating(target, op, "target");
  ATH_CHECK(input.sizes() == target.sizes(), op, "input ", input.describe(), " and target ", target.describe(),
            " must have the same shape",
            Hint{"mse_loss does not broadcast; reshape the target to the input's shape (e.g. unsqueeze a size-1 dim)"});
  check_same_dtype(input, target, op);
}

std::pair<int64_t, int64_t> check_cross_entropy_args(const Tensor& logits, const Tensor& target, double label_smoothing,
                                                     const char* op) {
  check_floating(logits, op, "logits");
  check_defined(target, op, "target");
  ATH_CHECK(logits.dim() == 1 || logits.dim() == 2, op, "logits must be [N, C] or [C], got ", logits.describe(),
            Hint{"flatten extra dims first, e.g. logits.reshape({-1, C}) with target.reshape({-1})"});
  ATH_CHECK(target.dtype() == DType::i64 || target.dtype() == DType::i32, op,
            "target must hold integer class ids (i64 or i32), got ", target.describe(),
            Hint{"class-probability targets are not supported; pass class indices, converted with .to(DType::i64)"});
  const bool batched = logits.dim() == 2;
  const int64_t N = batched ? logits.size(0) : 1, C = logits.size(-1);
  const Shape want = batched ? Shape{N} : Shape{};
  ATH_CHECK(target.sizes() == want, op, "target shape ", shape_str(target.sizes()), " does not match logits ",
            logits.describe(), ": expected target ", shape_str(want),
            Hint{"target needs one class id per row of logits (shape [N] for logits [N, C], [] for logits [C])"});
  ATH_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op, "label_smoothing must be in [0, 1], got ",
            label_smoothing);
  return {N, C};
}

void check_floating(const Tensor& t, const char* op, const char* arg) {
  check_defined(t, op, arg);
  ATH_CHECK(is_floating(t.dtype()), op, "argument '", arg, "' must be floating-point, got ", t.describe(),
            Hint{"convert it with .to(DType::f32)"});
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  ATH_CHECK(a.dtype() == b.dtype(), op, "dtype mismatch: ", a.describe(), " and ", b.describe(),
            Hint{"convert one operand with .to(...) so both have the same dtype (or run under autocast)"});
}

void check_linear_args(const Tensor& x, const Tensor& weight, const Tensor& bias, const char* op, const char* hint) {
  check_floating(x, op, "x");
  check_floating(weight, op, "weight");
  check_same_dtype(x, weight, op);
  ATH_CHECK(weight.dim() == 2, op, "weight must be 2-D [out_features, in_features], got ", weight.describe());
  ATH_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), op, "input ", x.describe(), " does not match weight ",
            weight.describe(), ": last input dim must be in_features = ", weight.size(1), Hint{hint});
  if (bias.defined()) {
    check_same_dtype(x, bias, op);
    ATH_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), op, "bias ", bias.describe(),
              " must be 1-D of size out_features = ", weight.size(0));
  }
}

template <class T>
void linear_gemm_w(int64_t M, int64_t out, int64_t in, const T* x, const Tensor& weight, const T* bias, T* y) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bfloat16>) {
    if (cpu::gemm_prefers_packed_b(std::is_same_v<T, bfloat16>, true, M, out, in))
      if (const PackedWeight p = packed_weight(weight, WeightUse::forward))
        if (cpu::gemm_packed<T>(M, x, in, p.layout, static_cast<const T*>(p.data), bias, y, out)) return;
  }
  linear_gemm_t<T>(M, out, in, x, static_cast<const T*>(weight.raw_data()), bias, y);
}
template void linear_gemm_w<float>(int64_t, int64_t, int64_t, const float*, const Tensor&, const float*, float*);
template void linear_gemm_w<double>(int64_t, int64_t, int64_t, const double*, const Tensor&, const double*, double*);
template void linear_gemm_w<bfloat16>(int64_t, int64_t, int64_t, const bfloat16*, const Tensor&, const bfloat16*, bfloat16*);
template void linear_gemm_w<float16>(int64_t, int64_t, int64_t, const float16*, const Tensor&, const float16*, float16*);

PackedWeight input_grad_packed(const Tensor& weight, int64_t M, int64_t in, int64_t out) {
  if (!cpu::gemm_prefers_packed_b(weight.dtype() == DType::bf16, false, M, in, out)) return {};
  return packed_weight(weight, WeightUse::input_grad);
}

template <class T> void input_grad_gemm(int64_t M, int64_t in, int64_t out, const T* dy, const Tensor& weight, T* dx) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bfloat16>) {
    if (const PackedWeight p = input_grad_packed(weight, M, in, out))
      if (cpu::gemm_packed<T>(M, dy, out, p.layout, static_cast<const T*>(p.data), nullptr, dx, in)) return;
  }
  gemm_t<T>(false, false, M, in, out, dy, out, static_cast<const T*>(weight.raw_data()), in, 0.0f, dx, in);
}
template void input_grad_gemm<float>(int64_t, int64_t, int64_t, const float*, const Tensor&, float*);
template void input_grad_gemm<double>(int64_t, int64_t, int64_t, const double*, const Tensor&, double*);
template void input_grad_gemm<bfloat16>(int64_t, int64_t, int64_t, const bfloat16*, const Tensor&, bfloat16*);
template void input_grad_gemm<float16>(int64_t, int64_t, int64_t, const float16*, const Tensor&, float16*);

void lowp_linear_backward_gemms(const Node& n, const bfloat16* g, const SavedTensor& x, const SavedTensor& w, int64_t M,
                                int64_t in, int64_t out_f, Tensor& dx, Tensor& dw) {
  if (needs_grad(n, 0)) {  // dx = g W     [M, out] @ [out, in], bf16 like x
    const Tensor wv = w.unpack(n);  // x is not unpacked: see linear's backward
    dx = empty(n.input_meta[0].sizes, TensorOptions(DType::bf16));
    input_grad_gemm<bfloat16>(M, in, out_f, g, wv, static_cast<bfloat16*>(dx.raw_data()));
  }
  if (needs_grad(n, 1)) {  // dW = g^T x   [out, M] @ [M, in], f32 out of the f32 accumulators
    const Tensor xv = x.unpack(n);
    dw = empty({out_f, in}, TensorOptions(DType::f32));
    cpu::gemm_bf16_f32out(true, false, out_f, in, M, 1.0f, g, out_f, static_cast<const bfloat16*>(xv.raw_data()), in, 0.0f,
                          static_cast<float*>(dw.raw_data()), in);
  }
}

template <class T> void transpose_2d(const T* src, int64_t rows, int64_t cols, T* dst) {
  constexpr int64_t kTile = 32;
  const int64_t rt = (rows + kTile - 1) / kTile, ct = (cols + kTile - 1) / kTile;
#pragma omp parallel for collapse(2) schedule(static) if (rows * cols > (1 << 15))
  for (int64_t bi = 0; bi < rt; ++bi)
    for (int64_t bj = 0; bj < ct; ++bj) {
      const int64_t r1 = std::min(rows, (bi + 1) * kTile), c1 = std::min(cols, (bj + 1) * kTile);
      for (int64_t c = bj * kTile; c < c1; ++c)
        for (int64_t r = bi * kTile; r < r1; ++r) dst[c * rows + r] = src[r * cols + c];
    }
}
template void transpose_2d<float>(const float*, int64_t, int64_t, float*);
template void transpose_2d<double>(const double*, int64_t, int64_t, double*);
template void transpose_2d<bfloat16>(const bfloat16*, int64_t, int64_t, bfloat16*);
template void transpose_2d<float16>(const float16*, int64_t, int64_t, float16*);

Tensor contiguous_raw(const Tensor& x) {
  if (x.is_contiguous()) return x;
  Tensor c = empty(x.sizes(), TensorOptions(x.dtype()).with_device(x.device()));
  copy_into(c, x);
  return c;
}

Tensor to_raw(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return contiguous_raw(x);
  Tensor c = empty(x.sizes(), TensorOptions(dtype).with_device(x.device()));
  copy_into(c, x);
  return c;
}

}  // namespace athanor::detail
