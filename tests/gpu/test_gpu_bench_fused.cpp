// The fused kernels of issue 22, each against the CPU reference and the unfused CUDA path:
//  - cuBLASLt's dgelu epilogue: (A B) ⊙ gelu_tanh'(aux) against a double reference in bf16
//    (the ops use the epilogues for 16-bit operands only); with A B = 1 the epilogue's own
//    derivative shows, and it must be tanh-GELU's rather than erf-GELU's (closer to the first
//    over [-3, 3]: they differ by up to 8.7e-4, near x = -2) within bf16's rounding plus a fast
//    tanh's error;
//  - cuBLASLt's bias_grad (BGRADB) epilogue: A^T B with Σ_k over A's rows, bf16, and bf16
//    operands with f32 C (the f32-master gradient);
//  - the ops that use them: gelu_linear's and linear's gradients with the epilogues on, off,
//    and on the CPU, in f32 (never fused: the exact mode) and under bf16 autocast, at a width
//    cuBLASLt takes (64) and one it declines (36: dgelu needs a multiple of 8, the unfused path runs);
//  - the fused classifier: cross_entropy's gradient written over the logits when the model
//    dropped them: the same gradients as the unfused path and the CPU, the step's peak device
//    memory lower by the [N, C] logits' bytes; not in place when the caller keeps its logits
//    (they stay intact) or the backward retains the graph (a second backward still works);
//  - the one-read forward (online softmax) on rows with -inf logits, large offsets, label
//    smoothing and ignored targets, against the CPU.
#include <cmath>
#include <numbers>
#include <optional>
#include <vector>

#include "athanor/autograd/engine.h"
#include "athanor/core/half.h"
#include "athanor/ops.h"
#include "athanor/ops/autocast.h"
#include "athanor/ops/gelu_linear.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/loss_targets.h"
#include "gpu_test.h"
#include "train/device_runtime.h"

using namespace athanor;
using namespace athanor::gpu_test;

namespace {

double gelu_erf_grad(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * std::numbers::pi);
}
double gelu_tanh_grad(double x) {
  const double k = 0.7978845608028654, c = 0.044715;
  const double t = std::tanh(k * (x + c * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
}

template <class H>
std::vector<float> rounded(const std::vector<float>& v) {  // the values the device sees in H
  std::vector<float> r;
  for (float x : v) r.push_back(static_cast<float>(H(x)));
  return r;
}
template <class H>
std::vector<H> as(const std::vector<float>& v) {
  std::vector<H> r;
  for (float x : v) r.emplace_back(x);
  return r;
}
template <class H>
std::vector<double> to_double(const std::vector<H>& v) {
  std::vector<double> r;
  for (H x : v) r.push_back(static_cast<double>(static_cast<float>(x)));
  return r;
}

// Restores the A/B switches whatever a test does.
struct FusedSwitches {
  bool epi = cuda::fused_epilogues_enabled(), cls = cuda::fused_classifier_enabled();
  ~FusedSwitches() {
    cuda::set_fused_epilogues(epi);
    cuda::set_fused_classifier(cls);
  }
};

// ---- dgelu ------------------------------------------------------------------------------

template <class H>
void check_dgelu(DType dt, int64_t M, int64_t N, int64_t K, bool identity, double rtol, double atol) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
               (identity ? " (A B = 1)" : ""));
  std::vector<float> A = random_vector(M * K, 11), B = random_vector(K * N, 12), X = random_vector(M * N, 13, -3.0f, 3.0f);
  if (identity) {  // A = I [M, M], B = ones: A B = 1 exactly, so C = gelu'(aux) rounded once
    ASSERT_EQ(K, M);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k) A[i * K + k] = i == k ? 1.0f : 0.0f;
    std::fill(B.begin(), B.end(), 1.0f);
    X[0] = -2.02f;  // where tanh-GELU's and erf-GELU's derivatives differ most
  }
  A = rounded<H>(A), B = rounded<H>(B), X = rounded<H>(X);
  std::vector<double> want(M * N), erf_want(M * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += static_cast<double>(A[i * K + k]) * B[k * N + j];
      want[i * N + j] = s * gelu_tanh_grad(X[i * N + j]);
      erf_want[i * N + j] = s * gelu_erf_grad(X[i * N + j]);
    }
  DeviceBuffer<H> a(as<H>(A)), b(as<H>(B)), x(as<H>(X)), c(static_cast<std::size_t>(M * N));
  cuda::GemmArgs g;
  g.dtype = dt, g.m = M, g.n = N, g.k = K, g.a = a.ptr, g.b = b.ptr, g.c = c.ptr, g.aux = x.ptr, g.aux_ld = N;
  g.epilogue = cuda::GemmEpilogue::dgelu;
  if (!cuda::try_gemm(g, 0, stream())) {  // not an error (the op runs unfused, checked below), but said
    std::cout << "[fused] cuBLASLt declines dgelu in " << dtype_name(dt) << " at M=" << M << " N=" << N << " K=" << K
              << ": gelu_linear's backward runs unfused there\n";
    ::testing::Test::RecordProperty("dgelu_declined", std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K));
    return;
  }
  const std::vector<double> got = to_double(c.host());
  EXPECT_TRUE(all_close(got, want, atol, rtol));
  if (identity) {  // which GELU: the squared distance to each derivative over the 4096 points
    double to_tanh = 0, to_erf = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      to_tanh += (got[i] - want[i]) * (got[i] - want[i]), to_erf += (got[i] - erf_want[i]) * (got[i] - erf_want[i]);
    EXPECT_LT(to_tanh, to_erf) << "cuBLASLt's dgelu is closer to erf-GELU's derivative than to tanh-GELU's (the ops' GELU)";
  }
}

