// The fast CUDA flash attention (src/backend/cuda/attention_fast.h, taken by attention_forward
// and attention_backward under ATHANOR_CUDA_ATTENTION=fast) against the CPU kernel
// (cpu::attention_forward/backward on the same rounded inputs) and against the reference CUDA
// kernels (attention.cu): O and lse of the fast forward, dQ, dK, dV of the fast backward, and
// the two mixed pairs (fast forward + reference backward, reference forward + fast backward:
// the implementations must be interchangeable, same lse). bf16 and f16, D 64 and 128,
// causal and not, T not a multiple of the 64-row tiles, Tq != Tk (non-causal and causal), packed
// and contiguous layouts, grouped-query attention (H 8, Hkv 2), a grid that fills the GPU.
// Every output buffer starts filled with a sentinel that must survive outside the operands.
// Then the host logic (no GPU needed): the switch's parsing and the fast path's preconditions.
//
// Tolerances are the GpuAttention tests' (test_gpu_attention.cpp), max |got - want| / max |want|:
//   f16: O 3e-3, grads 5e-3;  bf16: O 1e-2, grads 2e-2;  lse (f32): 5e-5 absolute.
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
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

struct Case {
  int64_t B, H, Hkv, Tq, Tk, D;
  bool causal, packed;
};

struct Tol {
  double o, grad;
};
template <class H> Tol tol_for();
template <> Tol tol_for<float16>() { return {3e-3, 5e-3}; }
template <> Tol tol_for<bfloat16>() { return {1e-2, 2e-2}; }

constexpr int64_t kGuard = 64;  // sentinel elements before and after every buffer (128 bytes: alignment kept)
constexpr float kSentinel = 1234.5f;

// Restores the process's implementation choice at scope end.
struct ImplGuard {
  cuda::AttentionImpl saved = cuda::attention_impl();
  explicit ImplGuard(cuda::AttentionImpl impl) { cuda::set_attention_impl(impl); }
  ~ImplGuard() { cuda::set_attention_impl(saved); }
};

// One operand's place in a buffer: element (b, h, t, c) at off + b sb + h sh + t st + c.
struct Place {
  int64_t off;
  cuda::AttentionStrides s;
  int64_t heads, T, D;
  int64_t at(int64_t b, int64_t h, int64_t t, int64_t c) const { return off + b * s.b + h * s.h + t * s.t + c; }
};
struct Places {
  Place q, k, v, o;
  int64_t in_size, out_size;
  cuda::AttentionLayout layout;
};

Places places(const Case& c) {
  const cuda::AttentionDims d{c.B, c.H, c.Tq, c.Tk, c.D, c.D, c.Hkv};
  Places p{};
  if (c.packed) {
    p.layout = cuda::AttentionLayout::packed_qkv(d);
    p.q = {0, p.layout.q, c.H, c.Tq, c.D};
    p.k = {c.H * c.D, p.layout.k, c.Hkv, c.Tk, c.D};
    p.v = {(c.H + c.Hkv) * c.D, p.layout.v, c.Hkv, c.Tk, c.D};
    p.in_size = c.B * c.Tq * (c.H + 2 * c.Hkv) * c.D;
  } else {
    p.layout = cuda::AttentionLayout::contiguous(d);
    const int64_t nq = c.B * c.H * c.Tq * c.D, nk = c.B * c.Hkv * c.Tk * c.D;
    p.q = {0, p.layout.q, c.H, c.Tq, c.D};
    p.k = {nq, p.layout.k, c.Hkv, c.Tk, c.D};
    p.v = {nq + nk, p.layout.v, c.Hkv, c.Tk, c.D};
    p.in_size = nq + 2 * nk;
  }
  p.o = {0, p.layout.o, c.H, c.Tq, c.D};
  p.out_size = c.B * c.H * c.Tq * c.D;
  return p;
}

