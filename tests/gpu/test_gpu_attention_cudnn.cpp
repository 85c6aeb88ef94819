// cuDNN's fused flash attention (src/backend/cuda/attention_cudnn.h, candidate attention_cudnn)
// against the reference CUDA kernels (attention.cu under ATHANOR_CUDA_ATTENTION=reference) and
// the CPU kernel: O and lse of cuDNN's forward, dQ, dK, dV of its backward, and the mixed pairs
// (cuDNN forward + reference backward, reference forward + cuDNN backward: the lse conventions
// must agree). bf16 and f16, D 64 and 128, causal and not, T not a multiple of 64, Tq != Tk,
// GPT-2's packed qkv and contiguous layouts. Every output buffer starts filled with a sentinel
// that must survive outside the operands (attention_test_case.h). cuDNN's calls are made
// directly, so a silent fallback to our kernels cannot pass for cuDNN; one test checks that
// attention_forward/backward dispatch to it with the candidate on.
// Then the host logic (no GPU needed): the decline rule, the loader's unavailable paths, and
// (where the library loads, as on the CI machine) both graphs' descriptors finalized by cuDNN.
//
// Tolerances are the other attention tests' (test_gpu_attention.cpp), max |got - want| / max |want|:
//   f16: O 3e-3, grads 5e-3;  bf16: O 1e-2, grads 2e-2;  lse (f32): 5e-5 absolute.
#include <cmath>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "athanor/core/error.h"
#include "athanor/core/half.h"
#include "attention_test_case.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/attention_fast.h"
#include "backend/cuda/candidates.h"
#include "backend/cuda/cudnn_loader.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;
using namespace athanor::gpu_test::attention_case;

namespace {

// A GPU and cuDNN, or the test is skipped with the reason.
#define ATH_REQUIRE_CUDNN()                                                                     \
  do {                                                                                          \
    ATH_REQUIRE_GPU();                                                                          \
    if (!cuda::cudnn_available()) GTEST_SKIP() << "cuDNN unavailable: " << cuda::cudnn_unavailable_reason(); \
  } while (0)

struct ImplGuard {
  cuda::AttentionImpl saved = cuda::attention_impl();
  explicit ImplGuard(cuda::AttentionImpl impl) { cuda::set_attention_impl(impl); }
  ~ImplGuard() { cuda::set_attention_impl(saved); }
};

enum class Side { cudnn, reference };

// The forward by `fwd`, then the backward by `bwd` on its O and lse. cuDNN's side is called
// directly (it must take the call: a false return fails the test with cuDNN's reason).
template <class H> GpuResult<H> run_gpu(const Case& c, Side fwd, Side bwd, const Inputs<H>& x) {
  const ImplGuard guard(cuda::AttentionImpl::reference);  // our side: the reference kernels
  GpuRun<H> run(c, x);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  EXPECT_TRUE(cuda::attention_cudnn_supported(run.q(), run.k(), run.v(), run.o(), run.dims(), run.layout(),
                                              dtype_of<H>));
  if (fwd == Side::cudnn)
    EXPECT_TRUE(cuda::attention_cudnn_forward(run.q(), run.k(), run.v(), run.o(), run.lse(), run.dims(), run.layout(),
                                              c.causal, scale, dtype_of<H>, stream()))
        << cuda::attention_cudnn_last_failure();
  else
    run.forward();
  if (bwd == Side::cudnn) {
    DeviceBuffer<unsigned char> ws(static_cast<std::size_t>(cuda::attention_backward_workspace(run.dims())),
                                   MemTag::workspace);
    EXPECT_TRUE(cuda::attention_cudnn_backward(run.q(), run.k(), run.v(), run.o(), run.dout(), run.lse(), run.dq(),
                                               run.dk(), run.dv(), run.dims(), run.layout(), c.causal, scale,
                                               dtype_of<H>, ws.ptr, stream()))
        << cuda::attention_cudnn_last_failure();
    return run.result();  // synchronises before ws goes back to the pool
  }
  run.backward();
  return run.result();
}

// cuDNN's forward and backward against the reference kernels (and the CPU), and the mixed pairs.
template <class H> void check_case(const Case& c, bool with_cpu = true, unsigned seed = 1) {
  SCOPED_TRACE(describe(c));
  const Inputs<H> x = inputs<H>(c, seed);
  const Tol t = tol_for<H>();
  const GpuResult<H> dnn = run_gpu<H>(c, Side::cudnn, Side::cudnn, x);
  const GpuResult<H> ref = run_gpu<H>(c, Side::reference, Side::reference, x);
  expect_close_to(dnn, ref, t, " vs the reference kernel");
  for (const auto& [fwd, bwd, what] : {std::tuple{Side::cudnn, Side::reference, "cuDNN fwd + reference bwd"},
                                       std::tuple{Side::reference, Side::cudnn, "reference fwd + cuDNN bwd"}}) {
    SCOPED_TRACE(what);
    const GpuResult<H> mixed = run_gpu<H>(c, fwd, bwd, x);
    EXPECT_TRUE(close_rel_max(mixed.dq, ref.dq, t.grad, "dq vs the reference kernels"));
    EXPECT_TRUE(close_rel_max(mixed.dk, ref.dk, t.grad, "dk vs the reference kernels"));
    EXPECT_TRUE(close_rel_max(mixed.dv, ref.dv, t.grad, "dv vs the reference kernels"));
  }
  if (with_cpu) expect_close_to(dnn, cpu_reference(c, x), t, " vs the CPU");
}

}  // namespace

