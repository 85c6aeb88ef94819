// The CUDA flash attention (src/backend/cuda/attention.h) against the CPU kernel
// (cpu::attention_forward/backward) on the same rounded inputs: forward (O and lse) and
// backward (dQ, dK, dV), causal and not, T not a multiple of the tiles, Tq != Tk, head dims 64
// and 128 and the padded ones (8, 16, 20, 48, 80, 96, 160, 256: run at 32, 64, 128 or 256 with
// zero columns; 20 in bf16 also takes the scalar loads), f32/bf16/f16, the contiguous,
// packed-qkv and gapped (row stride not a multiple of 16 bytes: the scalar load path)
// layouts, grouped-query attention (the CPU runs it on K and V repeated per query head, and
// dK/dV are summed over each group), a grid that fills the GPU; then bit-identical reruns,
// the bad-input errors and the padded head dim choice (these run without a GPU too).
//
// Every case also checks bounds: each output buffer starts filled with a sentinel and every
// element outside the operand's rows (guards around the buffer, the gaps between rows, the
// other operands' columns of a packed buffer) must still hold it afterwards.
//
// Tolerances, as max |gpu - cpu| / max |cpu| over the tensor (both f32 accumulation; bf16/f16
// differ by the rounding of O, P and dS as product operands in other orders):
//   f32: O 2e-5, grads 5e-5;  f16: O 3e-3, grads 5e-3;  bf16: O 1e-2, grads 2e-2;
//   lse (f32 everywhere): 5e-5 absolute.
// (A CPU emulation of these kernels against a double-precision reference measured, on this
// file's shapes: f32 7e-7, f16 4.5e-4, bf16 3.9e-3; the CPU kernel has errors of its own.)
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "athanor/core/error.h"
#include "athanor/core/half.h"
#include "backend/cpu/attention.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/attention_fast.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