template <class H> void scatter(std::vector<H>& buf, const Place& p, int64_t B, const std::vector<H>& x) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t t = 0; t < p.T; ++t)
        for (int64_t c = 0; c < p.D; ++c) buf[kGuard + p.at(b, h, t, c)] = x[((b * p.heads + h) * p.T + t) * p.D + c];
}
template <class H> std::vector<H> gather(const std::vector<H>& buf, const Place& p, int64_t B) {
  std::vector<H> x(B * p.heads * p.T * p.D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t t = 0; t < p.T; ++t)
        for (int64_t c = 0; c < p.D; ++c) x[((b * p.heads + h) * p.T + t) * p.D + c] = buf[kGuard + p.at(b, h, t, c)];
  return x;
}
void mark(std::vector<char>& covered, const Place& p, int64_t B) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t t = 0; t < p.T; ++t)
        for (int64_t c = 0; c < p.D; ++c) covered[kGuard + p.at(b, h, t, c)] = 1;
}
template <class H>
::testing::AssertionResult untouched(const std::vector<H>& buf, const std::vector<char>& covered, const char* what) {
  const H s(kSentinel);
  for (std::size_t i = 0; i < buf.size(); ++i)
    if (!covered[i] && std::memcmp(&buf[i], &s, sizeof(H)) != 0)
      return ::testing::AssertionFailure() << what << ": element " << i << " outside the operands was written ("
                                           << static_cast<float>(buf[i]) << ")";
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

// K or V [B, Hkv, T, D] repeated to [B, H, T, D]; dK or dV summed back over each group.
template <class H> std::vector<H> expand_kv(const std::vector<H>& x, const Case& c) {
  std::vector<H> r(c.B * c.H * c.Tk * c.D);
  const int64_t g = c.H / c.Hkv, n = c.Tk * c.D;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      std::copy_n(x.begin() + (b * c.Hkv + h / g) * n, n, r.begin() + (b * c.H + h) * n);
  return r;
}
template <class H> std::vector<double> reduce_kv(const std::vector<H>& x, const Case& c) {
  std::vector<double> r(c.B * c.Hkv * c.Tk * c.D, 0.0);
  const int64_t g = c.H / c.Hkv, n = c.Tk * c.D;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < n; ++i) r[(b * c.Hkv + h / g) * n + i] += static_cast<float>(x[(b * c.H + h) * n + i]);
  return r;
}

template <class H> struct GpuResult {
  std::vector<H> o, dq, dk, dv;
  std::vector<float> lse;
};