TEST(GpuFused, DgeluEpilogueIsTanhGeluGradientTimesTheProduct) {
  ATH_REQUIRE_GPU();
  // Tolerances: bf16's rounding of the result (2^-9 relative, 8e-3 asked) plus, absolute, what a
  // fast tanh in the epilogue may cost (~1e-3 of gelu'(x) near x = -2, times |A B|).
  check_dgelu<bfloat16>(DType::bf16, 64, 96, 80, false, 8e-3, 1.5e-2);
  check_dgelu<bfloat16>(DType::bf16, 64, 64, 64, true, 8e-3, 2e-3);  // C = gelu'(x) rounded once
  // GPT-2's c_proj shape at 256 tokens: M = 256, in = 3072, out = 768.
  check_dgelu<bfloat16>(DType::bf16, 256, 3072, 768, false, 8e-3, 5e-2);  // |A B| up to ~40 here
}

TEST(GpuFused, DgeluDeclinesAWidthThatIsNotAMultipleOf8) {
  ATH_REQUIRE_GPU();
  DeviceBuffer<float> a(std::vector<float>(8 * 4, 1.0f)), b(std::vector<float>(4 * 12, 1.0f)), x(std::vector<float>(8 * 12, 0.5f)),
      c(8 * 12);
  cuda::GemmArgs g;
  g.m = 8, g.n = 12, g.k = 4, g.a = a.ptr, g.b = b.ptr, g.c = c.ptr, g.aux = x.ptr, g.aux_ld = 12;
  g.epilogue = cuda::GemmEpilogue::dgelu;
  EXPECT_FALSE(cuda::try_gemm(g, 0, stream()));
  EXPECT_THROW(cuda::gemm(g, 0, stream()), Error);  // the throwing form names the rule
}

// ---- bias_grad ------------------------------------------------------------------------------

