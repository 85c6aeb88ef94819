// GEMM dispatch (see gemm.h). f32 and bf16 run on cached oneDNN matmul primitives;
// tiny f32 GEMMs (under kMinPrimitiveWork multiply-adds) on dnnl_sgemm, f64 on OpenBLAS.
// f32 GEMMs with one dimension <= 16 (a classifier head's linear) go first to narrow_gemm
// (narrow_gemm.h): oneDNN blocks for square-ish shapes and runs these far below its peak.
//
// Why primitives rather than dnnl_sgemm for f32 (issue 7; figures in bench/RESULTS.md):
//  - dnnl_sgemm parallelises a small-M x W^T (linear's forward, M = 128) badly: on 2
//    threads it spends up to twice the CPU time of 1 thread. The backward layouts (NN,
//    TN) parallelise well on both.
//  - dnnl_sgemm mallocs its packing buffers on every call, from whichever thread runs
//    it (also from inside our parallel regions: the attention tiles). With two threads
//    the order of those mallocs and frees varies from step to step and glibc's heap
//    top kept creeping into fresh pages: minor faults in every warm GPT step. A
//    primitive takes its scratchpad from us (scratchpad_mode::user): a per-thread
//    buffer, allocated once.
//  - A primitive adds the bias in its epilogue (gemm_bias: linear's forward), instead
//    of a prefill of C and beta = 1.
// Single-thread CPU time per call is the same within noise, so the primitive costs
// nothing on small tiles either.
#include "backend/cpu/gemm.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "athanor/core/convert.h"
#include "athanor/core/error.h"
#include "backend/cpu/narrow_gemm.h"
#include "backend/cpu/small_batch_gemm.h"
#include "backend/cpu/weight_packing.h"
#include "backend/cpu/workspace.h"