namespace {

enum class Lay { contiguous, packed, gapped };

struct Case {
  int64_t B, H, Hkv, Tq, Tk, D;
  bool causal;
  Lay lay;
};

struct Tol {
  double o, grad;
};
template <class H> Tol tol_for();
template <> Tol tol_for<float>() { return {2e-5, 5e-5}; }
template <> Tol tol_for<float16>() { return {3e-3, 5e-3}; }
template <> Tol tol_for<bfloat16>() { return {1e-2, 2e-2}; }

template <class H> DType dtype_for() { return dtype_of<H>; }

constexpr int64_t kGuard = 64;     // sentinel elements before and after every device buffer
constexpr float kSentinel = 1234.5f;

template <class H> bool same_bits(const H& a, const H& b) { return std::memcmp(&a, &b, sizeof(H)) == 0; }

// One operand's place in a buffer: element (b, h, t, c) at off + b sb + h sh + t st + c.
struct Place {
  int64_t off;
  cuda::AttentionStrides s;
  int64_t heads, T, D;
  int64_t at(int64_t b, int64_t h, int64_t t, int64_t c) const { return off + b * s.b + h * s.h + t * s.t + c; }
};

// The operands' places for a case: q, k, v in one input buffer (and dq, dk, dv in a gradient
// buffer of the same shape), o (and dO) in an output buffer.
struct Places {
  Place q, k, v, o;
  int64_t in_size, out_size;
  cuda::AttentionLayout layout;
};

Places places(const Case& c) {
  cuda::AttentionDims d{c.B, c.H, c.Tq, c.Tk, c.D, c.D, c.Hkv};
  Places p{};
  if (c.lay == Lay::packed) {
    p.layout = cuda::AttentionLayout::packed_qkv(d);
    p.q = {0, p.layout.q, c.H, c.Tq, c.D};
    p.k = {c.H * c.D, p.layout.k, c.Hkv, c.Tk, c.D};
    p.v = {(c.H + c.Hkv) * c.D, p.layout.v, c.Hkv, c.Tk, c.D};
    p.in_size = c.B * c.Tq * (c.H + 2 * c.Hkv) * c.D;
  } else {
    const int64_t row = c.lay == Lay::gapped ? c.D + 3 : c.D;  // gapped: 3 unused elements after each row
    auto dense = [&](int64_t heads, int64_t T) { return cuda::AttentionStrides{heads * T * row, T * row, row}; };
    p.layout.q = dense(c.H, c.Tq), p.layout.k = dense(c.Hkv, c.Tk), p.layout.v = dense(c.Hkv, c.Tk);
    p.layout.o = dense(c.H, c.Tq);
    const int64_t nq = c.B * c.H * c.Tq * row, nk = c.B * c.Hkv * c.Tk * row;
    p.q = {0, p.layout.q, c.H, c.Tq, c.D};
    p.k = {nq, p.layout.k, c.Hkv, c.Tk, c.D};
    p.v = {nq + nk, p.layout.v, c.Hkv, c.Tk, c.D};
    p.in_size = nq + 2 * nk;
  }
  p.o = {0, p.layout.o, c.H, c.Tq, c.D};
  p.out_size = c.lay == Lay::gapped ? c.B * c.H * c.Tq * (c.D + 3) : c.B * c.H * c.Tq * c.D;
  return p;
}

// Logical [B, heads, T, D] <-> a buffer (indices shifted by the guard).
template <class H>
void scatter(std::vector<H>& buf, const Place& p, int64_t B, const std::vector<H>& x, std::vector<char>* covered) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t t = 0; t < p.T; ++t)
        for (int64_t c = 0; c < p.D; ++c) {
          const int64_t i = kGuard + p.at(b, h, t, c);
          buf[i] = x[((b * p.heads + h) * p.T + t) * p.D + c];
          if (covered) (*covered)[i] = 1;
        }
}
template <class H> std::vector<H> gather(const std::vector<H>& buf, const Place& p, int64_t B) {
  std::vector<H> x(B * p.heads * p.T * p.D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t t = 0; t < p.T; ++t)
        for (int64_t c = 0; c < p.D; ++c) x[((b * p.heads + h) * p.T + t) * p.D + c] = buf[kGuard + p.at(b, h, t, c)];
  return x;
}
template <class H> void mark(std::vector<char>& covered, const Place& p, int64_t B) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t t = 0; t < p.T; ++t)
        for (int64_t c = 0; c < p.D; ++c) covered[kGuard + p.at(b, h, t, c)] = 1;
}

// Every element outside the covered ones still holds the sentinel.
template <class H>
::testing::AssertionResult untouched(const std::vector<H>& buf, const std::vector<char>& covered, const char* what) {
  const H s(kSentinel);
  for (std::size_t i = 0; i < buf.size(); ++i)
    if (!covered[i] && !same_bits(buf[i], s))
      return ::testing::AssertionFailure() << what << ": element " << i << " outside the operands was written ("
                                           << static_cast<float>(buf[i]) << "; guard " << kGuard << ", size "
                                           << buf.size() << ")";
  return ::testing::AssertionSuccess();
}

// max |got - want| / max |want| <= tol.
template <class A, class B>
::testing::AssertionResult close_rel_max(const std::vector<A>& got, const std::vector<B>& want, double tol,
                                         const char* what) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  double scale = 0, worst = -1;
  std::size_t at = 0;
  for (const auto& w : want) scale = std::max(scale, std::abs(static_cast<double>(w)));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    if (!(e <= worst) || std::isnan(e)) worst = std::isnan(e) ? 1e300 : e, at = i;
  }
  const double rel = worst / std::max(scale, 1e-30);
  if (rel <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max error " << worst << " = " << rel << " of max |want| "
                                       << scale << " (tolerance " << tol << ") at element " << at << ": got "
                                       << static_cast<double>(got[at]) << ", want " << static_cast<double>(want[at]);
}

template <class H> std::vector<H> rounded(std::size_t n, unsigned seed, float amp) {
  const auto f = random_vector(n, seed, -amp, amp);
  std::vector<H> r;
  r.reserve(n);
  for (float x : f) r.emplace_back(x);
  return r;
}