template <class H, class C>
void check_bias_grad(DType dt, bool c_f32, int64_t out, int64_t in, int64_t M, double rtol) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + (c_f32 ? " (f32 C)" : "") + " out=" + std::to_string(out) + " in=" +
               std::to_string(in) + " M=" + std::to_string(M));
  // dW [out, in] = dz^T [out, M] h [M, in], db [out] = Σ_rows dz.
  const std::vector<float> dz = rounded<H>(random_vector(M * out, 21)), h = rounded<H>(random_vector(M * in, 22));
  std::vector<double> dw(out * in, 0.0), db(out, 0.0);
  double scale = 0;
  for (int64_t r = 0; r < M; ++r)
    for (int64_t o = 0; o < out; ++o) {
      db[o] += dz[r * out + o];
      for (int64_t i = 0; i < in; ++i) dw[o * in + i] += static_cast<double>(dz[r * out + o]) * h[r * in + i];
    }
  for (double v : dw) scale = std::max(scale, std::abs(v));
  DeviceBuffer<H> a(as<H>(dz)), b(as<H>(h));
  DeviceBuffer<C> c(static_cast<std::size_t>(out * in)), bias(static_cast<std::size_t>(out));
  cuda::GemmArgs g;
  g.dtype = dt, g.trans_a = true, g.m = out, g.n = in, g.k = M, g.a = a.ptr, g.b = b.ptr, g.c = c.ptr, g.bias = bias.ptr;
  g.epilogue = cuda::GemmEpilogue::bias_grad;
  g.c_f32 = c_f32;
  if (!cuda::try_gemm(g, 0, stream())) {  // not an error (the op sums the columns, checked below), but said
    std::cout << "[fused] cuBLASLt declines bias_grad in " << dtype_name(dt) << (c_f32 ? " with f32 C" : "") << " at out=" << out
              << " in=" << in << " M=" << M << ": a linear's db runs as separate column sums there\n";
    ::testing::Test::RecordProperty(c_f32 ? "bias_grad_f32c_declined" : "bias_grad_declined",
                                    std::to_string(out) + "x" + std::to_string(in));
    return;
  }
  EXPECT_TRUE(all_close(to_double(c.host()), dw, rtol * scale, rtol));
  double bscale = 0;
  for (double v : db) bscale = std::max(bscale, std::abs(v));
  EXPECT_TRUE(all_close(to_double(bias.host()), db, rtol * bscale, rtol));
}

TEST(GpuFused, BiasGradEpilogueSumsTheRowsOfTheGradient) {
  ATH_REQUIRE_GPU();
  check_bias_grad<bfloat16, bfloat16>(DType::bf16, false, 64, 32, 128, 1e-2);
  check_bias_grad<bfloat16, float>(DType::bf16, true, 64, 32, 128, 1e-4);  // the f32-master dW and db
  check_bias_grad<bfloat16, float>(DType::bf16, true, 768, 3072, 256, 1e-4);  // GPT-2's c_fc at 256 tokens
}

// ---- the ops ----------------------------------------------------------------------------

struct LinearGrads {
  std::vector<double> loss, dx, dw, db;
};

// loss = Σ (op(x, W, b) ⊙ r) through gelu_linear or linear, on `d`, optionally under autocast.
LinearGrads linear_grads(bool gelu, Device d, int64_t in, std::optional<DType> ac_dtype) {
  const int64_t Bn = 3, T = 5, out = 48;
  const auto f32 = TensorOptions(DType::f32);
  Tensor x = from_vector(random_vector(Bn * T * in, 31, -2.5f, 2.5f), {Bn, T, in}, f32).to(d).requires_grad_(true);
  Tensor w = from_vector(random_vector(out * in, 32, -0.2f, 0.2f), {out, in}, f32).to(d).requires_grad_(true);
  Tensor b = from_vector(random_vector(out, 33), {out}, f32).to(d).requires_grad_(true);
  const Tensor r = from_vector(random_vector(Bn * T * out, 34), {Bn, T, out}, f32).to(d);
  Tensor loss;
  {
    std::optional<autocast> ac;
    if (ac_dtype) ac.emplace(*ac_dtype);
    Tensor y = gelu ? gelu_linear(x, w, b) : linear(x, w, b);
    loss = sum(mul(y, r));
  }
  backward({loss});
  return {loss.cpu().to_vector(), x.grad().cpu().to_vector(), w.grad().cpu().to_vector(), b.grad().cpu().to_vector()};
}

double max_rel(const std::vector<double>& g, const std::vector<double>& w) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (!std::isfinite(g[i])) return INFINITY;
    num = std::max(num, std::abs(g[i] - w[i]));
    den = std::max(den, std::abs(w[i]));
  }
  return den > 0 ? num / den : num;
}