// attention_forward under `fwd`, then attention_backward under `bwd` on its O and lse.
using Impl = cuda::AttentionImpl;
template <class H>
GpuResult<H> run_gpu(const Case& c, Impl fwd, Impl bwd, const std::vector<H>& q, const std::vector<H>& k,
                     const std::vector<H>& v, const std::vector<H>& dout) {
  const ImplGuard guard(fwd);
  const Places p = places(c);
  const H sentinel(kSentinel);
  std::vector<H> in(p.in_size + 2 * kGuard, sentinel), out(p.out_size + 2 * kGuard, sentinel);
  scatter(in, p.q, c.B, q);
  scatter(in, p.k, c.B, k);
  scatter(in, p.v, c.B, v);
  std::vector<H> dO_buf = out;
  scatter(dO_buf, p.o, c.B, dout);
  const int64_t nlse = c.B * c.H * c.Tq;
  std::vector<float> lse_init(nlse + 2 * kGuard, kSentinel);
  std::vector<H> grad_init(in.size(), sentinel);

  DeviceBuffer<H> dIn(in), dOut(out), dDO(dO_buf), dGrad(grad_init);
  DeviceBuffer<float> dLse(lse_init);
  const cuda::AttentionDims d{c.B, c.H, c.Tq, c.Tk, c.D, c.D, c.Hkv};
  DeviceBuffer<unsigned char> ws(static_cast<std::size_t>(cuda::attention_backward_workspace(d)), MemTag::workspace);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  const H* base = dIn.ptr + kGuard;
  H* gbase = dGrad.ptr + kGuard;
  // The fast cases must take the fast kernels, not fall back (or this test checks nothing new).
  EXPECT_TRUE(cuda::attention_fast_backward_supported(base + p.q.off, base + p.k.off, base + p.v.off,
                                                      dOut.ptr + kGuard, dDO.ptr + kGuard, gbase + p.q.off,
                                                      gbase + p.k.off, gbase + p.v.off, d, p.layout, dtype_of<H>));
  cuda::attention_forward(base + p.q.off, base + p.k.off, base + p.v.off, dOut.ptr + kGuard, dLse.ptr + kGuard, d,
                          p.layout, c.causal, scale, dtype_of<H>, stream());
  cuda::set_attention_impl(bwd);
  cuda::attention_backward(base + p.q.off, base + p.k.off, base + p.v.off, dOut.ptr + kGuard, dDO.ptr + kGuard,
                           dLse.ptr + kGuard, gbase + p.q.off, gbase + p.k.off, gbase + p.v.off, d, p.layout, c.causal,
                           scale, dtype_of<H>, ws.ptr, stream());
  ATH_CUDA(cudaStreamSynchronize(stream()));

  const auto out_h = dOut.host(), grad_h = dGrad.host();
  const auto lse_h = dLse.host();
  std::vector<char> out_cov(out_h.size(), 0), grad_cov(grad_h.size(), 0), lse_cov(lse_h.size(), 0);
  mark(out_cov, p.o, c.B);
  mark(grad_cov, p.q, c.B);
  mark(grad_cov, p.k, c.B);
  mark(grad_cov, p.v, c.B);
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

std::string describe(const Case& c) {
  return "B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) + " Hkv=" + std::to_string(c.Hkv) +
         " Tq=" + std::to_string(c.Tq) + " Tk=" + std::to_string(c.Tk) + " D=" + std::to_string(c.D) +
         (c.causal ? " causal" : " non-causal") + (c.packed ? " packed" : " contiguous");
}

// The fast forward against the CPU kernel (o, lse; grads of the reference backward on its
// output) and against the reference CUDA forward; `with_cpu` false skips the CPU (large grids).
template <class H> void check_case(const Case& c, bool with_cpu = true, unsigned seed = 1) {
  SCOPED_TRACE(describe(c));
  // q larger than k: scores of a few units, so the softmax is far from uniform.
  const auto q = rounded<H>(c.B * c.H * c.Tq * c.D, seed, 2.5f);
  const auto k = rounded<H>(c.B * c.Hkv * c.Tk * c.D, seed + 1, 1.0f);
  const auto v = rounded<H>(c.B * c.Hkv * c.Tk * c.D, seed + 2, 1.0f);
  const auto dout = rounded<H>(c.B * c.H * c.Tq * c.D, seed + 3, 1.0f);
  const Tol t = tol_for<H>();
  const GpuResult<H> fast = run_gpu<H>(c, Impl::fast, Impl::fast, q, k, v, dout);
  const GpuResult<H> ref = run_gpu<H>(c, Impl::reference, Impl::reference, q, k, v, dout);
  EXPECT_TRUE(close_rel_max(fast.o, ref.o, t.o, "o vs the reference kernel"));
  EXPECT_TRUE(all_close(fast.lse, ref.lse, 5e-5, 0.0)) << "lse vs the reference kernel";
  EXPECT_TRUE(close_rel_max(fast.dq, ref.dq, t.grad, "dq vs the reference kernel"));
  EXPECT_TRUE(close_rel_max(fast.dk, ref.dk, t.grad, "dk vs the reference kernel"));
  EXPECT_TRUE(close_rel_max(fast.dv, ref.dv, t.grad, "dv vs the reference kernel"));
  // The mixed pairs: each backward on the other forward's O and lse.
  for (const auto& [fwd, bwd, what] : {std::tuple{Impl::fast, Impl::reference, "fast fwd + reference bwd"},
                                       std::tuple{Impl::reference, Impl::fast, "reference fwd + fast bwd"}}) {
    SCOPED_TRACE(what);
    const GpuResult<H> mixed = run_gpu<H>(c, fwd, bwd, q, k, v, dout);
    EXPECT_TRUE(close_rel_max(mixed.dq, ref.dq, t.grad, "dq vs the reference kernels"));
    EXPECT_TRUE(close_rel_max(mixed.dk, ref.dk, t.grad, "dk vs the reference kernels"));
    EXPECT_TRUE(close_rel_max(mixed.dv, ref.dv, t.grad, "dv vs the reference kernels"));
  }
  if (!with_cpu) return;

  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  const auto kx = expand_kv(k, c), vx = expand_kv(v, c);
  const cpu::AttentionDims cd{c.B, c.H, c.Tq, c.Tk, c.D, c.D};
  std::vector<H> o(c.B * c.H * c.Tq * c.D), dq(q.size()), dkx(kx.size()), dvx(vx.size());
  std::vector<float> lse(c.B * c.H * c.Tq);
  cpu::attention_forward<H>(q.data(), kx.data(), vx.data(), o.data(), lse.data(), cd, c.causal, scale);
  cpu::attention_backward<H>(q.data(), kx.data(), vx.data(), o.data(), dout.data(), lse.data(), dq.data(), dkx.data(),
                             dvx.data(), cd, c.causal, scale);
  EXPECT_TRUE(close_rel_max(fast.o, o, t.o, "o vs the CPU"));
  EXPECT_TRUE(all_close(fast.lse, lse, 5e-5, 0.0)) << "lse vs the CPU";
  EXPECT_TRUE(close_rel_max(fast.dq, dq, t.grad, "dq vs the CPU"));
  EXPECT_TRUE(close_rel_max(fast.dk, reduce_kv(dkx, c), t.grad, "dk vs the CPU"));
  EXPECT_TRUE(close_rel_max(fast.dv, reduce_kv(dvx, c), t.grad, "dv vs the CPU"));
}

}  // namespace