namespace athanor::cpu {

namespace {

using dt = dnnl::memory::data_type;

// M*N*K below which an f32 GEMM goes to sgemm (16^3: gradcheck-sized products, which
// would only fill the cache).
constexpr int64_t kMinPrimitiveWork = int64_t{16} * 16 * 16;
// Shapes beyond this many primitives run on the fallback path instead of growing the
// cache (generation with a growing sequence length would otherwise create one per token).
constexpr std::size_t kMaxCachedPrimitives = 512;

// Everything that defines a primitive: dtypes (inputs, output, bias or undef), transposes,
// sizes, leading dimensions, alpha, beta.
using MatmulKey = std::tuple<dt, dt, dt, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float>;

struct CachedMatmul {
  dnnl::matmul prim;
  std::size_t scratchpad_bytes = 0;
  dnnl::memory::desc scratchpad_md;
  bool uncached = false;  // made for one call because the cache was full
};

struct DnnlState {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mu;
  std::map<MatmulKey, std::optional<CachedMatmul>> cache;  // nullopt: oneDNN has no matmul for this key
};
DnnlState& dnnl_state() {
  static DnnlState s;
  return s;
}

// The scratchpad of this thread's primitive calls: grown on demand and kept for the
// thread's life (the training thread and the OpenMP workers live as long as the
// process), so warm calls allocate nothing, and no call competes with tensors for the
// Allocator's blocks. Plain aligned_alloc: it is called inside parallel regions too
// (attention tiles), where nothing may throw; null makes the caller fall back to sgemm.
// Not tagged: like oneDNN's own scratchpads, a few hundred KiB per thread.
void* thread_scratch(std::size_t bytes) {
  struct Buffer {
    void* p = nullptr;
    std::size_t n = 0;
    ~Buffer() { std::free(p); }
  };
  thread_local Buffer buf;
  if (bytes > buf.n) {
    std::free(buf.p);
    const std::size_t n = (std::max(bytes, 2 * buf.n) + 4095) / 4096 * 4096;
    buf.p = std::aligned_alloc(4096, n);
    buf.n = buf.p ? n : 0;
  }
  return buf.p;
}

template <class T> constexpr dt dnnl_type() {
  if constexpr (std::is_same_v<T, float>) return dt::f32;
  else return dt::bf16;
}

// The descriptors of C = alpha op(A) op(B) (+ bias[N] on every row) + beta C as a oneDNN
// matmul. Transposes are strides of the memory descriptors (no copies); alpha is an output
// scale, beta a sum post-op. `packed`: B is in that blocked layout (weight_packing.h; tb
// and ldb are ignored).
struct MatmulCall {
  dnnl::memory::desc a_md, b_md, c_md, bias_md;
  MatmulKey key;
};
template <class TA, class TC>
MatmulCall matmul_call(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, int64_t lda, int64_t ldb,
                       bool bias, float beta, int64_t ldc, const PackedLayout* packed) {
  const dt in_t = dnnl_type<TA>(), out_t = dnnl_type<TC>(), bias_t = bias ? out_t : dt::undef;
  if (packed) tb = false, ldb = -1;  // the key of a packed B
  MatmulCall c;
  c.a_md = dnnl::memory::desc({M, K}, in_t, ta ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1});
  c.b_md = packed ? dnnl::memory::desc({K, N}, in_t,
                                       in_t == dt::bf16 ? dnnl::memory::format_tag::BA16a64b2a : dnnl::memory::format_tag::BA16a64b)
                  : dnnl::memory::desc({K, N}, in_t, tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
  c.c_md = dnnl::memory::desc({M, N}, out_t, dnnl::memory::dims{ldc, 1});
  if (bias) c.bias_md = dnnl::memory::desc({1, N}, bias_t, dnnl::memory::dims{N, 1});
  c.key = MatmulKey{in_t, out_t, bias_t, ta, tb, M, N, K, lda, ldb, ldc, alpha, beta};
  return c;
}

// The cached primitive for `c`, made on first use; nullopt when oneDNN has no matmul for it
// (or, for a packed B, would not read exactly that layout: any other implementation would
// be slow) or the cache is full and sgemm can take an f32 GEMM instead.
template <class TA>
std::optional<CachedMatmul> find_matmul(const MatmulCall& c) {
  const bool packed = std::get<9>(c.key) == -1;  // matmul_call's key of a packed B
  DnnlState& st = dnnl_state();
  // Each thread keeps the primitives it used (no lock on the hot path: the attention
  // kernels call this from inside their parallel regions); misses go to the shared cache.
  thread_local std::map<MatmulKey, CachedMatmul> local_cache;
  if (auto lit = local_cache.find(c.key); lit != local_cache.end()) return lit->second;
  const float alpha = std::get<11>(c.key), beta = std::get<12>(c.key);
  const bool bias = std::get<2>(c.key) != dt::undef;
  auto create = [&]() -> std::optional<CachedMatmul> {
    try {
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
      if (beta != 0.0f) {
        dnnl::post_ops po;
        po.append_sum(beta);
        attr.set_post_ops(po);
      }
      const dnnl::matmul::desc d =
          bias ? dnnl::matmul::desc(c.a_md, c.b_md, c.bias_md, c.c_md) : dnnl::matmul::desc(c.a_md, c.b_md, c.c_md);
      const dnnl::matmul::primitive_desc pd(d, attr, st.engine);
      if (packed) {
        const dnnl::memory::desc any_md(c.b_md.dims(), c.b_md.data_type(), dnnl::memory::format_tag::any);
        const dnnl::matmul::desc da =
            bias ? dnnl::matmul::desc(c.a_md, any_md, c.bias_md, c.c_md) : dnnl::matmul::desc(c.a_md, any_md, c.c_md);
        if (dnnl::matmul::primitive_desc(da, attr, st.engine).weights_desc() != c.b_md) return std::nullopt;
      }
      return CachedMatmul{dnnl::matmul(pd), pd.scratchpad_desc().get_size(), pd.scratchpad_desc()};
    } catch (const dnnl::error&) {  // no implementation (old ISA, unsupported strides): the fallback path
      return std::nullopt;
    }
  };
  std::optional<CachedMatmul> entry;
  std::lock_guard<std::mutex> lock(st.mu);
  auto it = st.cache.find(c.key);
  if (it != st.cache.end()) {
    entry = it->second;
  } else if (st.cache.size() < kMaxCachedPrimitives) {
    entry = st.cache.emplace(c.key, create()).first->second;
  } else if constexpr (std::is_same_v<TA, float>) {
    return std::nullopt;  // cache full: sgemm is as fast and needs no primitive
  } else {
    entry = create();  // cache full: a one-off primitive beats converting to f32
    if (entry) entry->uncached = true;
  }
  if (entry && !entry->uncached) local_cache.emplace(c.key, *entry);
  return entry;
}

// Runs `m` on the operands; false (nothing run) when this thread's scratchpad cannot grow.
template <class TA, class TC>
bool run_matmul(const CachedMatmul& m, const MatmulCall& c, const TA* A, const TA* B, const TC* bias, TC* C) {
  const dnnl::engine& engine = dnnl_state().engine;
  thread_local dnnl::stream stream(engine);
  void* scratch = nullptr;
  if (m.scratchpad_bytes && !(scratch = thread_scratch(m.scratchpad_bytes))) return false;
  dnnl::memory am(c.a_md, engine, const_cast<TA*>(A)), bm(c.b_md, engine, const_cast<TA*>(B)), cm(c.c_md, engine, C);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(c.bias_md, engine, const_cast<TC*>(bias)));
  if (m.scratchpad_bytes) args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(m.scratchpad_md, engine, scratch));
  m.prim.execute(stream, args);
  stream.wait();
  return true;
}