// K or V [B, Hkv, T, D] repeated to [B, H, T, D] (query head h reads kv head h / (H / Hkv)).
template <class H> std::vector<H> expand_kv(const std::vector<H>& x, const Case& c, int64_t T) {
  std::vector<H> r(c.B * c.H * T * c.D);
  const int64_t g = c.H / c.Hkv, n = T * c.D;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      std::copy_n(x.begin() + (b * c.Hkv + h / g) * n, n, r.begin() + (b * c.H + h) * n);
  return r;
}
// dK or dV [B, H, T, D] summed over each group to [B, Hkv, T, D] (in double).
template <class H> std::vector<double> reduce_kv(const std::vector<H>& x, const Case& c, int64_t T) {
  std::vector<double> r(c.B * c.Hkv * T * c.D, 0.0);
  const int64_t g = c.H / c.Hkv, n = T * c.D;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < n; ++i) r[(b * c.Hkv + h / g) * n + i] += static_cast<float>(x[(b * c.H + h) * n + i]);
  return r;
}

// What one GPU run of a case produced (logical layouts), for the determinism test too.
template <class H> struct GpuResult {
  std::vector<H> o, dq, dk, dv;
  std::vector<float> lse;
};

template <class H>
GpuResult<H> run_gpu(const Case& c, const std::vector<H>& q, const std::vector<H>& k, const std::vector<H>& v,
                     const std::vector<H>& dout) {
  const Places p = places(c);
  const H sentinel(kSentinel);
  std::vector<H> in(p.in_size + 2 * kGuard, sentinel), out(p.out_size + 2 * kGuard, sentinel);
  scatter(in, p.q, c.B, q, nullptr);
  scatter(in, p.k, c.B, k, nullptr);
  scatter(in, p.v, c.B, v, nullptr);
  std::vector<H> dO_buf = out;
  scatter(dO_buf, p.o, c.B, dout, nullptr);
  const int64_t nlse = c.B * c.H * c.Tq;
  std::vector<float> lse_init(nlse + 2 * kGuard, kSentinel);

  DeviceBuffer<H> dIn(in), dOut(out), dDO(dO_buf), dGrad(in.size());
  std::vector<H> grad_init(in.size(), sentinel);
  ATH_CUDA(cudaMemcpyAsync(dGrad.ptr, grad_init.data(), grad_init.size() * sizeof(H), cudaMemcpyHostToDevice, stream()));
  DeviceBuffer<float> dLse(lse_init);
  const cuda::AttentionDims d{c.B, c.H, c.Tq, c.Tk, c.D, c.D, c.Hkv};
  DeviceBuffer<unsigned char> ws(static_cast<std::size_t>(cuda::attention_backward_workspace(d)), MemTag::workspace);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  const H* base = dIn.ptr + kGuard;
  H* gbase = dGrad.ptr + kGuard;
  // These are the tests of attention.cu's kernels: pinned to them, whatever the process's default
  // (the fast bf16/f16 kernels have their own, test_gpu_attention_fast.cpp).
  struct PinReference {
    cuda::AttentionImpl was = cuda::attention_impl();
    PinReference() { cuda::set_attention_impl(cuda::AttentionImpl::reference); }
    ~PinReference() { cuda::set_attention_impl(was); }
  } pin;
  cuda::attention_forward(base + p.q.off, base + p.k.off, base + p.v.off, dOut.ptr + kGuard, dLse.ptr + kGuard, d,
                          p.layout, c.causal, scale, dtype_for<H>(), stream());
  cuda::attention_backward(base + p.q.off, base + p.k.off, base + p.v.off, dOut.ptr + kGuard, dDO.ptr + kGuard,
                           dLse.ptr + kGuard, gbase + p.q.off, gbase + p.k.off, gbase + p.v.off, d, p.layout, c.causal,
                           scale, dtype_for<H>(), ws.ptr, stream());
  ATH_CUDA(cudaStreamSynchronize(stream()));

  const auto out_h = dOut.host(), grad_h = dGrad.host();
  const auto lse_h = dLse.host();
  // Bounds: only the operands' elements were written.
  std::vector<char> out_cov(out_h.size(), 0), grad_cov(grad_h.size(), 0), lse_cov(lse_h.size(), 0);
  mark<H>(out_cov, p.o, c.B);
  mark<H>(grad_cov, p.q, c.B);
  mark<H>(grad_cov, p.k, c.B);
  mark<H>(grad_cov, p.v, c.B);
  for (int64_t i = 0; i < nlse; ++i) lse_cov[kGuard + i] = 1;
  EXPECT_TRUE(untouched(out_h, out_cov, "o"));
  EXPECT_TRUE(untouched(grad_h, grad_cov, "dq/dk/dv"));
  EXPECT_TRUE(untouched(lse_h, lse_cov, "lse"));

  GpuResult<H> r;
  r.o = gather(out_h, p.o, c.B);
  r.dq = gather(grad_h, p.q, c.B);
  r.dk = gather(grad_h, p.k, c.B);
  r.dv = gather(grad_h, p.v, c.B);
  r.lse.assign(lse_h.begin() + kGuard, lse_h.begin() + kGuard + nlse);
  return r;
}

