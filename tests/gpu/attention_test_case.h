#pragma once
// The scaffolding of the CUDA attention tests (test_gpu_attention.cpp: the reference kernels;
// test_gpu_attention_fast.cpp: the fast ones): a case's shape and layout, its operands' places
// in guarded device buffers (each output starts filled with a sentinel that must survive outside
// the operands: the guards around a buffer, the gaps between gapped rows, the other operands'
// columns of a packed one), one GPU forward + backward run with those bound checks, the rounded
// random inputs, the CPU reference (grouped-query attention run on K and V repeated per query
// head, dK/dV summed back over each group) and the max-relative-error comparison.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "athanor/core/half.h"
#include "backend/cpu/attention.h"
#include "backend/cuda/attention.h"
#include "gpu_test.h"

namespace athanor::gpu_test::attention_case {

// contiguous: q, k, v, o dense [B, heads, T, D]; packed: q, k, v column blocks of one
// [B, T, (H + 2 Hkv) D] buffer (AttentionLayout::packed_qkv); gapped: dense but with 3 unused
// elements after each row (a row stride that is not a multiple of 16 bytes).
enum class Lay { contiguous, packed, gapped };

struct Case {
  int64_t B, H, Hkv, Tq, Tk, D;
  bool causal;
  Lay lay;
};

inline std::string describe(const Case& c) {
  return "B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) + " Hkv=" + std::to_string(c.Hkv) +
         " Tq=" + std::to_string(c.Tq) + " Tk=" + std::to_string(c.Tk) + " D=" + std::to_string(c.D) +
         (c.causal ? " causal" : " non-causal") +
         (c.lay == Lay::packed ? " packed" : c.lay == Lay::gapped ? " gapped" : " contiguous");
}

// max |got - want| / max |want| per dtype, for O and for the gradients (test_gpu_attention.cpp
// says where they come from).
struct Tol {
  double o, grad;
};
template <class H> Tol tol_for();
template <> inline Tol tol_for<float>() { return {2e-5, 5e-5}; }
template <> inline Tol tol_for<float16>() { return {3e-3, 5e-3}; }
template <> inline Tol tol_for<bfloat16>() { return {1e-2, 2e-2}; }

// Sentinel elements before and after every device buffer (64: 128 bytes for 16-bit types, so
// the operands keep their alignment).
constexpr int64_t kGuard = 64;
constexpr float kSentinel = 1234.5f;

template <class H> bool same_bits(const H& a, const H& b) { return std::memcmp(&a, &b, sizeof(H)) == 0; }
template <class H> bool bits_equal(const std::vector<H>& a, const std::vector<H>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(H)) == 0;
}

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