void compare_linear(bool gelu, int64_t in, std::optional<DType> ac, double tol_cpu, double tol_unfused) {
  SCOPED_TRACE(std::string(gelu ? "gelu_linear" : "linear") + " in=" + std::to_string(in) + (ac ? " bf16 autocast" : " f32"));
  FusedSwitches restore;
  const LinearGrads cpu = linear_grads(gelu, Device::cpu(), in, ac);
  cuda::set_fused_epilogues(false);
  const LinearGrads unfused = linear_grads(gelu, Device::cuda(0), in, ac);
  cuda::set_fused_epilogues(true);
  const LinearGrads fused = linear_grads(gelu, Device::cuda(0), in, ac);
  for (auto [name, f, u, c] : {std::tuple{"dx", &fused.dx, &unfused.dx, &cpu.dx}, std::tuple{"dW", &fused.dw, &unfused.dw, &cpu.dw},
                               std::tuple{"db", &fused.db, &unfused.db, &cpu.db}}) {
    EXPECT_LE(max_rel(*f, *u), tol_unfused) << name << ": fused against unfused";
    EXPECT_LE(max_rel(*f, *c), tol_cpu) << name << ": fused against the cpu";
  }
}

TEST(GpuFused, GeluLinearAndLinearGradientsWithTheEpiloguesMatchUnfusedAndTheCpu) {
  ATH_REQUIRE_GPU();
  for (bool gelu : {true, false})
    for (int64_t in : {64, 36}) {
      compare_linear(gelu, in, std::nullopt, 1e-5, 1e-5);
      compare_linear(gelu, in, DType::bf16, 2e-2, 1e-2);
    }
}

// ---- the fused classifier -----------------------------------------------------------------

struct ClassifierRun {
  std::vector<double> loss, dh, dw;
  std::size_t peak = 0;
};

// loss = cross_entropy(h W^T, t) with the logits [N, C] an intermediate the caller drops (as
// GPT::loss does), or keeps (keep); the peak device memory over backward.
ClassifierRun classifier(Device d, DType dt, int64_t N, int64_t C, int64_t D, bool keep = false, bool twice = false) {
  const auto opts = TensorOptions(DType::f32);
  Tensor h = from_vector(random_vector(N * D, 41), {N, D}, opts).to(d).to(dt).detach().requires_grad_(true);
  Tensor w = from_vector(random_vector(C * D, 42, -0.5f, 0.5f), {C, D}, opts).to(d).to(dt).detach().requires_grad_(true);
  std::vector<int64_t> t(N);
  for (int64_t i = 0; i < N; ++i) t[i] = (i * 7919) % C;
  t[3] = -100;  // one ignored row
  const Tensor tgt = from_vector(t, {N}).to(d);
  Tensor loss, kept;
  std::vector<double> kept_before;
  {
    Tensor logits = linear(h, w);
    loss = cross_entropy(logits, tgt, -100, 0.05);
    if (keep) kept = logits, kept_before = logits.cpu().to_vector();
  }
  ClassifierRun r;
  r.loss = loss.cpu().to_vector();
  if (!d.is_cpu()) {
    train::synchronize_device(d);
    train::reset_device_memory_peak(d);
  }
  if (twice) backward({loss}, {}, /*retain_graph=*/true);
  backward({loss});
  if (!d.is_cpu()) r.peak = train::device_memory_stats(d).peak_total;
  if (keep) {
    EXPECT_EQ(kept.cpu().to_vector(), kept_before) << "the caller's logits changed";
  }
  r.dh = h.grad().cpu().to_vector(), r.dw = w.grad().cpu().to_vector();
  return r;
}