template <class H> void check_case(const Case& c, unsigned seed = 1) {
  SCOPED_TRACE("B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) + " Hkv=" + std::to_string(c.Hkv) +
               " Tq=" + std::to_string(c.Tq) + " Tk=" + std::to_string(c.Tk) + " D=" + std::to_string(c.D) +
               (c.causal ? " causal" : " non-causal") +
               (c.lay == Lay::packed ? " packed" : c.lay == Lay::gapped ? " gapped" : " contiguous"));
  // q larger than k: scores of a few units, so the softmax is far from uniform.
  const auto q = rounded<H>(c.B * c.H * c.Tq * c.D, seed, 2.5f), k = rounded<H>(c.B * c.Hkv * c.Tk * c.D, seed + 1, 1.0f),
             v = rounded<H>(c.B * c.Hkv * c.Tk * c.D, seed + 2, 1.0f),
             dout = rounded<H>(c.B * c.H * c.Tq * c.D, seed + 3, 1.0f);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));

  // The CPU kernel on K and V repeated per query head.
  const auto kx = expand_kv(k, c, c.Tk), vx = expand_kv(v, c, c.Tk);
  const cpu::AttentionDims cd{c.B, c.H, c.Tq, c.Tk, c.D, c.D};
  std::vector<H> o(c.B * c.H * c.Tq * c.D), dq(q.size()), dkx(kx.size()), dvx(vx.size());
  std::vector<float> lse(c.B * c.H * c.Tq);
  cpu::attention_forward<H>(q.data(), kx.data(), vx.data(), o.data(), lse.data(), cd, c.causal, scale);
  cpu::attention_backward<H>(q.data(), kx.data(), vx.data(), o.data(), dout.data(), lse.data(), dq.data(), dkx.data(),
                             dvx.data(), cd, c.causal, scale);
  const auto dk = reduce_kv(dkx, c, c.Tk), dv = reduce_kv(dvx, c, c.Tk);

  const GpuResult<H> g = run_gpu<H>(c, q, k, v, dout);
  const Tol t = tol_for<H>();
  EXPECT_TRUE(close_rel_max(g.o, o, t.o, "o"));
  EXPECT_TRUE(all_close(g.lse, lse, 5e-5, 0.0)) << "lse";
  EXPECT_TRUE(close_rel_max(g.dq, dq, t.grad, "dq"));
  EXPECT_TRUE(close_rel_max(g.dk, dk, t.grad, "dk"));
  EXPECT_TRUE(close_rel_max(g.dv, dv, t.grad, "dv"));
}

template <class H> bool bits_equal(const std::vector<H>& a, const std::vector<H>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(H)) == 0;
}

}  // namespace