// C = alpha op(A) op(B) (+ bias) + beta C through a cached oneDNN matmul primitive.
// Returns false when oneDNN has no matmul for this case (the caller takes its fallback path).
template <class TA, class TC>
bool matmul_dnnl(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const TA* A, int64_t lda, const TA* B,
                 int64_t ldb, const TC* bias, float beta, TC* C, int64_t ldc, const PackedLayout* packed = nullptr) {
  const MatmulCall c = matmul_call<TA, TC>(ta, tb, M, N, K, alpha, lda, ldb, bias != nullptr, beta, ldc, packed);
  const std::optional<CachedMatmul> m = find_matmul<TA>(c);
  return m && run_matmul<TA, TC>(*m, c, A, B, bias, C);
}

// A bf16 GEMM whose plain B changes every call (a weight gradient dW = dy^T x: B is an
// activation) packed into oneDNN's blocked layout first, once, by all threads. Given a
// plain B, oneDNN's matmul packs the B blocks each thread needs for each block of rows it
// takes, so with many rows the same B is packed several times over; packing it once pays
// from kMinRowsToPackB rows on (below, the one packing costs more than the repeats it
// saves; bench/RESULTS.md). Returns false, running nothing, where oneDNN would not read
// the packed layout (the caller runs the plain GEMM).
constexpr int64_t kMinRowsToPackB = 512;
template <class TC>
bool matmul_bf16_packing_b(bool ta, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A, int64_t lda,
                           const bfloat16* B, int64_t ldb, float beta, TC* C, int64_t ldc) {
  // Not from inside a parallel region: the workspace may throw, which must not cross OpenMP.
  if (M < kMinRowsToPackB || K < 32 || N < 64 || omp_in_parallel()) return false;
  const PackedLayout l = packed_layout(/*bf16=*/true, K, N);
  const MatmulCall c = matmul_call<bfloat16, TC>(ta, false, M, N, K, alpha, lda, 0, false, beta, ldc, &l);
  const std::optional<CachedMatmul> m = find_matmul<bfloat16>(c);
  if (!m) return false;
  const Workspace packed(static_cast<std::size_t>(l.bytes()));
  // pack_weight writes no padding. oneDNN reads the padding rows (k >= K) into its sums;
  // the padding columns (n >= N) only into outputs it drops, zeroed all the same.
  if (l.Kp != K) std::memset(packed.as<void>(), 0, static_cast<std::size_t>(l.bytes()));
  else if (l.Np != N) std::memset(static_cast<void*>(packed.as<bfloat16>() + (l.Np - 64) * l.Kp), 0, static_cast<std::size_t>(64 * l.Kp) * 2);
  pack_weight(l, /*w_is_bt=*/false, B, ldb, packed.as<void>());
  return run_matmul<bfloat16, TC>(*m, c, A, packed.as<bfloat16>(), nullptr, C);
}

bool use_f32_primitive(int64_t M, int64_t N, int64_t K) { return K > 0 && M * N * K >= kMinPrimitiveWork; }

