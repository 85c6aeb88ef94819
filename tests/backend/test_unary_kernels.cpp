// Fast unary/activation kernels vs their double-precision reference kernels:
//  - f32 on ~100k elements spanning ordinary, large (|x| up to 100, overflow and
//    underflow of exp), tiny and special (0, ±inf, NaN, denormal) inputs, with the
//    error measured in f32 ulps of the reference value;
//  - the fused backward kernels, on the same inputs;
//  - bf16/f16: the kernel reads 16-bit storage, computes in f32 and rounds once:
//    bit-identical to rounding the f32 kernel's result, and within half an ulp
//    (+ f32 noise) of the reference;
//  - f64 kernels against the reference, and every tail length 1..40.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/activation.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/unary.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
using cpu::Activation;
using cpu::UnaryOp;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Uniform doubles in [lo, hi) from a seeded generator.
std::vector<double> uniform_values(int64_t n, double lo, double hi, uint64_t seed) {
  Generator g(seed);
  Tensor t = empty({n}, TensorOptions(DType::f64));
  uniform_(t, lo, hi, g);
  return t.to_vector();
}

// ~100k inputs for functions of the whole real line: mostly [-10, 10], a quarter in
// [-100, 100] (exp overflow/underflow, tanh/sigmoid saturation, gelu tails), some tiny
// ones, and the special values.
std::vector<double> real_line_inputs(int64_t n = 100003) {
  std::vector<double> v = uniform_values(n, -10, 10, 11);
  const std::vector<double> wide = uniform_values(n / 4, -100, 100, 12), tiny = uniform_values(n / 8, -1e-3, 1e-3, 13);
  for (size_t i = 0; i < wide.size(); ++i) v[4 * i + 1] = wide[i];
  for (size_t i = 0; i < tiny.size(); ++i) v[8 * i + 2] = tiny[i];
  const double specials[] = {0.0, -0.0, 1.0, -1.0, 80.0, -80.0, 88.5, 89.0, -87.0, -103.0, -104.0, 200.0, -200.0,
                             10.0, -10.0, 1e-30, -1e-30, 1e-40, kInf, -kInf, kNaN, 0.625, -0.625, 0.6249999, 9.0, -9.0};
  for (size_t i = 0; i < std::size(specials); ++i) v[i * 37 + 5] = specials[i];
  return v;
}

// Positive inputs over the f32 range (log, sqrt, rsqrt), plus 0, denormals, inf, negatives, NaN.
std::vector<double> positive_inputs(int64_t n = 100003) {
  std::vector<double> v = uniform_values(n, -85, 85, 21);
  for (double& e : v) e = std::exp(e);
  const std::vector<double> near1 = uniform_values(n / 4, 0.5, 2.0, 22);
  for (size_t i = 0; i < near1.size(); ++i) v[4 * i + 3] = near1[i];
  const double specials[] = {0.0, -0.0, 1.0, 2.0, 0.5, 1e-40, 1e-45, 3e-39, kInf, -1.0, -kInf, kNaN, 1.41421356, 0.70710678};
  for (size_t i = 0; i < std::size(specials); ++i) v[i * 41 + 7] = specials[i];
  return v;
}

Tensor f32_tensor(const std::vector<double>& v) { return from_vector(v, {static_cast<int64_t>(v.size())}, TensorOptions(DType::f32)); }

// Spacing of f32 numbers at |r| (2^-149 in the denormal range).
double f32_ulp(double r) {
  const double a = std::fabs(r);
  if (a < std::numeric_limits<float>::min()) return std::ldexp(1.0, -149);
  int e = 0;
  std::frexp(a, &e);
  return std::ldexp(1.0, e - 24);
}