// ---- f32 (the FMA path) -----------------------------------------------------------------
TEST(GpuAttention, F32CausalD64TNotTileMultiple) {
  ATH_REQUIRE_GPU();
  check_case<float>({2, 3, 3, 77, 77, 64, true, Lay::contiguous});
}
TEST(GpuAttention, F32NonCausalTqNeTkD128) {
  ATH_REQUIRE_GPU();
  check_case<float>({2, 2, 2, 50, 131, 128, false, Lay::contiguous});
}
// Keys past the last query (Tk > Tq, causal): their dK/dV blocks see no query and write zeros.
TEST(GpuAttention, F32CausalTkLongerGqa4to2) {
  ATH_REQUIRE_GPU();
  check_case<float>({1, 4, 2, 40, 150, 64, true, Lay::contiguous});
}
TEST(GpuAttention, F32CausalTqLongerGapped) {
  ATH_REQUIRE_GPU();
  check_case<float>({1, 2, 2, 90, 40, 64, true, Lay::gapped});
}
TEST(GpuAttention, F32PackedGqa4to1D128) {
  ATH_REQUIRE_GPU();
  check_case<float>({2, 4, 1, 70, 70, 128, true, Lay::packed});
}

// ---- bf16 / f16 (tensor cores) ------------------------------------------------------------
TEST(GpuAttention, Bf16CausalPackedD64) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({2, 4, 4, 200, 200, 64, true, Lay::packed});
}
TEST(GpuAttention, Bf16NonCausalTqNeTkD128) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 3, 3, 33, 100, 128, false, Lay::contiguous});
}
TEST(GpuAttention, Bf16CausalPackedGqa4to1) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({2, 4, 1, 96, 96, 64, true, Lay::packed});
}
TEST(GpuAttention, Bf16CausalGappedGqa4to2D128) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 4, 2, 70, 70, 128, true, Lay::gapped});
}
TEST(GpuAttention, F16CausalGqa4to2D128) {
  ATH_REQUIRE_GPU();
  check_case<float16>({1, 4, 2, 130, 130, 128, true, Lay::contiguous});
}
TEST(GpuAttention, F16NonCausalPackedD64) {
  ATH_REQUIRE_GPU();
  check_case<float16>({2, 2, 2, 64, 64, 64, false, Lay::packed});
}
TEST(GpuAttention, F16NonCausalTqNeTkGappedD64) {
  ATH_REQUIRE_GPU();
  check_case<float16>({1, 2, 2, 100, 37, 64, false, Lay::gapped});
}
// Grids larger than the GPU's 132 SMs (forward 512 blocks, dK/dV 512, dQ 512).
TEST(GpuAttention, Bf16FillsTheGpuGpt2Like) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({4, 16, 16, 512, 512, 64, true, Lay::packed});
}
TEST(GpuAttention, F16FillsTheGpuLlamaLike) {
  ATH_REQUIRE_GPU();
  check_case<float16>({2, 32, 8, 256, 256, 128, true, Lay::contiguous});
}