// ---- on the GPU ------------------------------------------------------------------------------
// GPT-2's case: packed qkv [B, T, 3, H, D] read in place, causal, D 64.
TEST(GpuAttentionCudnn, Bf16CausalPackedGpt2D64) {
  ATH_REQUIRE_CUDNN();
  check_case<bfloat16>({2, 12, 12, 256, 256, 64, true, Lay::packed});
}
TEST(GpuAttentionCudnn, Bf16CausalT200D128AndTqNeTk) {
  ATH_REQUIRE_CUDNN();
  check_case<bfloat16>({2, 3, 3, 200, 200, 128, true, Lay::contiguous});
  check_case<bfloat16>({1, 2, 2, 50, 131, 64, true, Lay::contiguous});  // causal top-left with Tq != Tk
}
TEST(GpuAttentionCudnn, Bf16NonCausalTqNeTkD64) {
  ATH_REQUIRE_CUDNN();
  check_case<bfloat16>({2, 4, 4, 50, 131, 64, false, Lay::contiguous});
  check_case<bfloat16>({1, 4, 4, 77, 77, 64, false, Lay::packed});
}
TEST(GpuAttentionCudnn, F16CausalPackedD64T77) {
  ATH_REQUIRE_CUDNN();
  check_case<float16>({2, 4, 4, 77, 77, 64, true, Lay::packed});
}
TEST(GpuAttentionCudnn, F16NonCausalD128T130) {
  ATH_REQUIRE_CUDNN();
  check_case<float16>({1, 2, 2, 130, 130, 128, false, Lay::contiguous});
}
// A grid that fills the GPU at GPT-2's head dim; against the reference kernel only.
TEST(GpuAttentionCudnn, Bf16FillsTheGpu) {
  ATH_REQUIRE_CUDNN();
  check_case<bfloat16>({4, 12, 12, 1024, 1024, 64, true, Lay::packed}, /*with_cpu=*/false);
}