// ---- bf16 ------------------------------------------------------------------------------------
TEST(GpuAttentionFast, Bf16CausalPackedD64T200) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({2, 4, 4, 200, 200, 64, true, true});
}
TEST(GpuAttentionFast, Bf16NonCausalTqNeTkD128) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 3, 3, 77, 200, 128, false, false});
  check_case<bfloat16>({1, 2, 2, 130, 33, 64, false, false});
}
TEST(GpuAttentionFast, Bf16CausalGqa8to2D128T77) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 8, 2, 77, 77, 128, true, false});
}
// Causal with Tq != Tk (top-left aligned): rows past Tk see every key; keys past Tq none.
TEST(GpuAttentionFast, Bf16CausalTqNeTk) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({1, 2, 2, 90, 40, 64, true, false});
  check_case<bfloat16>({1, 4, 2, 40, 150, 128, true, false});
}
TEST(GpuAttentionFast, Bf16PackedGqa8to2D64) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({2, 8, 2, 129, 129, 64, true, true});
}
// B * H * query tiles well over an H100's 132 SMs (4 * 32 * 4 = 512 blocks), at GPT-2's head
// dim; against the reference kernel only (the CPU would take long).
TEST(GpuAttentionFast, Bf16FillsTheGpu) {
  ATH_REQUIRE_GPU();
  check_case<bfloat16>({4, 32, 32, 256, 256, 64, true, true}, /*with_cpu=*/false);
  check_case<bfloat16>({2, 32, 8, 192, 192, 128, false, false}, /*with_cpu=*/false);
}

// ---- f16 -------------------------------------------------------------------------------------
TEST(GpuAttentionFast, F16CausalGqa8to2D128) {
  ATH_REQUIRE_GPU();
  check_case<float16>({1, 8, 2, 130, 130, 128, true, false});
}
TEST(GpuAttentionFast, F16NonCausalPackedD64) {
  ATH_REQUIRE_GPU();
  check_case<float16>({2, 2, 2, 64, 64, 64, false, true});
  check_case<float16>({2, 4, 4, 77, 77, 64, false, true});
}
TEST(GpuAttentionFast, F16CausalD64T200AndTqNeTk) {
  ATH_REQUIRE_GPU();
  check_case<float16>({2, 3, 3, 200, 200, 64, true, false});
  check_case<float16>({1, 2, 2, 50, 131, 128, false, false});
}

// The fast kernels' results depend on nothing but the inputs (no atomics).
TEST(GpuAttentionFast, BitIdenticalAcrossRuns) {
  ATH_REQUIRE_GPU();
  const Case c{2, 8, 2, 300, 300, 128, true, false};
  const auto q = rounded<bfloat16>(c.B * c.H * c.Tq * c.D, 7, 2.5f);
  const auto k = rounded<bfloat16>(c.B * c.Hkv * c.Tk * c.D, 8, 1);
  const auto v = rounded<bfloat16>(c.B * c.Hkv * c.Tk * c.D, 9, 1);
  const auto dout = rounded<bfloat16>(c.B * c.H * c.Tq * c.D, 10, 1);
  const auto a = run_gpu<bfloat16>(c, Impl::fast, Impl::fast, q, k, v, dout);
  const auto b = run_gpu<bfloat16>(c, Impl::fast, Impl::fast, q, k, v, dout);
  const auto same = [](const std::vector<bfloat16>& x, const std::vector<bfloat16>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(bfloat16)) == 0;
  };
  EXPECT_TRUE(same(a.o, b.o));
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_TRUE(same(a.dq, b.dq));
  EXPECT_TRUE(same(a.dk, b.dk));
  EXPECT_TRUE(same(a.dv, b.dv));
}