// Every element of `fast` (f32) is within max_ulp f32-ulps of `ref` (double), or
// within atol; NaN and infinities must match exactly.
::testing::AssertionResult within_ulps(const Tensor& fast, const std::vector<double>& ref, const std::vector<double>& in,
                                       const std::function<double(double)>& max_ulp_at, double atol) {
  const std::vector<double> f = fast.to_vector();
  double worst = 0;
  int64_t worst_i = -1, bad = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const double r = ref[i];
    const double r32 = static_cast<float>(r);  // the reference may overflow f32 (e.g. e^88.9)
    if (std::isnan(r) || std::isinf(r32) || std::isnan(f[i]) || std::isinf(f[i])) {
      const bool same = (std::isnan(r) && std::isnan(f[i])) || f[i] == r32;
      if (!same) {
        ++bad;
        if (worst != kInf) worst = kInf, worst_i = static_cast<int64_t>(i);
      }
      continue;
    }
    const double err = std::fabs(f[i] - r);
    if (err <= atol) continue;
    const double ulps = err / f32_ulp(r);
    if (ulps > max_ulp_at(in[i])) ++bad;
    if (ulps > worst) worst = ulps, worst_i = static_cast<int64_t>(i);
  }
  if (bad == 0) return ::testing::AssertionSuccess() << "max " << worst << " ulp";
  return ::testing::AssertionFailure() << bad << " of " << f.size() << " elements beyond the ulp bound (atol "
                                       << atol << "); worst " << worst << " ulp at " << worst_i << ": input "
                                       << in[worst_i] << " -> " << f[worst_i] << " vs reference " << ref[worst_i];
}

// Reference results in double (the ref kernels on an f64 tensor of the same values).
std::vector<double> ref_unary(UnaryOp op, const std::vector<double>& in) {
  return cpu::ref::unary(op, from_vector(in, {static_cast<int64_t>(in.size())}, TensorOptions(DType::f64))).to_vector();
}
std::vector<double> ref_act(Activation a, const std::vector<double>& in) {
  return cpu::ref::activation_forward(a, from_vector(in, {static_cast<int64_t>(in.size())}, TensorOptions(DType::f64))).to_vector();
}

template <class T> Tensor run_unary(UnaryOp op, const Tensor& x) {
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()));
  cpu::unary<T>(op, x.data_ptr<T>(), out.data_ptr<T>(), x.numel());
  return out;
}
template <class T> Tensor run_act(Activation a, const Tensor& x) {
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()));
  cpu::activation_forward<T>(a, x.data_ptr<T>(), out.data_ptr<T>(), x.numel());
  return out;
}
template <class T> Tensor run_act_backward(Activation a, const Tensor& saved, const Tensor& g) {
  Tensor out = empty(saved.sizes(), TensorOptions(saved.dtype()));
  cpu::activation_backward<T>(a, saved.data_ptr<T>(), g.data_ptr<T>(), out.data_ptr<T>(), saved.numel());
  return out;
}
Tensor run_unary_any(UnaryOp op, const Tensor& x) {
  switch (x.dtype()) {
    case DType::bf16: return run_unary<bfloat16>(op, x);
    case DType::f16: return run_unary<float16>(op, x);
    case DType::f64: return run_unary<double>(op, x);
    default: return run_unary<float>(op, x);
  }
}
Tensor run_act_any(Activation a, const Tensor& x) {
  switch (x.dtype()) {
    case DType::bf16: return run_act<bfloat16>(a, x);
    case DType::f16: return run_act<float16>(a, x);
    case DType::f64: return run_act<double>(a, x);
    default: return run_act<float>(a, x);
  }
}

const std::vector<Activation> kActs = {Activation::tanh, Activation::sigmoid, Activation::relu,
                                       Activation::gelu, Activation::gelu_tanh, Activation::silu};

// Bit patterns of 16-bit tensors (for exact comparisons, NaN included).
std::vector<uint16_t> bits16(const Tensor& t) {
  std::vector<uint16_t> b(t.numel());
  std::memcpy(b.data(), t.raw_data(), b.size() * 2);
  return b;
}
}  // namespace