inline Places places(const Case& c) {
  const cuda::AttentionDims d{c.B, c.H, c.Tq, c.Tk, c.D, c.D, c.Hkv};
  Places p{};
  if (c.lay == Lay::packed) {
    p.layout = cuda::AttentionLayout::packed_qkv(d);
    p.q = {0, p.layout.q, c.H, c.Tq, c.D};
    p.k = {c.H * c.D, p.layout.k, c.Hkv, c.Tk, c.D};
    p.v = {(c.H + c.Hkv) * c.D, p.layout.v, c.Hkv, c.Tk, c.D};
    p.in_size = c.B * c.Tq * (c.H + 2 * c.Hkv) * c.D;
  } else {
    // Contiguous: the strides of AttentionLayout::contiguous (D == Dv).
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
void scatter(std::vector<H>& buf, const Place& p, int64_t B, const std::vector<H>& x,
             std::vector<char>* covered = nullptr) {
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
inline void mark(std::vector<char>& covered, const Place& p, int64_t B) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t t = 0; t < p.T; ++t)
        for (int64_t c = 0; c < p.D; ++c) covered[kGuard + p.at(b, h, t, c)] = 1;
}

// Every element outside the covered ones still holds the sentinel (bit for bit).
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

// n uniform values in [-amp, amp] rounded to H.
template <class H> std::vector<H> rounded(std::size_t n, unsigned seed, float amp) {
  const auto f = random_vector(n, seed, -amp, amp);
  std::vector<H> r;
  r.reserve(n);
  for (float x : f) r.emplace_back(x);
  return r;
}

// A case's inputs (logical layouts) from seeds seed .. seed + 3. q larger than k: scores of a
// few units, so the softmax is far from uniform.
template <class H> struct Inputs {
  std::vector<H> q, k, v, dout;
};
template <class H> Inputs<H> inputs(const Case& c, unsigned seed) {
  return {rounded<H>(c.B * c.H * c.Tq * c.D, seed, 2.5f), rounded<H>(c.B * c.Hkv * c.Tk * c.D, seed + 1, 1.0f),
          rounded<H>(c.B * c.Hkv * c.Tk * c.D, seed + 2, 1.0f), rounded<H>(c.B * c.H * c.Tq * c.D, seed + 3, 1.0f)};
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

// The CPU kernel (cpu::attention_forward/backward) on a case's inputs, K and V repeated per
// query head; dk and dv summed back over each group.
template <class H> struct CpuResult {
  std::vector<H> o, dq;
  std::vector<double> dk, dv;
  std::vector<float> lse;
};
template <class H> CpuResult<H> cpu_reference(const Case& c, const Inputs<H>& in) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  const auto kx = expand_kv(in.k, c, c.Tk), vx = expand_kv(in.v, c, c.Tk);
  const cpu::AttentionDims cd{c.B, c.H, c.Tq, c.Tk, c.D, c.D};
  CpuResult<H> r;
  r.o.resize(c.B * c.H * c.Tq * c.D), r.dq.resize(in.q.size()), r.lse.resize(c.B * c.H * c.Tq);
  std::vector<H> dkx(kx.size()), dvx(vx.size());
  cpu::attention_forward<H>(in.q.data(), kx.data(), vx.data(), r.o.data(), r.lse.data(), cd, c.causal, scale);
  cpu::attention_backward<H>(in.q.data(), kx.data(), vx.data(), r.o.data(), in.dout.data(), r.lse.data(),
                             r.dq.data(), dkx.data(), dvx.data(), cd, c.causal, scale);
  r.dk = reduce_kv(dkx, c, c.Tk), r.dv = reduce_kv(dvx, c, c.Tk);
  return r;
}

// What one GPU run of a case produced (logical layouts).
template <class H> struct GpuResult {
  std::vector<H> o, dq, dk, dv;
  std::vector<float> lse;
};

// A run's O, lse, dQ, dK, dV against `want` (a GpuResult or CpuResult): O and the gradients
// within `t` (close_rel_max), lse within 5e-5 absolute; `against` ends each failure's name
// ("o vs the CPU").
template <class H, class Want>
void expect_close_to(const GpuResult<H>& got, const Want& want, const Tol& t, const std::string& against = "") {
  EXPECT_TRUE(close_rel_max(got.o, want.o, t.o, ("o" + against).c_str()));
  EXPECT_TRUE(all_close(got.lse, want.lse, 5e-5, 0.0)) << "lse" << against;
  EXPECT_TRUE(close_rel_max(got.dq, want.dq, t.grad, ("dq" + against).c_str()));
  EXPECT_TRUE(close_rel_max(got.dk, want.dk, t.grad, ("dk" + against).c_str()));
  EXPECT_TRUE(close_rel_max(got.dv, want.dv, t.grad, ("dv" + against).c_str()));
}

// Two runs of one case gave the same bits in O, lse and every gradient (run-to-run determinism).
template <class H> void expect_same_bits(const GpuResult<H>& a, const GpuResult<H>& b) {
  EXPECT_TRUE(bits_equal(a.o, b.o)) << "o";
  EXPECT_TRUE(bits_equal(a.lse, b.lse)) << "lse";
  EXPECT_TRUE(bits_equal(a.dq, b.dq)) << "dq";
  EXPECT_TRUE(bits_equal(a.dk, b.dk)) << "dk";
  EXPECT_TRUE(bits_equal(a.dv, b.dv)) << "dv";
}

// One GPU run's buffers: the inputs scattered into a guarded input buffer, dO into an
// output-shaped one, O, lse and the gradients' buffer (shaped like the input one) filled with
// the sentinel. forward() and backward() call cuda::attention_forward/backward (under whichever
// implementation is selected at the time of the call); result() checks that nothing outside the
// operands was written and gathers the outputs. The host copies live as long as the device ones.
template <class H> class GpuRun {
 public:
  GpuRun(const Case& c, const Inputs<H>& x)
      : c_(c),
        p_(places(c)),
        d_{c.B, c.H, c.Tq, c.Tk, c.D, c.D, c.Hkv},
        scale_(1.0 / std::sqrt(static_cast<double>(c.D))),
        nlse_(c.B * c.H * c.Tq),
        in_h_(input_buffer(p_, c.B, x)),
        out_h_(output_buffer(p_, c.B, nullptr)),
        dout_h_(output_buffer(p_, c.B, &x.dout)),
        grad_h_(in_h_.size(), H(kSentinel)),
        lse_h_(nlse_ + 2 * kGuard, kSentinel),
        in_(in_h_),
        out_(out_h_),
        dout_(dout_h_),
        grad_(grad_h_),
        lse_(lse_h_),
        ws_(static_cast<std::size_t>(cuda::attention_backward_workspace(d_)), MemTag::workspace) {}

  const H* q() const { return in_.ptr + kGuard + p_.q.off; }
  const H* k() const { return in_.ptr + kGuard + p_.k.off; }
  const H* v() const { return in_.ptr + kGuard + p_.v.off; }
  H* o() const { return out_.ptr + kGuard; }
  H* dout() const { return dout_.ptr + kGuard; }
  float* lse() const { return lse_.ptr + kGuard; }
  H* dq() const { return grad_.ptr + kGuard + p_.q.off; }
  H* dk() const { return grad_.ptr + kGuard + p_.k.off; }
  H* dv() const { return grad_.ptr + kGuard + p_.v.off; }
  const cuda::AttentionDims& dims() const { return d_; }
  const cuda::AttentionLayout& layout() const { return p_.layout; }

  void forward() {
    cuda::attention_forward(q(), k(), v(), o(), lse(), d_, p_.layout, c_.causal, scale_, dtype_of<H>, stream());
  }
  void backward() {
    cuda::attention_backward(q(), k(), v(), o(), dout(), lse(), dq(), dk(), dv(), d_, p_.layout, c_.causal, scale_,
                             dtype_of<H>, ws_.ptr, stream());
  }

  GpuResult<H> result() {
    ATH_CUDA(cudaStreamSynchronize(stream()));
    const auto out_h = out_.host(), grad_h = grad_.host();
    const auto lse_h = lse_.host();
    // Bounds: only the operands' elements were written.
    std::vector<char> out_cov(out_h.size(), 0), grad_cov(grad_h.size(), 0), lse_cov(lse_h.size(), 0);
    mark(out_cov, p_.o, c_.B);
    mark(grad_cov, p_.q, c_.B);
    mark(grad_cov, p_.k, c_.B);
    mark(grad_cov, p_.v, c_.B);
    for (int64_t i = 0; i < nlse_; ++i) lse_cov[kGuard + i] = 1;
    EXPECT_TRUE(untouched(out_h, out_cov, "o"));
    EXPECT_TRUE(untouched(grad_h, grad_cov, "dq/dk/dv"));
    EXPECT_TRUE(untouched(lse_h, lse_cov, "lse"));

    GpuResult<H> r;
    r.o = gather(out_h, p_.o, c_.B);
    r.dq = gather(grad_h, p_.q, c_.B);
    r.dk = gather(grad_h, p_.k, c_.B);
    r.dv = gather(grad_h, p_.v, c_.B);
    r.lse.assign(lse_h.begin() + kGuard, lse_h.begin() + kGuard + nlse_);
    return r;
  }

 private:
  // q, k, v in a sentinel-filled input buffer.
  static std::vector<H> input_buffer(const Places& p, int64_t B, const Inputs<H>& x) {
    std::vector<H> buf(p.in_size + 2 * kGuard, H(kSentinel));
    scatter(buf, p.q, B, x.q);
    scatter(buf, p.k, B, x.k);
    scatter(buf, p.v, B, x.v);
    return buf;
  }
  // A sentinel-filled output buffer, holding dO where `dout` is given.
  static std::vector<H> output_buffer(const Places& p, int64_t B, const std::vector<H>* dout) {
    std::vector<H> buf(p.out_size + 2 * kGuard, H(kSentinel));
    if (dout) scatter(buf, p.o, B, *dout);
    return buf;
  }

  Case c_;
  Places p_;
  cuda::AttentionDims d_;
  double scale_;
  int64_t nlse_;
  std::vector<H> in_h_, out_h_, dout_h_, grad_h_;
  std::vector<float> lse_h_;
  DeviceBuffer<H> in_, out_, dout_, grad_;
  DeviceBuffer<float> lse_;
  DeviceBuffer<unsigned char> ws_;
};

}  // namespace athanor::gpu_test::attention_case