// The backward asks for cuDNN's deterministic form (attention_cudnn.h): the same inputs give
// the same bits, run to run.
TEST(GpuAttentionCudnn, BackwardIsBitIdenticalRunToRun) {
  ATH_REQUIRE_CUDNN();
  const Case c{2, 12, 12, 512, 512, 64, true, Lay::packed};
  const auto x = inputs<bfloat16>(c, 7);
  const auto a = run_gpu<bfloat16>(c, Side::cudnn, Side::cudnn, x);
  expect_same_bits(a, run_gpu<bfloat16>(c, Side::cudnn, Side::cudnn, x));
}

// With the candidate on (and the implementation not "reference"), attention_forward and
// attention_backward take cuDNN's path: bit for bit what the direct calls give. Grouped-query
// heads are declined and run on our kernels.
TEST(GpuAttentionCudnn, DispatchWithTheCandidateOn) {
  ATH_REQUIRE_CUDNN();
  const Case c{2, 4, 4, 100, 100, 64, true, Lay::packed};
  const auto x = inputs<bfloat16>(c, 3);
  const auto direct = run_gpu<bfloat16>(c, Side::cudnn, Side::cudnn, x);
  GpuResult<bfloat16> via;
  {
    const cuda::CandidateOverride on(cuda::Candidate::attention_cudnn, true);
    const ImplGuard fast(cuda::AttentionImpl::fast);
    GpuRun<bfloat16> run(c, x);
    run.forward();
    run.backward();
    via = run.result();
  }
  EXPECT_TRUE(bits_equal(via.o, direct.o));
  EXPECT_EQ(via.lse, direct.lse);
  EXPECT_TRUE(bits_equal(via.dq, direct.dq));
  EXPECT_TRUE(bits_equal(via.dk, direct.dk));
  EXPECT_TRUE(bits_equal(via.dv, direct.dv));

  // ATHANOR_CUDA_ATTENTION=reference keeps the reference kernels even with the candidate on.
  const auto ref = run_gpu<bfloat16>(c, Side::reference, Side::reference, x);
  {
    const cuda::CandidateOverride on(cuda::Candidate::attention_cudnn, true);
    const ImplGuard reference(cuda::AttentionImpl::reference);
    GpuRun<bfloat16> run(c, x);
    run.forward();
    run.backward();
    const auto r = run.result();
    EXPECT_TRUE(bits_equal(r.o, ref.o));
    EXPECT_TRUE(bits_equal(r.dq, ref.dq));
    EXPECT_TRUE(bits_equal(r.dk, ref.dk));
  }

  // GQA: declined, so the candidate's dispatch gives our fast kernels' bits.
  const Case g{1, 8, 2, 64, 64, 64, true, Lay::contiguous};
  const auto gx = inputs<bfloat16>(g, 5);
  auto once = [&](bool candidate) {
    const cuda::CandidateOverride cand(cuda::Candidate::attention_cudnn, candidate);
    const ImplGuard fast(cuda::AttentionImpl::fast);
    GpuRun<bfloat16> run(g, gx);
    EXPECT_FALSE(cuda::attention_cudnn_supported(run.q(), run.k(), run.v(), run.o(), run.dims(), run.layout(),
                                                 DType::bf16));
    run.forward();
    run.backward();
    return run.result();
  };
  const auto on = once(true), off = once(false);
  EXPECT_TRUE(bits_equal(on.o, off.o));
  EXPECT_TRUE(bits_equal(on.dq, off.dq));
}

// Reports (never fails) whether cuDNN loaded, its version, and why not: the bench and the
// GPU run's log show it.
TEST(GpuAttentionCudnn, ReportsAvailability) {
  const bool ok = cuda::cudnn_available();
  const std::string why = ok ? "" : cuda::cudnn_unavailable_reason();
  std::cout << "[cudnn] available=" << (ok ? "true" : "false") << " version=" << cuda::cudnn_version()
            << (ok ? "" : " reason: " + why) << std::endl;
  RecordProperty("cudnn_available", ok ? "true" : "false");
  RecordProperty("cudnn_version", std::to_string(cuda::cudnn_version()));
  if (!ok) RecordProperty("cudnn_unavailable_reason", why);
  // Consistency, not availability: a reason exactly when unavailable, a 9.x version when loaded.
  EXPECT_EQ(ok, why.empty());
  if (ok) {
    EXPECT_EQ(cuda::cudnn_version() / 10000, 9u);
  } else {
    EXPECT_EQ(cuda::cudnn_version(), 0u);
  }
}