TEST(GpuFused, ClassifierWritesTheLogitsGradientInPlaceAndSavesItsBytes) {
  ATH_REQUIRE_GPU();
  FusedSwitches restore;
  const int64_t N = 512, C = 4096, D = 8;  // the logits dominate: N C against W's C D and h's N D
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const double tol = dt == DType::f32 ? 1e-5 : 2e-2;
    const ClassifierRun cpu = classifier(Device::cpu(), DType::f32, N, C, D);
    cuda::set_fused_classifier(false);
    const ClassifierRun unfused = classifier(Device::cuda(0), dt, N, C, D);
    cuda::set_fused_classifier(true);
    const ClassifierRun fused = classifier(Device::cuda(0), dt, N, C, D);
    EXPECT_EQ(fused.loss, unfused.loss);  // the forward is the same kernel either way
    EXPECT_LE(max_rel(fused.loss, cpu.loss), dt == DType::f32 ? 1e-5 : 1e-2);
    // The same kernel writes the same values, only elsewhere (the GEMMs after it may pick
    // another algorithm for another address's alignment: not asked to be bitwise).
    EXPECT_LE(max_rel(fused.dh, unfused.dh), 1e-6);
    EXPECT_LE(max_rel(fused.dw, unfused.dw), 1e-6);
    EXPECT_LE(max_rel(fused.dh, cpu.dh), tol);
    EXPECT_LE(max_rel(fused.dw, cpu.dw), tol);
    // Without the [N, C] gradient buffer the backward's peak drops by its bytes, less what the
    // linear's backward allocates while the gradient (in the logits' place) is still alive: dW
    // [C, D] and dh [N, D], and their .grad copies, ~7% of the logits here; 90% is asked.
    const std::size_t logits_bytes = static_cast<std::size_t>(N * C) * dtype_size(dt);
    EXPECT_GE(static_cast<double>(unfused.peak) - static_cast<double>(fused.peak), 0.9 * static_cast<double>(logits_bytes))
        << "peak over backward: unfused " << unfused.peak << " B, fused " << fused.peak << " B, logits " << logits_bytes << " B";
  }
}

TEST(GpuFused, ClassifierLeavesKeptLogitsAndRetainedGraphsAlone) {
  ATH_REQUIRE_GPU();
  FusedSwitches restore;
  cuda::set_fused_classifier(true);
  const int64_t N = 64, C = 512, D = 16;
  const ClassifierRun base = classifier(Device::cuda(0), DType::f32, N, C, D);
  // The caller keeps its logits: the gradient goes elsewhere, the logits are intact (checked
  // inside), the gradients are the same.
  const ClassifierRun kept = classifier(Device::cuda(0), DType::f32, N, C, D, /*keep=*/true);
  EXPECT_LE(max_rel(kept.dh, base.dh), 1e-6);  // the same values, the GEMMs after may pick other algorithms
  // retain_graph: the first backward may not consume the logits; the second (freeing) one may.
  const ClassifierRun twice = classifier(Device::cuda(0), DType::f32, N, C, D, false, /*twice=*/true);
  std::vector<double> doubled = base.dh;
  for (double& v : doubled) v *= 2;
  EXPECT_LE(max_rel(twice.dh, doubled), 1e-5);
}

TEST(GpuFused, OneReadForwardMatchesTheCpuOnHardRows) {
  ATH_REQUIRE_GPU();
  const int64_t N = 6, C = 3000;
  std::vector<float> x = random_vector(N * C, 51, -4.0f, 4.0f);
  for (int64_t c = 0; c < C; c += 3) x[0 * C + c] = -INFINITY;  // masked entries
  for (int64_t c = 0; c < C; ++c) x[1 * C + c] += 80.0f;      // a large common offset
  x[2 * C + C - 1] = 40.0f;                                     // the max at the row's end (a rescale late)
  x[3 * C + 0] = 40.0f;                                         // the max first
  const std::vector<int64_t> t = {1, 5, 2999, 7, -100, 11};
  for (double smoothing : {0.0, 0.1}) {
    // Smoothing averages every logit: a -inf one makes the loss +inf on both devices (and
    // inf - inf compares as NaN), so its masked entries become merely very negative there.
    std::vector<float> xs = x;
    if (smoothing > 0)
      for (float& v : xs) v = std::isinf(v) ? -30.0f : v;
    const Tensor lc = from_vector(xs, {N, C}, TensorOptions(DType::f32)), tc = from_vector(t, {N});
    const Tensor want = cross_entropy(lc, tc, -100, smoothing, Reduction::none);
    const Tensor got = cross_entropy(lc.cuda(), tc.cuda(), -100, smoothing, Reduction::none);
    EXPECT_TRUE(all_close(got.cpu().to_vector(), want.to_vector(), 1e-5, 1e-5)) << "label smoothing " << smoothing;
  }
}

}  // namespace