// ---- padded head dims (the kernels run at 32, 64, 128, 256; columns past D are zero) ------
// GPT-char's 48, the tiny test GPTs' 16, 80/96 of other models, 160 and 256 above 128, 8 and
// 20 at the small end (20: D * 2 bytes is not a multiple of 16, so bf16 loads are scalar).
// The bound checks of run_gpu also see that nothing past column D of a row is written (the
// gapped layout's 3 elements after each row, the neighbouring head's columns when packed).
TEST(GpuAttention, F32CausalD16Contiguous) {
  ATH_REQUIRE_GPU();
  check_case<float>({2, 3, 3, 45, 45, 16, true, Lay::contiguous});
}
TEST(GpuAttention, F32NonCausalD48Packed) {
  ATH_REQUIRE_GPU();
  check_case<float>({2, 4, 4, 70, 70, 48, false, Lay::packed});
}
TEST(GpuAttention, F32CausalD80GappedGqa4to2) {
  ATH_REQUIRE_GPU();
  check_case<float>({1, 4, 2, 60, 60, 80, true, Lay::gapped});
}
TEST(GpuAttention, F32NonCausalTqNeTkD80Contiguous) {
  ATH_REQUIRE_GPU();
  check_case<float>({1, 2, 2, 40, 75, 80, false, Lay::contiguous});
}
TEST(GpuAttention, F32CausalD160Gqa2to1) {
  ATH_REQUIRE_GPU();
  check_case<float>({1, 2, 1, 50, 50, 160, true, Lay::contiguous});
}
TEST(GpuAttention, F32NonCausalD256Packed) {
  ATH_REQUIRE_GPU();
  check_case<float>({1, 2, 2, 40, 40, 256, false, Lay::packed});
}
TEST(GpuAttention, F32CausalD20Contiguous) {
  ATH_REQUIRE_GPU();
  check_case<float>({1, 2, 2, 33, 33, 20, true, Lay::contiguous});
}
TEST(GpuAttention, Bf16CausalD48PackedGptChar) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({2, 4, 4, 100, 100, 48, true, Lay::packed});
}
TEST(GpuAttention, Bf16NonCausalTqNeTkD48Contiguous) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 3, 3, 33, 70, 48, false, Lay::contiguous});
}
TEST(GpuAttention, Bf16CausalD16Packed) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({2, 2, 2, 80, 80, 16, true, Lay::packed});
}
TEST(GpuAttention, Bf16NonCausalD16Contiguous) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 2, 2, 50, 50, 16, false, Lay::contiguous});
}
TEST(GpuAttention, Bf16CausalD80Gqa4to2) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 4, 2, 90, 90, 80, true, Lay::contiguous});
}
TEST(GpuAttention, Bf16NonCausalD80Packed) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({2, 2, 2, 50, 50, 80, false, Lay::packed});
}
TEST(GpuAttention, Bf16CausalD256PackedGqa4to2) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 4, 2, 70, 70, 256, true, Lay::packed});
}
TEST(GpuAttention, Bf16NonCausalTqNeTkD160) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 2, 2, 30, 65, 160, false, Lay::contiguous});
}
TEST(GpuAttention, Bf16CausalD20ScalarLoads) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 2, 2, 40, 40, 20, true, Lay::contiguous});
}
TEST(GpuAttention, F16CausalD96GappedAndD8) {
  ATH_REQUIRE_GPU();
  check_case<float16>({1, 2, 2, 70, 70, 96, true, Lay::gapped});
  check_case<float16>({1, 2, 2, 40, 40, 8, false, Lay::contiguous});
}

// Two runs, the same bits: no atomics, fixed reduction orders (GQA's dK/dV sums over the
// group included).
TEST(GpuAttention, BackwardBitIdenticalAcrossRuns) {
  ATH_REQUIRE_GPU();
  for (const Case c : {Case{2, 8, 2, 300, 300, 128, true, Lay::contiguous}, Case{2, 6, 6, 129, 129, 64, true, Lay::packed}}) {
    const auto q = rounded<bfloat16>(c.B * c.H * c.Tq * c.D, 7, 2.5f), k = rounded<bfloat16>(c.B * c.Hkv * c.Tk * c.D, 8, 1),
               v = rounded<bfloat16>(c.B * c.Hkv * c.Tk * c.D, 9, 1), dout = rounded<bfloat16>(c.B * c.H * c.Tq * c.D, 10, 1);
    const auto a = run_gpu<bfloat16>(c, q, k, v, dout), b = run_gpu<bfloat16>(c, q, k, v, dout);
    EXPECT_TRUE(bits_equal(a.o, b.o));
    EXPECT_TRUE(bits_equal(a.lse, b.lse));
    EXPECT_TRUE(bits_equal(a.dq, b.dq));
    EXPECT_TRUE(bits_equal(a.dk, b.dk));
    EXPECT_TRUE(bits_equal(a.dv, b.dv));
  }
  const Case c{1, 4, 2, 77, 77, 64, true, Lay::contiguous};
  const auto q = rounded<float>(c.B * c.H * c.Tq * c.D, 11, 2.5f), k = rounded<float>(c.B * c.Hkv * c.Tk * c.D, 12, 1),
             v = rounded<float>(c.B * c.Hkv * c.Tk * c.D, 13, 1), dout = rounded<float>(c.B * c.H * c.Tq * c.D, 14, 1);
  const auto a = run_gpu<float>(c, q, k, v, dout), b = run_gpu<float>(c, q, k, v, dout);
  EXPECT_TRUE(bits_equal(a.dq, b.dq) && bits_equal(a.dk, b.dk) && bits_equal(a.dv, b.dv));
}