// ---- f32 forward kernels vs the reference, measured in ulps.
// Tolerances: exp/log <= 2 ulp (polynomial + Cody-Waite / exact exponent split);
// sqrt, square <= 0.5 ulp, abs exact (IEEE ops); rsqrt <= 2 ulp (sqrt then divide);
// tanh, sigmoid, silu <= 4 ulp; gelu (erfc-based normal CDF with an exact -x²/2) <= 8 ulp;
// gelu_tanh <= 4 ulp + 3 ulp per unit of |2u| (u = √(2/π)(x + 0.044715x³) is rounded in
// f32, and e^{-|2u|} amplifies its relative error |2u| times: inherent to f32, matters only
// in the far negative tail where y < 1e-10). Below 1e-37 in magnitude (denormal results:
// exp underflow, the deep tails) only an absolute error of 1e-37 is asked.
TEST(UnaryKernels, F32UnaryMatchesReferenceUlps) {
  struct Case { UnaryOp op; std::vector<double> in; double ulp; };
  const std::vector<Case> cases = {
      {UnaryOp::exp, real_line_inputs(), 2},   {UnaryOp::log, positive_inputs(), 2},   {UnaryOp::sqrt, positive_inputs(), 0.5},
      {UnaryOp::rsqrt, positive_inputs(), 2}, {UnaryOp::abs, real_line_inputs(), 0}, {UnaryOp::square, real_line_inputs(), 0.5},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(cpu::unary_op_name(c.op));
    // The reference sees the f32-rounded inputs, exactly what the kernel sees.
    const Tensor x = f32_tensor(c.in);
    const std::vector<double> xin = x.to_vector();
    const auto r = within_ulps(run_unary<float>(c.op, x), ref_unary(c.op, xin), xin, [&](double) { return c.ulp; }, 1e-37);
    EXPECT_TRUE(r);
    RecordProperty(cpu::unary_op_name(c.op), r.message());
  }
}

TEST(UnaryKernels, F32ActivationsMatchReferenceUlps) {
  for (Activation a : kActs) {
    SCOPED_TRACE(cpu::activation_name(a));
    std::function<double(double)> bound = [](double) { return 4.0; };
    if (a == Activation::relu) bound = [](double) { return 0.0; };
    if (a == Activation::gelu) bound = [](double) { return 8.0; };
    if (a == Activation::gelu_tanh)
      bound = [](double x) { return 4.0 + 3.0 * std::fabs(2 * 0.7978845608 * (x + 0.044715 * x * x * x)); };
    const Tensor x = f32_tensor(real_line_inputs());
    const std::vector<double> xin = x.to_vector();
    const auto r = within_ulps(run_act<float>(a, x), ref_act(a, xin), xin, bound, 1e-37);
    EXPECT_TRUE(r);
    RecordProperty(cpu::activation_name(a), r.message());
  }
}