// ---- host logic (no GPU needed) --------------------------------------------------------------
TEST(GpuAttentionFast, SwitchParsing) {
  EXPECT_EQ(cuda::parse_attention_impl(nullptr), cuda::AttentionImpl::fast);  // the default
  EXPECT_EQ(cuda::parse_attention_impl(""), cuda::AttentionImpl::fast);
  EXPECT_EQ(cuda::parse_attention_impl("reference"), cuda::AttentionImpl::reference);
  EXPECT_EQ(cuda::parse_attention_impl("fast"), cuda::AttentionImpl::fast);
  EXPECT_EQ(cuda::parse_attention_impl("fast_fwd"), cuda::AttentionImpl::fast_fwd);
  for (const char* bad : {"FAST", "flash", "fast ", "1", "fast-fwd"}) {
    try {
      cuda::parse_attention_impl(bad);
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const Error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("ATHANOR_CUDA_ATTENTION"), std::string::npos) << w;
      EXPECT_NE(w.find(std::string("'") + bad + "'"), std::string::npos) << w;
      EXPECT_NE(w.find("'fast', 'fast_fwd'"), std::string::npos) << w;
    }
  }
  EXPECT_STREQ(cuda::attention_impl_name(cuda::AttentionImpl::fast), "fast");
  EXPECT_STREQ(cuda::attention_impl_name(cuda::AttentionImpl::reference), "reference");
  EXPECT_STREQ(cuda::attention_impl_name(cuda::AttentionImpl::fast_fwd), "fast_fwd");
  {
    const ImplGuard g(cuda::AttentionImpl::fast);
    EXPECT_EQ(cuda::attention_impl(), cuda::AttentionImpl::fast);
    cuda::set_attention_impl(cuda::AttentionImpl::reference);
    EXPECT_EQ(cuda::attention_impl(), cuda::AttentionImpl::reference);
  }
}

// Which calls the fast kernel takes; the rest fall back to attention.cu's kernels.
TEST(GpuAttentionFast, SupportedCalls) {
  alignas(16) static unsigned char buf[256];
  const void* a = buf;              // 16-byte aligned
  const void* odd = buf + 8;        // 8-byte aligned only
  const cuda::AttentionDims d64{2, 4, 100, 100, 64, 64, 2}, d128{1, 2, 77, 90, 128, 128};
  const auto L64 = cuda::AttentionLayout::contiguous(d64), P64 = cuda::AttentionLayout::packed_qkv(d64);
  const auto L128 = cuda::AttentionLayout::contiguous(d128);
  auto ok = [&](const cuda::AttentionDims& d, const cuda::AttentionLayout& L, DType dt, const void* q = nullptr) {
    return cuda::attention_fast_supported(q ? q : a, a, a, a, d, L, dt);
  };
  EXPECT_TRUE(ok(d64, L64, DType::bf16));
  EXPECT_TRUE(ok(d64, L64, DType::f16));
  EXPECT_TRUE(ok(d64, P64, DType::bf16));
  EXPECT_TRUE(ok(d128, L128, DType::bf16));
  EXPECT_FALSE(ok(d64, L64, DType::f32));  // f32 is always the reference
  EXPECT_FALSE(ok(d64, L64, DType::bf16, odd));
  for (const int64_t D : {32, 48, 80, 96, 256}) {
    const cuda::AttentionDims d{1, 2, 64, 64, D, D};
    EXPECT_FALSE(ok(d, cuda::AttentionLayout::contiguous(d), DType::bf16)) << "D=" << D;
  }
  const cuda::AttentionDims dv{1, 2, 64, 64, 64, 128};
  EXPECT_FALSE(ok(dv, cuda::AttentionLayout::contiguous(dv), DType::bf16));
  auto gapped = L64;
  gapped.k.t = 67;  // rows 134 bytes apart: not 16-byte aligned
  EXPECT_FALSE(ok(d64, gapped, DType::bf16));
  auto gapped_o = L64;
  gapped_o.o.h += 4;
  EXPECT_FALSE(ok(d64, gapped_o, DType::bf16));
  // The backward also needs dO and the gradients 16-byte aligned.
  EXPECT_TRUE(cuda::attention_fast_backward_supported(a, a, a, a, a, a, a, a, d64, L64, DType::bf16));
  for (int i = 0; i < 4; ++i) {
    const void* p[4] = {a, a, a, a};
    p[i] = odd;
    EXPECT_FALSE(cuda::attention_fast_backward_supported(a, a, a, a, p[0], p[1], p[2], p[3], d64, L64, DType::bf16))
        << "operand " << i;
  }
  EXPECT_FALSE(cuda::attention_fast_backward_supported(a, a, a, a, a, a, a, a, d64, L64, DType::f32));
}