void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
           int64_t ldb, float beta, float* C, int64_t ldc) {
  const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  ATH_CHECK(st == dnnl_success, "gemm", "oneDNN sgemm failed with status ", static_cast<int>(st), " for M=", M, " N=", N, " K=", K);
}

}  // namespace

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (narrow_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, /*bias=*/nullptr, C, ldc)) return;
  if (small_batch_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, /*bias=*/nullptr, C, ldc)) return;
  if (use_f32_primitive(M, N, K) &&
      matmul_dnnl<float, float>(ta, tb, M, N, K, alpha, A, lda, B, ldb, nullptr, beta, C, ldc))
    return;
  sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_tile(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

namespace {

// f16 (and the bf16 fallback): convert to f32, run the f32 GEMM, convert back.
template <class T, class TC>
void gemm_via_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B,
                  int64_t ldb, float beta, TC* C, int64_t ldc) {
  const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  std::vector<float> a(ar * ac), b(br * bc), c(M * N);
  for (int64_t i = 0; i < ar; ++i)
    for (int64_t j = 0; j < ac; ++j) a[i * ac + j] = static_cast<float>(A[i * lda + j]);
  for (int64_t i = 0; i < br; ++i)
    for (int64_t j = 0; j < bc; ++j) b[i * bc + j] = static_cast<float>(B[i * ldb + j]);
  if (beta != 0.0f)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) c[i * N + j] = static_cast<float>(C[i * ldc + j]);
  gemm(ta, tb, M, N, K, alpha, a.data(), ac, b.data(), bc, beta, c.data(), N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = TC(c[i * N + j]);
}

// Fallback of gemm_bias: C rows start as the bias, the GEMM adds op(A) op(B) (beta = 1).
template <class T>
void gemm_bias_via_prefill(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
                           int64_t ldb, const T* bias, T* C, int64_t ldc) {
  for (int64_t r = 0; r < M; ++r) std::copy(bias, bias + N, C + r * ldc);
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) gemm(ta, tb, M, N, K, T(1), A, lda, B, ldb, T(1), C, ldc);
  else gemm_lowp<T>(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, ldc);
}

}  // namespace