// Saturation and limits that must come out exactly.
TEST(UnaryKernels, F32SpecialValuesExact) {
  const Tensor x = f32_tensor({-kInf, -200, -104, 89, 100, kInf, kNaN, 0});
  const auto e = run_unary<float>(UnaryOp::exp, x).to_vector();
  EXPECT_EQ(e[0], 0.0);
  EXPECT_EQ(e[1], 0.0);
  EXPECT_EQ(e[2], 0.0);  // e^-104 = 6.8e-46 rounds to 0 in f32
  EXPECT_TRUE(std::isinf(e[3]) && e[3] > 0);
  EXPECT_TRUE(std::isinf(e[4]) && e[4] > 0);
  EXPECT_TRUE(std::isinf(e[5]) && e[5] > 0);
  EXPECT_TRUE(std::isnan(e[6]));
  EXPECT_EQ(e[7], 1.0);
  const auto t = run_act<float>(Activation::tanh, f32_tensor({-100, -10, 10, 100, kInf, -kInf, 0})).to_vector();
  EXPECT_EQ(t[0], -1.0);
  EXPECT_EQ(t[1], -1.0);  // tanh(10) = 1 - 4e-9: 1 in f32
  EXPECT_EQ(t[2], 1.0);
  EXPECT_EQ(t[3], 1.0);
  EXPECT_EQ(t[4], 1.0);
  EXPECT_EQ(t[5], -1.0);
  EXPECT_EQ(t[6], 0.0);
  const auto s = run_act<float>(Activation::sigmoid, f32_tensor({-200, 200, kInf, -kInf})).to_vector();
  EXPECT_EQ(s[0], 0.0);
  EXPECT_EQ(s[1], 1.0);
  EXPECT_EQ(s[2], 1.0);
  EXPECT_EQ(s[3], 0.0);
  for (Activation a : {Activation::gelu, Activation::gelu_tanh}) {
    SCOPED_TRACE(cpu::activation_name(a));
    const auto g = run_act<float>(a, f32_tensor({10, -10, 20, -20})).to_vector();
    EXPECT_EQ(g[0], 10.0);  // Phi(10) = 1 - 7.6e-24
    EXPECT_LT(std::fabs(g[1]), 1e-20);
    EXPECT_EQ(g[2], 20.0);
    EXPECT_EQ(g[3], 0.0);
  }
  const auto l = run_unary<float>(UnaryOp::log, f32_tensor({0, -1, kInf, kNaN, 1})).to_vector();
  EXPECT_TRUE(std::isinf(l[0]) && l[0] < 0);
  EXPECT_TRUE(std::isnan(l[1]));
  EXPECT_TRUE(std::isinf(l[2]) && l[2] > 0);
  EXPECT_TRUE(std::isnan(l[3]));
  EXPECT_EQ(l[4], 0.0);
  const auto r = run_act<float>(Activation::relu, f32_tensor({kNaN, -1, 2})).to_vector();
  EXPECT_TRUE(std::isnan(r[0]));
  EXPECT_EQ(r[1], 0.0);
  EXPECT_EQ(r[2], 2.0);
}

// ---- fused backward kernels (f32) vs reference, on finite inputs in [-100, 100].
// The incoming gradient g ~ U(-2, 2); tolerance 1e-6 absolute + 1e-5 relative (the
// formulas differ from the reference's: e.g. gelu_tanh uses 1/(1+e) and e/(1+e)² with
// e = exp(-2u) instead of tanh; tanh/sigmoid's 1 - y² cancels near saturation).
TEST(UnaryKernels, F32ActivationBackwardMatchesReference) {
  std::vector<double> xin = real_line_inputs();
  for (double& v : xin)
    if (!std::isfinite(v) || std::fabs(v) > 100) v = 0.5;
  const Tensor x = f32_tensor(xin);
  const Tensor g = f32_tensor(uniform_values(x.numel(), -2, 2, 31));
  for (Activation a : kActs) {
    SCOPED_TRACE(cpu::activation_name(a));
    const Tensor saved = cpu::activation_backward_uses_output(a) ? run_act<float>(a, x) : x;
    EXPECT_CLOSE(run_act_backward<float>(a, saved, g), cpu::ref::activation_backward(a, saved, g), 1e-6, 1e-5);
  }
}

TEST(UnaryKernels, F32AbsClampBackwardMatchReference) {
  std::vector<double> xin = uniform_values(100003, -3, 3, 41);
  xin[0] = 0.0, xin[1] = -0.5, xin[2] = 0.75;  // the kink and both bounds exactly
  const Tensor x = f32_tensor(xin), g = f32_tensor(uniform_values(100003, -2, 2, 42));
  Tensor out = empty(x.sizes());
  cpu::abs_backward<float>(x.data_ptr<float>(), g.data_ptr<float>(), out.data_ptr<float>(), x.numel());
  EXPECT_CLOSE(out, cpu::ref::abs_backward(x, g), 0, 0);
  EXPECT_EQ(out.to_vector()[0], 0.0);  // abs'(0) = 0
  for (auto [lo, hi] : std::vector<std::pair<double, double>>{{-0.5, 0.75}, {kNaN, 0.75}, {-0.5, kNaN}, {kNaN, kNaN}}) {
    cpu::clamp_backward<float>(x.data_ptr<float>(), lo, hi, g.data_ptr<float>(), out.data_ptr<float>(), x.numel());
    EXPECT_CLOSE(out, cpu::ref::clamp_backward(x, lo, hi, g), 0, 0);
    cpu::clamp<float>(x.data_ptr<float>(), lo, hi, out.data_ptr<float>(), x.numel());
    EXPECT_CLOSE(out, cpu::ref::clamp(x, lo, hi), 0, 0);
  }
}