// ---- host logic (no GPU needed) --------------------------------------------------------------
TEST(GpuAttentionCudnn, DeclineRule) {
  const cuda::AttentionDims gpt2{16, 12, 1024, 1024, 64, 64};
  const auto P = cuda::AttentionLayout::packed_qkv(gpt2), C = cuda::AttentionLayout::contiguous(gpt2);
  EXPECT_EQ(cuda::attention_cudnn_decline_reason(gpt2, P, DType::bf16), "");
  EXPECT_EQ(cuda::attention_cudnn_decline_reason(gpt2, C, DType::f16), "");
  const cuda::AttentionDims d128{1, 2, 77, 90, 128, 128};
  EXPECT_EQ(cuda::attention_cudnn_decline_reason(d128, cuda::AttentionLayout::contiguous(d128), DType::bf16), "");
  // f32 / f64 stay on our kernels.
  EXPECT_NE(cuda::attention_cudnn_decline_reason(gpt2, C, DType::f32).find("bf16 and f16"), std::string::npos);
  EXPECT_NE(cuda::attention_cudnn_decline_reason(gpt2, C, DType::f64), "");
  // Grouped-query heads.
  const cuda::AttentionDims gqa{2, 8, 64, 64, 64, 64, 2};
  EXPECT_NE(cuda::attention_cudnn_decline_reason(gqa, cuda::AttentionLayout::contiguous(gqa), DType::bf16)
                .find("grouped-query"),
            std::string::npos);
  // Head dims: multiples of 8 up to 128.
  for (const int64_t D : {8, 16, 32, 72, 96, 128}) {
    const cuda::AttentionDims d{1, 2, 64, 64, D, D};
    EXPECT_EQ(cuda::attention_cudnn_decline_reason(d, cuda::AttentionLayout::contiguous(d), DType::bf16), "")
        << "D=" << D;
  }
  for (const int64_t D : {1, 4, 12, 65, 136, 256}) {
    const cuda::AttentionDims d{1, 2, 64, 64, D, D};
    EXPECT_NE(cuda::attention_cudnn_decline_reason(d, cuda::AttentionLayout::contiguous(d), DType::bf16), "")
        << "D=" << D;
  }
  // Tq = Tk = 1: cuDNN's backward does not take it (cudnn-frontend's support surface); one row is fine.
  const cuda::AttentionDims one{2, 4, 1, 1, 64, 64}, one_row{2, 4, 1, 64, 64, 64};
  EXPECT_NE(cuda::attention_cudnn_decline_reason(one, cuda::AttentionLayout::contiguous(one), DType::bf16), "");
  EXPECT_EQ(cuda::attention_cudnn_decline_reason(one_row, cuda::AttentionLayout::contiguous(one_row), DType::bf16), "");
  const cuda::AttentionDims dv{1, 2, 64, 64, 64, 128};
  EXPECT_NE(cuda::attention_cudnn_decline_reason(dv, cuda::AttentionLayout::contiguous(dv), DType::bf16), "");
  // Strides that are not 16 bytes apart.
  auto gapped = C;
  gapped.k.t = 67;
  EXPECT_NE(cuda::attention_cudnn_decline_reason(gpt2, gapped, DType::bf16).find("stride"), std::string::npos);
  auto gapped_o = C;
  gapped_o.o.h += 4;
  EXPECT_NE(cuda::attention_cudnn_decline_reason(gpt2, gapped_o, DType::bf16), "");
  // Misaligned pointers are declined whatever the library (supported() checks them first).
  alignas(16) static unsigned char buf[64];
  EXPECT_FALSE(cuda::attention_cudnn_supported(buf + 8, buf, buf, buf, gpt2, P, DType::bf16));
  EXPECT_FALSE(cuda::attention_cudnn_supported(buf, buf, buf, buf + 2, gpt2, P, DType::bf16));
  // Aligned and in the rule: supported exactly when the library loaded.
  EXPECT_EQ(cuda::attention_cudnn_supported(buf, buf, buf, buf, gpt2, P, DType::bf16), cuda::cudnn_available());
}