template <class T>
void gemm_lowp(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B,
               int64_t ldb, float beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (!tb && matmul_bf16_packing_b<bfloat16>(ta, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
    if (K > 0 && matmul_dnnl<bfloat16, bfloat16>(ta, tb, M, N, K, alpha, A, lda, B, ldb, nullptr, beta, C, ldc)) return;
  }
  gemm_via_f32<T, T>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
template void gemm_lowp<bfloat16>(bool, bool, int64_t, int64_t, int64_t, float, const bfloat16*, int64_t,
                                  const bfloat16*, int64_t, float, bfloat16*, int64_t);
template void gemm_lowp<float16>(bool, bool, int64_t, int64_t, int64_t, float, const float16*, int64_t,
                                 const float16*, int64_t, float, float16*, int64_t);

void gemm_bf16_f32out(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A, int64_t lda,
                      const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (!tb && matmul_bf16_packing_b<float>(ta, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
  if (K > 0 && matmul_dnnl<bfloat16, float>(ta, tb, M, N, K, alpha, A, lda, B, ldb, nullptr, beta, C, ldc)) return;
  gemm_via_f32<bfloat16, float>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <class T>
void gemm_bias(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
               const T* bias, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (!bias) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) gemm(ta, tb, M, N, K, T(1), A, lda, B, ldb, T(0), C, ldc);
    else gemm_lowp<T>(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (narrow_gemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, bias, C, ldc)) return;
    if (small_batch_gemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, bias, C, ldc)) return;
    if (use_f32_primitive(M, N, K) && matmul_dnnl<float, float>(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, bias, 0.0f, C, ldc))
      return;
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    if (K > 0 && matmul_dnnl<bfloat16, bfloat16>(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, bias, 0.0f, C, ldc)) return;
  }
  gemm_bias_via_prefill<T>(ta, tb, M, N, K, A, lda, B, ldb, bias, C, ldc);
}
template void gemm_bias<float>(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t,
                               const float*, float*, int64_t);
template void gemm_bias<double>(bool, bool, int64_t, int64_t, int64_t, const double*, int64_t, const double*, int64_t,
                                const double*, double*, int64_t);
template void gemm_bias<bfloat16>(bool, bool, int64_t, int64_t, int64_t, const bfloat16*, int64_t, const bfloat16*,
                                  int64_t, const bfloat16*, bfloat16*, int64_t);
template void gemm_bias<float16>(bool, bool, int64_t, int64_t, int64_t, const float16*, int64_t, const float16*,
                                 int64_t, const float16*, float16*, int64_t);

template <class T>
bool gemm_packed(int64_t M, const T* A, int64_t lda, const PackedLayout& l, const T* B, const T* bias, T* C, int64_t ldc) {
  if (M == 0 || l.N == 0) return true;
  if (l.K == 0 || l.bf16 != std::is_same_v<T, bfloat16>) return false;
  return matmul_dnnl<T, T>(false, false, M, l.N, l.K, 1.0f, A, lda, B, 0, bias, 0.0f, C, ldc, &l);
}
template bool gemm_packed<float>(int64_t, const float*, int64_t, const PackedLayout&, const float*, const float*, float*, int64_t);
template bool gemm_packed<bfloat16>(int64_t, const bfloat16*, int64_t, const PackedLayout&, const bfloat16*, const bfloat16*,
                                    bfloat16*, int64_t);

// Packed weights pay when many rows share one packing (GPT steps, 1024-2048 rows). At the
// MLP's batch of 128 they gain nothing: what the forward GEMMs save, the optimizer's step
// spends rewriting the copies (bench/RESULTS.md has the figures).
constexpr int64_t kMinPackedRows = 256;

bool gemm_prefers_packed_b(bool bf16, bool tb, int64_t M, int64_t N, int64_t K) {
  if (M < kMinPackedRows || N == 0 || K == 0 || !gemm_packed_supported(bf16)) return false;
  return bf16 || (use_f32_primitive(M, N, K) && !narrow_gemm_applies(false, tb, M, N, K, 1.0f));
}

namespace {
// Whether oneDNN's matmul reads B in the packed layout (weight_packing.h) on this CPU: a
// GEMM of the linear layers' kind (256 rows, K = N = 256) asked for once. Its brgemm
// kernels take BA16a64b (f32) on AVX-512 and BA16a64b2a (bf16) with AVX512_BF16 or AMX;
// elsewhere (AVX2; bf16 emulated on AVX-512 without AVX512_BF16) its kernels want other
// layouts, and a packed copy would only be written, never read.
template <class T> bool onednn_reads_packed() {
  const PackedLayout l = packed_layout(std::is_same_v<T, bfloat16>, 256, 256);
  const MatmulCall c = matmul_call<T, T>(false, false, 256, 256, 256, 1.0f, 256, 0, false, 0.0f, 256, &l);
  return find_matmul<T>(c).has_value();
}
}  // namespace

bool gemm_packed_supported(bool bf16) {
  static const bool f32 = onednn_reads_packed<float>(), b16 = onednn_reads_packed<bfloat16>();
  return bf16 ? b16 : f32;
}

size_t gemm_cached_primitives(bool bf16_inputs) {
  std::lock_guard<std::mutex> lock(dnnl_state().mu);
  size_t n = 0;
  for (const auto& [key, prim] : dnnl_state().cache) n += (std::get<0>(key) == dt::bf16) == bf16_inputs;
  return n;
}
size_t gemm_bf16_cached_primitives() { return gemm_cached_primitives(/*bf16_inputs=*/true); }

std::string gemm_backend_name() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         " (f32/bf16 matmul primitives, f32 sgemm for small GEMMs, JIT " +
         std::string(v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other runtime") + "), OpenBLAS (f64)";
}

namespace ref {
template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, double beta, T* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = cast_value<double>(ta ? A[k * lda + i] : A[i * lda + k]);
        const double b = cast_value<double>(tb ? B[j * ldb + k] : B[k * ldb + j]);
        acc += a * b;
      }
      const double prev = beta == 0.0 ? 0.0 : beta * cast_value<double>(C[i * ldc + j]);
      C[i * ldc + j] = cast_value<T>(alpha * acc + prev);
    }
}
template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, double, const float*, int64_t, const float*, int64_t,
                          double, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
                           int64_t, double, double*, int64_t);
template void gemm<bfloat16>(bool, bool, int64_t, int64_t, int64_t, double, const bfloat16*, int64_t, const bfloat16*,
                             int64_t, double, bfloat16*, int64_t);
template void gemm<float16>(bool, bool, int64_t, int64_t, int64_t, double, const float16*, int64_t, const float16*,
                            int64_t, double, float16*, int64_t);
}  // namespace ref

}  // namespace athanor::cpu