// ---- 16-bit storage: computed in f32, rounded once.
TEST(UnaryKernels, HalfTypesRoundTheF32ResultOnce) {
  struct In { const char* name; DType dt; double lo, hi, pos_lo, pos_hi; double rtol, atol; };
  // |fast - ref| <= half a 16-bit ulp (relative 2^-8 for bf16, 2^-11 for f16) plus f32 noise.
  // f16 inputs keep results in its normal range (exp(11) < 65504); atol covers f16 subnormals.
  const std::vector<In> kinds = {{"bf16", DType::bf16, -30, 30, 1e-30, 1e30, 0x1p-8 + 2e-6, 1e-37},
                                 {"f16", DType::f16, -9, 11, 1e-4, 6e4, 0x1p-11 + 2e-6, 3e-8}};
  for (const In& k : kinds) {
    SCOPED_TRACE(k.name);
    const int64_t n = 50021;
    // Inputs exactly representable in the 16-bit type: round through it first.
    const Tensor xr = from_vector(uniform_values(n, k.lo, k.hi, 51), {n}, TensorOptions(k.dt));
    std::vector<double> pv = uniform_values(n, std::log(k.pos_lo), std::log(k.pos_hi), 52);
    for (double& v : pv) v = std::exp(v);
    const Tensor xp = from_vector(pv, {n}, TensorOptions(k.dt));
    auto check = [&](const char* what, const Tensor& x, const Tensor& fast16, const Tensor& fast32_on_same, const std::vector<double>& ref) {
      SCOPED_TRACE(what);
      ASSERT_EQ(fast16.dtype(), k.dt);
      // (1) bit-identical to rounding the f32 kernel's output (RNE, as cast_value)
      EXPECT_EQ(bits16(fast16), bits16(fast32_on_same.to(k.dt)));
      // (2) within half an ulp of the double reference (+ f32 noise)
      EXPECT_CLOSE(fast16, from_vector(ref, x.sizes(), TensorOptions(DType::f64)), k.atol, k.rtol);
    };
    for (UnaryOp op : {UnaryOp::exp, UnaryOp::log, UnaryOp::sqrt, UnaryOp::rsqrt, UnaryOp::abs, UnaryOp::square}) {
      const bool positive = op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt;
      Tensor x = positive ? xp : xr;
      if (op == UnaryOp::square && k.dt == DType::f16) x = from_vector(uniform_values(n, -200, 200, 53), {n}, TensorOptions(k.dt));
      check(cpu::unary_op_name(op), x, run_unary_any(op, x), run_unary<float>(op, x.to(DType::f32)), ref_unary(op, x.to_vector()));
    }
    for (Activation a : kActs)
      check(cpu::activation_name(a), xr, run_act_any(a, xr), run_act<float>(a, xr.to(DType::f32)), ref_act(a, xr.to_vector()));
    // The backward kernels also read and write 16-bit storage directly.
    const Tensor g = from_vector(uniform_values(n, -2, 2, 54), {n}, TensorOptions(k.dt));
    for (Activation a : kActs) {
      SCOPED_TRACE(std::string("backward ") + cpu::activation_name(a));
      const Tensor saved = cpu::activation_backward_uses_output(a) ? run_act_any(a, xr) : xr;
      const Tensor fast = k.dt == DType::bf16 ? run_act_backward<bfloat16>(a, saved, g) : run_act_backward<float16>(a, saved, g);
      const Tensor f32 = run_act_backward<float>(a, saved.to(DType::f32), g.to(DType::f32));
      EXPECT_EQ(bits16(fast), bits16(f32.to(k.dt)));
    }
  }
}

