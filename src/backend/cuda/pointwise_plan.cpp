// The host side of pointwise.h: the checks given before any work and the choice of kernel.
// Plain C++ (no kernel here), so tests/gpu/test_gpu_pointwise.cpp runs it without a GPU.
#include <cstdint>

#include "athanor/core/error.h"
#include "backend/cuda/pointwise.h"

namespace athanor::cuda {

namespace {
bool supported(DType d) { return d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16; }
bool lowp_or_f32(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }

constexpr uintptr_t kAlign = 16;  // bytes of one vector load or store

// The head length h in [0, kPointwiseVector) with (p_k + h size_k) % 16 == 0 for every
// pointer, or -1 when there is none (or a pointer is not aligned to its own element).
int64_t common_head(const void* const* ptrs, const std::size_t* sizes, int count) {
  for (int k = 0; k < count; ++k)
    if (reinterpret_cast<uintptr_t>(ptrs[k]) % sizes[k] != 0) return -1;
  for (int64_t h = 0; h < kPointwiseVector; ++h) {
    bool all = true;
    for (int k = 0; k < count && all; ++k)
      all = (reinterpret_cast<uintptr_t>(ptrs[k]) + static_cast<uintptr_t>(h) * sizes[k]) % kAlign == 0;
    if (all) return h;
  }
  return -1;
}

// Which instantiation of the vectorized kernel has these dtypes (pointwise.h), or generic.
PointwiseKernel vector_form(const PointwiseArgs& a) {
  const DType t0 = a.in[0].dtype, t1 = a.n_in > 1 ? a.in[1].dtype : t0, out = a.out_dtype;
  if (!lowp_or_f32(t0) || !lowp_or_f32(t1) || !lowp_or_f32(out)) return PointwiseKernel::generic;
  if (a.n_in == 3 && a.in[2].dtype != t1) return PointwiseKernel::generic;
  if (t0 == t1 && t1 == out) return PointwiseKernel::vectorized;
  if (a.op == PointwiseOp::copy) return PointwiseKernel::vectorized_cast;  // t0 != out
  if (t0 != t1 && out == DType::f32 && (t0 == DType::f32 || t1 == DType::f32)) return PointwiseKernel::vectorized_mixed;
  return PointwiseKernel::generic;
}
}  // namespace

int pointwise_arity(PointwiseOp op) {
  switch (op) {
    case PointwiseOp::copy:
    case PointwiseOp::scale:
    case PointwiseOp::relu:
    case PointwiseOp::gelu_tanh:
    case PointwiseOp::gelu_erf:
    case PointwiseOp::dropout:
    case PointwiseOp::rsqrt_add:
    case PointwiseOp::tanh:
    case PointwiseOp::sigmoid:
    case PointwiseOp::silu: return 1;
    case PointwiseOp::silu_mul_grad_gate:
    case PointwiseOp::silu_mul_grad_up: return 3;
    default: return 2;
  }
}

void check_pointwise(const PointwiseArgs& a) {
  ATH_CHECK(a.ndim >= 0 && a.ndim <= kMaxIndexDims, "cuda pointwise", a.ndim, " dims (at most ", kMaxIndexDims, ")",
            Hint{"reshape to fewer dims first"});
  ATH_CHECK(a.n_in == pointwise_arity(a.op), "cuda pointwise", "op ", static_cast<int>(a.op), " reads ",
            pointwise_arity(a.op), " inputs, given ", a.n_in);
  for (int k = 0; k < a.n_in; ++k)
    ATH_CHECK(supported(a.in[k].dtype), "cuda pointwise", "input ", k, " is ", dtype_name(a.in[k].dtype),
              Hint{"the CUDA pointwise kernel takes f32, f64, bf16 and f16"});
  ATH_CHECK(supported(a.out_dtype), "cuda pointwise", "output dtype ", dtype_name(a.out_dtype),
            Hint{"the CUDA pointwise kernel writes f32, f64, bf16 and f16"});
  for (int d = 0; d < a.ndim; ++d)
    ATH_CHECK(a.sizes[d] >= 0, "cuda pointwise", "size ", a.sizes[d], " of dim ", d, Hint{"sizes are >= 0"});
}

PointwisePlan plan_pointwise(const PointwiseArgs& a, bool vectorize) {
  check_pointwise(a);
  PointwisePlan p;
  p.n = 1;
  for (int d = 0; d < a.ndim; ++d) p.n *= a.sizes[d];
  bool f64 = a.out_dtype == DType::f64;
  for (int k = 0; k < a.n_in; ++k) f64 = f64 || a.in[k].dtype == DType::f64;
  if (f64) {
    p.kernel = PointwiseKernel::generic_f64;
    return p;
  }
  p.kernel = PointwiseKernel::generic;
  if (!vectorize || p.n == 0) return p;
  const PointwiseKernel form = vector_form(a);
  if (form == PointwiseKernel::generic) return p;
  const void* ptrs[4];
  std::size_t sizes[4];
  for (int k = 0; k < a.n_in; ++k) {
    if (!a.in[k].contiguous) return p;
    ptrs[k] = a.in[k].data, sizes[k] = dtype_size(a.in[k].dtype);
  }
  ptrs[a.n_in] = a.out, sizes[a.n_in] = dtype_size(a.out_dtype);
  const int64_t head = common_head(ptrs, sizes, a.n_in + 1);
  if (head < 0) return p;
  p.kernel = form;
  p.head = head < p.n ? head : p.n;
  p.vectors = (p.n - p.head) / kPointwiseVector;
  return p;
}

unsigned pointwise_vector_blocks(int64_t vectors, int sm_count) {
  constexpr int64_t kThreads = 256, kBlocksPerSm = 8;
  const int64_t want = (vectors + kThreads - 1) / kThreads;
  const int64_t most = (sm_count > 0 ? sm_count : 1) * kBlocksPerSm;
  return static_cast<unsigned>(want < 1 ? 1 : want < most ? want : most);
}

bool row_major_strides(int ndim, const int64_t* sizes, const int64_t* strides) {
  int64_t expect = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expect) return false;
    expect *= sizes[d];
  }
  return true;
}

}  // namespace athanor::cuda
