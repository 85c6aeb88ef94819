#include "backend/cuda/gemm.h"

#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "athanor/core/error.h"
#include "backend/cuda/device_allocator.h"
#include "backend/cuda/runtime.h"

namespace athanor::cuda {

namespace {
constexpr std::size_t kWorkspace = std::size_t{32} << 20;

using PlanKey = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int, int64_t, int64_t, int64_t, int64_t, bool, bool, bool,
                           uint32_t, int64_t, uint32_t>;

// The alignment in bytes (a power of two, at most 256) of a pointer: the heuristic assumes
// 256-byte operands unless told, and a kernel chosen for that faults on a view that starts
// mid-block (a slice, a group's rows of a weight).
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}

struct Context {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::mutex mu;
  std::map<PlanKey, std::optional<cublasLtMatmulAlgo_t>> plans;  // nullopt: no algorithm (an epilogue declined)
};

Context& context(int device) {
  static std::array<Context*, 64> all{};
  static std::mutex mu;
  std::lock_guard<std::mutex> l(mu);
  Context*& c = all.at(static_cast<std::size_t>(device));
  if (!c) {
    DeviceGuard g(device);
    auto* nc = new Context;  // never destroyed: the handle outlives static destructors
    ATH_CUBLAS(cublasLtCreate(&nc->handle));
    nc->workspace = DeviceAllocator::get(device).allocate(kWorkspace, MemTag::workspace);
    c = nc;
  }
  return *c;
}

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    case DType::f64: return CUDA_R_64F;
    default: return CUDA_R_32F;
  }
}