// The loader's unavailable paths: a library that does not exist, and one that is not cuDNN.
TEST(GpuAttentionCudnn, LoaderUnavailablePaths) {
  const std::string missing = cuda::cudnn_probe("libathanor_no_such_cudnn.so.9");
  EXPECT_NE(missing, "");
#if ATHANOR_HAS_CUDNN_HEADERS
  EXPECT_NE(missing.find("cannot open libathanor_no_such_cudnn.so.9"), std::string::npos) << missing;
  const std::string not_cudnn = cuda::cudnn_probe("libc.so.6");
  EXPECT_NE(not_cudnn.find("lacks the symbol cudnnGetVersion"), std::string::npos) << not_cudnn;
#endif
  // The process's own state is consistent with itself whichever way it went.
  EXPECT_EQ(cuda::cudnn_available(), cuda::cudnn_unavailable_reason().empty());
  if (!cuda::cudnn_available()) {
    alignas(16) static unsigned char buf[64];
    const cuda::AttentionDims d{1, 2, 64, 64, 64, 64};
    EXPECT_FALSE(cuda::attention_cudnn_supported(buf, buf, buf, buf, d, cuda::AttentionLayout::contiguous(d),
                                                 DType::bf16));
  }
}

// Where cuDNN loads (no GPU needed): every node of the forward and backward graphs, and the
// operation graphs themselves, finalize (attribute types, shapes and strides that cuDNN checks
// before any device is involved), for the layouts and dtypes the GPU tests run.
TEST(GpuAttentionCudnn, GraphsFinalizeWithoutADevice) {
  if (!cuda::cudnn_available()) GTEST_SKIP() << "cuDNN unavailable: " << cuda::cudnn_unavailable_reason();
  const cuda::AttentionDims gpt2{16, 12, 1024, 1024, 64, 64}, odd{2, 4, 50, 131, 128, 128};
  for (const auto& [d, L] : {std::pair{gpt2, cuda::AttentionLayout::packed_qkv(gpt2)},
                             std::pair{gpt2, cuda::AttentionLayout::contiguous(gpt2)},
                             std::pair{odd, cuda::AttentionLayout::contiguous(odd)}})
    for (const DType dt : {DType::bf16, DType::f16})
      for (const bool causal : {false, true})
        for (const bool backward : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + (causal ? " causal" : " non-causal") +
                       (backward ? " backward" : " forward") + " Tk=" + std::to_string(d.Tk));
          EXPECT_EQ(cuda::attention_cudnn_graph_check(d, L, causal, dt, backward), "");
        }
  // A graph cuDNN refuses comes back as a reason (the node and cuDNN's status), not a crash.
  const cuda::AttentionDims bad{1, 2, 64, 64, 64, 64};
  auto L = cuda::AttentionLayout::contiguous(bad);
  L.q.t = -64;
  const std::string why = cuda::attention_cudnn_graph_check(bad, L, true, DType::bf16, false);
  EXPECT_NE(why.find("tensor finalize: CUDNN_STATUS_BAD_PARAM"), std::string::npos) << why;
  const cuda::AttentionDims empty{1, 2, 0, 64, 64, 64};
  EXPECT_EQ(cuda::attention_cudnn_graph_check(empty, cuda::AttentionLayout::contiguous(empty), true, DType::bf16, false),
            "empty sizes");
}