// The 16-bit loads and stores of every level (cpu::convert runs them: the vector forms at
// the avx512 levels, cast_value at avx2) convert exactly like the scalar conversions in
// core/half.h (RNE, ties, denormals, overflow to inf, NaN quieted): all 2^16 loads, and
// stores of 2^20 random f32 bit patterns plus the edge cases.
TEST(UnaryKernels, VectorHalfConversionsMatchScalar) {
  std::vector<uint16_t> all(1 << 16);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<uint32_t> pats = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x00018000u, 0x00008000u, 0x7f7fffffu, 0xff7fffffu,
                                0x7fc00001u, 0x7f800001u, 0xff800001u, 0x80000000u, 0x3f7fffffu, 0x00000001u, 0x477ff000u,
                                0x477fefffu, 0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u, 0x7f800000u, 0xff800000u};
  for (uint64_t c = 0; pats.size() < (1u << 20) + 37; ++c) {
    const auto w = philox4x32(99, c);
    pats.insert(pats.end(), w.begin(), w.end());
  }
  std::vector<float> in(pats.size());
  for (size_t i = 0; i < pats.size(); ++i) in[i] = bits_float(pats[i]);
  for (const cpu::Isa level : cpu::isa_supported_levels()) {
    SCOPED_TRACE(std::string("isa level ") + cpu::isa_name(level));
    const cpu::ScopedIsa at(level);
    std::vector<float> fb(all.size()), fh(all.size());
    ASSERT_TRUE(cpu::convert(DType::bf16, DType::f32, all.data(), fb.data(), static_cast<int64_t>(all.size())));
    ASSERT_TRUE(cpu::convert(DType::f16, DType::f32, all.data(), fh.data(), static_cast<int64_t>(all.size())));
    for (size_t i = 0; i < all.size(); ++i) {
      const uint16_t h = all[i];
      ASSERT_EQ(float_bits(fb[i]), float_bits(bf16_bits_to_float(h))) << std::hex << h;
      const float want = f16_bits_to_float(h);
      if (std::isnan(want)) ASSERT_TRUE(std::isnan(fh[i])) << std::hex << h;
      else ASSERT_EQ(float_bits(fh[i]), float_bits(want)) << std::hex << h;
    }
    std::vector<bfloat16> ob(in.size());
    std::vector<float16> oh(in.size());
    const auto n = static_cast<int64_t>(in.size());  // not a multiple of 16: the masked tail too
    ASSERT_TRUE(cpu::convert(DType::f32, DType::bf16, in.data(), ob.data(), n));
    ASSERT_TRUE(cpu::convert(DType::f32, DType::f16, in.data(), oh.data(), n));
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(ob[i].bits, float_to_bf16_bits(in[i])) << std::hex << pats[i];
      ASSERT_EQ(oh[i].bits, float_to_f16_bits(in[i])) << std::hex << pats[i];
    }
  }
}

// ---- f64 kernels (std:: math) vs the reference, and every tail length.
TEST(UnaryKernels, F64AndTailLengths) {
  const std::vector<double> base = uniform_values(40, -5, 5, 61);
  std::vector<double> pos = base;
  for (double& v : pos) v = std::fabs(v) + 0.01;
  for (int64_t n = 1; n <= 40; ++n) {
    SCOPED_TRACE(n);
    const std::vector<double> xv(base.begin(), base.begin() + n), pv(pos.begin(), pos.begin() + n);
    for (DType dt : {DType::f32, DType::f64}) {
      const double tol = dt == DType::f32 ? 2e-6 : 1e-14;
      for (UnaryOp op : {UnaryOp::exp, UnaryOp::log, UnaryOp::sqrt, UnaryOp::rsqrt, UnaryOp::abs, UnaryOp::square}) {
        const bool positive = op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt;
        const Tensor x = from_vector(positive ? pv : xv, {n}, TensorOptions(dt));
        EXPECT_CLOSE(run_unary_any(op, x), cpu::ref::unary(op, x.to(DType::f64)), tol, tol) << cpu::unary_op_name(op);
      }
      for (Activation a : kActs) {
        const Tensor x = from_vector(xv, {n}, TensorOptions(dt));
        EXPECT_CLOSE(run_act_any(a, x), cpu::ref::activation_forward(a, x.to(DType::f64)), tol, tol) << cpu::activation_name(a);
      }
    }
  }
}