// RAII for the descriptors of one call.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void layout(cublasLtMatrixLayout_t* l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
            int64_t stride) {
  ATH_CUBLAS(cublasLtMatrixLayoutCreate(l, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    const int32_t bc = static_cast<int32_t>(batch);
    ATH_CUBLAS(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
    ATH_CUBLAS(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
}

// The GEMM, or false before any launch when `may_decline` and cuBLASLt has no algorithm.
bool run_gemm(const GemmArgs& g, int device, cudaStream_t stream, bool may_decline) {
  ATH_CHECK(g.dtype == DType::f32 || g.dtype == DType::bf16 || g.dtype == DType::f16 || g.dtype == DType::f64, "cuda gemm",
            "dtype ", dtype_name(g.dtype), " is not supported", Hint{"use f32, bf16, f16 or f64"});
  // f64 takes no epilogue: cuBLASLt documents its epilogues for the 16/32-bit types, and the
  // f64 path is the exact reference (gradchecks), not a fast one; a bias is added by the
  // caller through beta = 1 over C pre-filled with it (device_ops.h: cuda_gemm).
  const bool f64 = g.dtype == DType::f64;
  ATH_CHECK(!f64 || g.epilogue == GemmEpilogue::none || may_decline, "cuda gemm", "f64 GEMMs take no epilogue (asked for ",
            static_cast<int>(g.epilogue), ")", Hint{"add the bias through beta = 1 over C filled with it (cuda_gemm does)"});
  if (f64 && g.epilogue != GemmEpilogue::none) return false;  // try_gemm: the caller's unfused path
  ATH_CHECK(!f64 || !g.allow_tf32, "cuda gemm", "allow_tf32 with f64 operands", Hint{"TF32 is for f32 data"});
  ATH_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 1, "cuda gemm", "bad sizes m=", g.m, " n=", g.n, " k=", g.k,
            " batch=", g.batch, Hint{"sizes must be non-negative and batch at least 1"});
  const bool has_bias =
      g.epilogue == GemmEpilogue::bias || g.epilogue == GemmEpilogue::bias_gelu || g.epilogue == GemmEpilogue::bias_relu;
  ATH_CHECK(!g.c_f32 || g.dtype == DType::bf16 || g.dtype == DType::f16, "cuda gemm", "c_f32 is for 16-bit operands (dtype ",
            dtype_name(g.dtype), ")");
  ATH_CHECK(!has_bias || g.bias, "cuda gemm", "a bias epilogue needs a bias pointer",
            Hint{"pass the bias, or use GemmEpilogue::none / gelu"});
  const bool backward_epi = g.epilogue == GemmEpilogue::dgelu || g.epilogue == GemmEpilogue::bias_grad;
  if (backward_epi) {
    ATH_CHECK(g.batch == 1 && g.beta == 0.0f, "cuda gemm", "the dgelu and bias_grad epilogues take batch 1 and beta 0 (batch ",
              g.batch, ", beta ", g.beta, ")");
    ATH_CHECK(g.epilogue != GemmEpilogue::bias_grad || g.bias, "cuda gemm", "bias_grad needs the bias pointer it writes");
    ATH_CHECK(g.epilogue != GemmEpilogue::dgelu || (g.aux && g.aux_ld >= g.n), "cuda gemm",
              "dgelu needs the GELU input (aux) with a row stride >= n (aux_ld ", g.aux_ld, ", n ", g.n, ")");
    // cuBLASLt's GELU input leading dimension must be a multiple of 8, and an empty product
    // leaves the bias gradient unwritten: decline, not fail (the unfused path handles both).
    if ((g.epilogue == GemmEpilogue::dgelu && g.aux_ld % 8 != 0) || g.m == 0 || g.n == 0 || g.k == 0) {
      ATH_CHECK(may_decline, "cuda gemm", "the ", g.epilogue == GemmEpilogue::dgelu ? "dgelu" : "bias_grad",
                " epilogue needs m, n, k > 0 (and dgelu an aux_ld that is a multiple of 8): m=", g.m, " n=", g.n, " k=", g.k,
                " aux_ld=", g.aux_ld, Hint{"call try_gemm and take the unfused path when it declines"});
      return false;
    }
  }
  if (g.m == 0 || g.n == 0) return true;
  Context& ctx = context(device);
  DeviceGuard dg(device);
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt sees B first.
  const cudaDataType_t t = cuda_type(g.dtype), ct = g.c_f32 ? CUDA_R_32F : t;
  const cublasComputeType_t compute = f64                    ? CUBLAS_COMPUTE_64F
                                      : g.dtype == DType::f32 ? (g.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F)
                                                              : CUBLAS_COMPUTE_32F;
  Descs d;
  // The scale type (alpha, beta) is the compute type's: f64 for f64 data, else f32.
  ATH_CUBLAS(cublasLtMatmulDescCreate(&d.op, compute, f64 ? CUDA_R_64F : CUDA_R_32F));
  const cublasOperation_t opb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, opa = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  ATH_CUBLAS(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb));
  ATH_CUBLAS(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa));
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  switch (g.epilogue) {
    case GemmEpilogue::none: break;
    case GemmEpilogue::bias: epi = CUBLASLT_EPILOGUE_BIAS; break;
    case GemmEpilogue::gelu: epi = CUBLASLT_EPILOGUE_GELU; break;
    case GemmEpilogue::bias_gelu: epi = CUBLASLT_EPILOGUE_GELU_BIAS; break;
    case GemmEpilogue::relu: epi = CUBLASLT_EPILOGUE_RELU; break;
    case GemmEpilogue::bias_relu: epi = CUBLASLT_EPILOGUE_RELU_BIAS; break;
    // cuBLASLt's D is our C transposed (column-major [n, m]); its B is our A (see below), so
    // the sum over k of op(A)'s rows is its BGRADB (one value per column of its D), and the
    // GELU input has D's layout: leading dimension aux_ld.
    case GemmEpilogue::dgelu: epi = CUBLASLT_EPILOGUE_DGELU; break;
    case GemmEpilogue::bias_grad: epi = CUBLASLT_EPILOGUE_BGRADB; break;
  }
  ATH_CUBLAS(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (has_bias || g.epilogue == GemmEpilogue::bias_grad) {
    ATH_CUBLAS(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
    ATH_CUBLAS(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ct, sizeof ct));
  }
  if (g.epilogue == GemmEpilogue::dgelu) {
    ATH_CUBLAS(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux));
    ATH_CUBLAS(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g.aux_ld, sizeof g.aux_ld));
    // The aux data type is left at its default: the GELU input in C's dtype (cublasLt.h).
  }
  // Column-major views: B^T is [n, k] stored as B's row-major [k, n] (or [n, k] when trans_b).
  layout(&d.a, t, g.trans_b ? g.k : g.n, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.batch, g.stride_b);
  layout(&d.b, t, g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.batch, g.stride_a);
  layout(&d.c, ct, g.n, g.m, g.n, g.batch, g.stride_c);

  const PlanKey key{static_cast<int>(g.dtype), g.trans_a, g.trans_b, g.m, g.n, g.k, static_cast<int>(g.epilogue),
                    g.batch, g.stride_a, g.stride_b, g.stride_c, g.allow_tf32, g.beta != 0.0f, g.c_f32,
                    // the operands' alignments, packed: A, B, C, bias (each a power of two <= 256)
                    static_cast<uint32_t>(std::countr_zero(alignment_of(g.a)) | std::countr_zero(alignment_of(g.b)) << 8 |
                                          std::countr_zero(alignment_of(g.c)) << 16 |
                                          std::countr_zero(alignment_of(g.bias ? g.bias : g.c)) << 24),
                    g.aux_ld, static_cast<uint32_t>(std::countr_zero(alignment_of(g.aux ? g.aux : g.c)))};
  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> l(ctx.mu);
    auto it = ctx.plans.find(key);
    if (it != ctx.plans.end()) {
      if (!it->second) {
        ATH_CHECK(may_decline, "cuda gemm", "cuBLASLt has no algorithm for this epilogue at m=", g.m, " n=", g.n, " k=", g.k);
        return false;
      }
      algo = *it->second;
    } else {
      ATH_CUBLAS(cublasLtMatmulPreferenceCreate(&d.pref));
      ATH_CUBLAS(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace,
                                                      sizeof kWorkspace));
      // cuBLASLt's A is our B (row-major C = A B is column-major C^T = B^T A^T).
      const uint32_t al_a = alignment_of(g.b), al_b = alignment_of(g.a), al_c = alignment_of(g.c);
      ATH_CUBLAS(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
      ATH_CUBLAS(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
      ATH_CUBLAS(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
      ATH_CUBLAS(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
      cublasLtMatmulHeuristicResult_t h{};
      int found = 0;
      const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &h, &found);
      // An epilogue cuBLASLt does not offer for these types or this shape is "not supported",
      // "invalid value" (a type combination it refuses) or no algorithm found: the fused path
      // declines and the caller runs the unfused one.
      if (may_decline && (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE ||
                          (st == CUBLAS_STATUS_SUCCESS && found == 0))) {
        ctx.plans.emplace(key, std::nullopt);
        return false;
      }
      ATH_CUBLAS(st);
      ATH_CHECK(found > 0, "cuda gemm", "cuBLASLt found no algorithm for m=", g.m, " n=", g.n, " k=", g.k, " ",
                dtype_name(g.dtype), Hint{"pad the inner dimensions to multiples of 8 (16 bytes) for bf16/f16"});
      algo = h.algo;
      ctx.plans.emplace(key, algo);
    }
  }
  const double alpha64 = g.alpha, beta64 = g.beta;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &g.alpha;
  const void* beta = f64 ? static_cast<const void*>(&beta64) : &g.beta;
  ATH_CUBLAS(cublasLtMatmul(ctx.handle, d.op, alpha, g.b, d.a, g.a, d.b, beta, g.c, d.c, g.c, d.c, &algo, ctx.workspace,
                            kWorkspace, stream));
  return true;
}

std::atomic<bool>& fused_epilogues_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("ATHANOR_CUDA_FUSED_EPILOGUES");
    return !(v && std::strcmp(v, "0") == 0);
  }()};
  return on;
}
}  // namespace

void gemm(const GemmArgs& g, int device, cudaStream_t stream) { run_gemm(g, device, stream, false); }
bool try_gemm(const GemmArgs& g, int device, cudaStream_t stream) { return run_gemm(g, device, stream, true); }
bool fused_epilogues_enabled() { return fused_epilogues_flag().load(std::memory_order_relaxed); }
void set_fused_epilogues(bool on) { fused_epilogues_flag().store(on, std::memory_order_relaxed); }

std::size_t gemm_cached_plans(int device) {
  Context& ctx = context(device);
  std::lock_guard<std::mutex> l(ctx.mu);
  return ctx.plans.size();
}

}  // namespace athanor::cuda