// ---- bad input: errors before any work (no GPU needed) --------------------------------------
namespace {
std::string error_of(const cuda::AttentionDims& d, DType dt) {
  float dummy[4] = {};
  try {
    cuda::attention_forward(dummy, dummy, dummy, dummy, dummy, d, cuda::AttentionLayout::contiguous(d), true, 0.125, dt,
                            nullptr);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST(GpuAttention, BadInputIsAClearError) {
  const auto has = [](const std::string& s, const char* w) { return s.find(w) != std::string::npos; };
  std::string e = error_of({1, 2, 16, 16, 264, 264}, DType::bf16);
  EXPECT_TRUE(has(e, "head dim D=264") && has(e, "1 <= D <= 256")) << e;
  e = error_of({1, 2, 16, 16, 0, 0}, DType::f32);
  EXPECT_TRUE(has(e, "head dim D=0") && has(e, "1 <= D <= 256")) << e;
  e = error_of({1, 4, 16, 16, 64, 64, 3}, DType::bf16);
  EXPECT_TRUE(has(e, "Hkv=3") && has(e, "H=4")) << e;
  e = error_of({1, 2, 16, 16, 64, 64}, DType::f64);
  EXPECT_TRUE(has(e, "dtype f64")) << e;
  e = error_of({1, 2, 16, 16, 64, 128}, DType::f32);
  EXPECT_TRUE(has(e, "D=64") && has(e, "Dv=128")) << e;
  e = error_of({1, 2, 0, 16, 64, 64}, DType::f32);
  EXPECT_TRUE(has(e, "Tq=0")) << e;
  const cuda::AttentionDims ok{1, 2, 16, 16, 64, 64};
  try {
    cuda::attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, ok, cuda::AttentionLayout::contiguous(ok),
                            true, 0.125, DType::f32, nullptr);
    ADD_FAILURE() << "null pointers accepted";
  } catch (const Error& err) {
    EXPECT_TRUE(has(err.what(), "null operand")) << err.what();
  }
  try {
    cuda::AttentionLayout::packed_qkv({1, 2, 16, 17, 64, 64});
    ADD_FAILURE() << "packed_qkv with Tq != Tk accepted";
  } catch (const Error& err) {
    EXPECT_TRUE(has(err.what(), "Tq == Tk")) << err.what();
  }
}

// The padded head dim the kernels run at, and which head dims attention_check lets through
// (host logic: runs without a GPU).
TEST(GpuAttention, PaddedHeadDimChoice) {
  const std::vector<std::pair<int64_t, int64_t>> want = {{1, 32},    {8, 32},    {16, 32},   {20, 32},  {32, 32},
                                                         {33, 64},   {48, 64},   {64, 64},   {65, 128}, {80, 128},
                                                         {96, 128},  {112, 128}, {128, 128}, {129, 256}, {160, 256},
                                                         {256, 256}, {257, 0},   {512, 0},   {0, 0},    {-8, 0}};
  for (const auto& [D, Dp] : want) EXPECT_EQ(cuda::attention_padded_head_dim(D), Dp) << "D=" << D;
  EXPECT_EQ(cuda::kAttentionMaxHeadDim, 256);
  for (const int64_t D : {8, 16, 20, 48, 80, 96, 160, 256}) {
    const cuda::AttentionDims d{2, 4, 33, 33, D, D, 2};
    for (const DType dt : {DType::f32, DType::bf16, DType::f16}) {
      EXPECT_NO_THROW(cuda::attention_check(d, cuda::AttentionLayout::contiguous(d), dt, "test")) << "D=" << D;
      EXPECT_NO_THROW(cuda::attention_check(d, cuda::AttentionLayout::packed_qkv(d), dt, "test")) << "D=" << D;
    }
  }
  const cuda::AttentionDims big{1, 2, 16, 16, 257, 257};
  EXPECT_THROW(cuda::attention_check(big, cuda::AttentionLayout::contiguous(big), DType::f32, "test"), Error);
}