TEST(UnaryKernels, PowScalarShortcutsAndGeneral) {
  std::vector<double> xv = uniform_values(10007, 0.01, 10, 71);
  const Tensor x = f32_tensor(xv);
  for (double p : {0.0, 1.0, 2.0, 3.0, 0.5, -0.5, -1.0, 2.5, -1.75, 1.0 / 3.0}) {
    SCOPED_TRACE(p);
    Tensor out = empty(x.sizes());
    cpu::pow_scalar<float>(x.data_ptr<float>(), p, out.data_ptr<float>(), x.numel());
    EXPECT_CLOSE(out, cpu::ref::pow(x.to(DType::f64), p), 1e-30, 1e-6);  // powf / exact ops: ~1 ulp
  }
}


// The autocast conversions (cpu::convert, 16 lanes at a time) against the scalar
// definition of the rounding (core/half.h: float_to_bf16_bits and the f16 conversion),
// bit for bit: ties to even, values just below and above the rounding boundaries,
// denormals of both formats, overflow to inf, signed zeros, NaN, on 1 and 2 threads and
// lengths with a vector tail and more than one parallel block.
TEST(UnaryKernels, ConvertRoundsExactlyAsCastValue) {
  std::vector<float> f;
  const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65520.0f, 1e-40f, -3e-39f, 6e-8f, 3e-5f, 1e38f, 3.4e38f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min()};
  for (float v : specials) f.push_back(v);
  uint32_t state = 12345;
  for (int i = 0; f.size() < 200003; ++i) {  // > kGrainCheap: the threaded path; odd length: a tail
    state = state * 1664525u + 1013904223u;
    uint32_t bits = state;
    if (i % 3 == 0) bits = (bits & 0xffff0000u) | 0x8000u;           // a bf16 tie
    if (i % 3 == 1) bits = (bits & 0xffffe000u) | 0x1000u;           // an f16 tie (in range or not)
    float v;
    std::memcpy(&v, &bits, 4);
    f.push_back(v);
  }
  const int64_t n = static_cast<int64_t>(f.size());
  const int threads = omp_get_max_threads();
  for (int t : {1, 2}) {
    omp_set_num_threads(t);
    std::vector<bfloat16> b(n);
    std::vector<float16> h(n);
    ASSERT_TRUE(cpu::convert(DType::f32, DType::bf16, f.data(), b.data(), n));
    ASSERT_TRUE(cpu::convert(DType::f32, DType::f16, f.data(), h.data(), n));
    std::vector<float> fb(n), fh(n);
    ASSERT_TRUE(cpu::convert(DType::bf16, DType::f32, b.data(), fb.data(), n));
    ASSERT_TRUE(cpu::convert(DType::f16, DType::f32, h.data(), fh.data(), n));
    for (int64_t i = 0; i < n; ++i) {
      const bfloat16 wb = cast_value<bfloat16>(f[i]);
      const float16 wh = cast_value<float16>(f[i]);
      ASSERT_EQ(b[i].bits, wb.bits) << "bf16 of " << f[i] << " (element " << i << ", " << t << " threads)";
      ASSERT_EQ(h[i].bits, wh.bits) << "f16 of " << f[i] << " (element " << i << ", " << t << " threads)";
      const float bb = cast_value<float>(wb), hh = cast_value<float>(wh);
      ASSERT_EQ(std::memcmp(&fb[i], &bb, 4), 0) << "f32 of bf16 bits " << wb.bits;
      ASSERT_EQ(std::memcmp(&fh[i], &hh, 4), 0) << "f32 of f16 bits " << wh.bits;
    }
  }
  omp_set_num_threads(threads);
  EXPECT_FALSE(cpu::convert(DType::f32, DType::f64, f.data(), nullptr, n)) << "other pairs are left to the caller";
}

}  // namespace athanor
