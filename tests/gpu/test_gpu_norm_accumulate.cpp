// layer_norm / rms_norm backward adding dx into the gradient already waiting at x (the candidate
// norm_accumulate_dx, src/backend/cuda/candidates.h; norm_kernels.h's accumulate_dx):
//  - the kernels: dx written over a buffer holding P equals P + (the dx written into a fresh
//    buffer), each element one f32 (f64) add rounded to nearest, bit for bit (the host adds the
//    two device results), for the block-per-row kernels and the warp-per-row ones
//    (norm_vectorized), f32 and f64, with and without weights, row lengths the vectorized kernels
//    take and ones they do not;
//  - the op in a graph (the premise checked on the CPU, whose layer_norm takes the sum): a
//    residual pattern (h = x + a; out = h + f(norm(h))) on cuda, f32 and under bf16 autocast: the gradients of x, a and the norm's parameters are the same bits with the
//    candidate on and off, the engine's count of taken gradients (pending_grads_taken) grows only
//    with it on (so the test fails if the candidate is silently not used);
//  - a tiny GPT's parameter gradients on cuda, bf16 autocast: the same bits on and off, with at
//    least one taken gradient per block.
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "athanor/autograd/engine.h"
#include "athanor/nn/gpt.h"
#include "athanor/ops.h"
#include "athanor/ops/autocast.h"
#include "backend/cuda/candidates.h"
#include "backend/cuda/norm_kernels.h"
#include "gpu_test.h"
#include "test_util.h"

using namespace athanor;
using namespace athanor::gpu_test;

namespace {

template <class T> std::vector<T> as_t(const std::vector<float>& v) { return std::vector<T>(v.begin(), v.end()); }

// One backward of the kernels into a fresh dx and into a buffer holding `pending`, for T (float
// or double); returns (fresh, accumulated) on the host.
template <class T>
std::pair<std::vector<T>, std::vector<T>> both_ways(bool rms, int64_t rows, int64_t cols, bool affine,
                                                    const std::vector<T>& pending) {
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  DeviceBuffer<T> x(as_t<T>(random_vector(n, 1, -2, 2))), dy(as_t<T>(random_vector(n, 2)));
  DeviceBuffer<T> w(as_t<T>(random_vector(static_cast<std::size_t>(cols), 3, 0.5f, 1.5f)));
  DeviceBuffer<T> mean(static_cast<std::size_t>(rows)), rstd(static_cast<std::size_t>(rows)), y(n);
  const T* wp = affine ? w.ptr : nullptr;
  if (rms) cuda::rms_norm_forward(x.ptr, wp, y.ptr, rstd.ptr, rows, cols, 1e-5, stream());
  else cuda::layer_norm_forward(x.ptr, wp, nullptr, y.ptr, mean.ptr, rstd.ptr, rows, cols, 1e-5, stream());
  const DType dt = sizeof(T) == 8 ? DType::f64 : DType::f32;
  const std::size_t ws_elems = static_cast<std::size_t>(cuda::norm_backward_workspace_bytes(rows, cols, dt)) / sizeof(T) + 1;
  DeviceBuffer<T> ws(ws_elems), dx0(n), dx1(pending), dw(static_cast<std::size_t>(cols));
  for (bool acc : {false, true}) {
    T* dx = acc ? dx1.ptr : dx0.ptr;
    if (rms) cuda::rms_norm_backward(dy.ptr, x.ptr, wp, rstd.ptr, dx, affine ? dw.ptr : nullptr, rows, cols, ws.ptr, stream(), acc);
    else
      cuda::layer_norm_backward(dy.ptr, x.ptr, wp, mean.ptr, rstd.ptr, dx, affine ? dw.ptr : nullptr, nullptr, rows, cols,
                                ws.ptr, stream(), acc);
  }
  return {dx0.host(), dx1.host()};
}

struct KernelCase {
  int64_t rows, cols;
  bool affine;
};

}  // namespace

TEST(GpuNormAccumulate, KernelsAddTheirDxIntoTheWaitingGradientBitForBit) {
  ATH_REQUIRE_GPU();
  // 768 and 1024 columns are taken by the warp-per-row kernels when norm_vectorized is on; 30 and
  // 4100 are not (cols % 4, and more than kNormFusedMaxCols).
  const KernelCase cases[] = {{3, 30, true}, {64, 768, true}, {33, 1024, false}, {5, 4100, true}};
  for (bool vectorized : {false, true}) {
    cuda::CandidateOverride vec(cuda::Candidate::norm_vectorized, vectorized);
    for (bool rms : {false, true})
      for (const KernelCase& c : cases) {
        SCOPED_TRACE(std::string(rms ? "rms_norm" : "layer_norm") + (vectorized ? ", norm_vectorized" : "") + ", " +
                     std::to_string(c.rows) + " x " + std::to_string(c.cols) + (c.affine ? ", affine" : ""));
        const std::size_t n = static_cast<std::size_t>(c.rows * c.cols);
        const std::vector<float> p = random_vector(n, 4, -3, 3);
        const auto [fresh, acc] = both_ways<float>(rms, c.rows, c.cols, c.affine, p);
        int64_t bad = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const float want = p[i] + fresh[i];  // one f32 add rounded to nearest (SSE on the host)
          if (std::memcmp(&want, &acc[i], sizeof want) != 0 && bad++ < 5)
            ADD_FAILURE() << "f32 element " << i << ": " << acc[i] << ", want " << p[i] << " + " << fresh[i] << " = " << want;
        }
        EXPECT_EQ(bad, 0);
        const std::vector<double> p64 = as_t<double>(p);
        const auto [fresh64, acc64] = both_ways<double>(rms, c.rows, c.cols, c.affine, p64);
        bad = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const double want = p64[i] + fresh64[i];
          if (std::memcmp(&want, &acc64[i], sizeof want) != 0 && bad++ < 5)
            ADD_FAILURE() << "f64 element " << i << ": " << acc64[i] << ", want " << want;
        }
        EXPECT_EQ(bad, 0);
      }
  }
}

namespace {

struct GraphRun {
  std::vector<std::string> grads;
  uint64_t taken = 0;
};

// h = x + a; out = h + tanh(norm(h)) * 0.5; loss = sum(out * r): x receives the add's gradient and
// the norm's, the residual stream's shape.
GraphRun residual_graph(bool rms, bool candidate, bool bf16, Device dev = Device::cuda(0)) {
  cuda::CandidateOverride cand(cuda::Candidate::norm_accumulate_dx, candidate);
  const int64_t rows = 24, cols = 768;
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  Tensor x = from_vector(random_vector(n, 11), {rows, cols}).to(dev).requires_grad_();
  Tensor a = from_vector(random_vector(n, 12), {rows, cols}).to(dev).requires_grad_();
  Tensor w = from_vector(random_vector(static_cast<std::size_t>(cols), 13, 0.5f, 1.5f), {cols}).to(dev).requires_grad_();
  Tensor b = from_vector(random_vector(static_cast<std::size_t>(cols), 14), {cols}).to(dev).requires_grad_();
  Tensor lin = from_vector(random_vector(static_cast<std::size_t>(cols * cols), 15, -0.05f, 0.05f), {cols, cols}).to(dev).requires_grad_();
  const Tensor r = from_vector(random_vector(n, 16), {rows, cols}).to(dev);
  const uint64_t before = pending_grads_taken();
  {
    std::optional<autocast> ac;
    if (bf16) ac.emplace(DType::bf16);
    Tensor h = add(x, a);
    Tensor nh = rms ? rms_norm(h, {cols}, w) : layer_norm(h, {cols}, w, b);
    Tensor out = add(h, mul(linear(tanh(nh), lin), 0.5));
    sum(mul(out, r)).backward();
  }
  GraphRun g;
  g.taken = pending_grads_taken() - before;
  for (const Tensor* t : {&x, &a, &w, &lin}) g.grads.push_back(athanor::testing::tensor_bytes(t->grad()));
  if (!rms) g.grads.push_back(athanor::testing::tensor_bytes(b.grad()));
  return g;
}

}  // namespace

// The premise of the next test, on the engine that has long done this (runs without a GPU): the
// CPU layer_norm takes the sum waiting at h in this graph, f32 and under bf16 autocast.
TEST(GpuNormAccumulate, TheCpuLayerNormTakesTheWaitingSumInTheResidualGraph) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 autocast" : "f32");
    EXPECT_EQ(residual_graph(false, false, bf16, Device::cpu()).taken, 1u);
  }
}

TEST(GpuNormAccumulate, AResidualGraphGetsTheSameGradientsAndTakesTheWaitingSum) {
  ATH_REQUIRE_GPU();
  for (bool bf16 : {false, true})
    for (bool rms : {false, true}) {
      SCOPED_TRACE(std::string(rms ? "rms_norm" : "layer_norm") + (bf16 ? ", bf16 autocast" : ", f32"));
      const GraphRun off = residual_graph(rms, false, bf16), on = residual_graph(rms, true, bf16);
      ASSERT_EQ(on.grads.size(), off.grads.size());
      for (std::size_t i = 0; i < on.grads.size(); ++i) EXPECT_TRUE(on.grads[i] == off.grads[i]) << "gradient " << i << " differs";
      EXPECT_EQ(off.taken, 0u) << "without the candidate no CUDA op takes the waiting gradient";
      EXPECT_EQ(on.taken, 1u) << "the norm's backward took the sum waiting at h";
    }
}

namespace {
nn::GPTConfig tiny_config() {
  nn::GPTConfig c;
  c.vocab_size = 37, c.block_size = 16, c.n_layer = 2, c.n_head = 2, c.n_embd = 64, c.dropout = 0.0;
  return c;
}
const std::vector<int64_t> kIds = {1, 5, 9, 2, 33, 0, 7, 7, 3, 3, 4, 36, 12, 8, 8, 1};
}  // namespace

// The next test's premise on the CPU: its layer_norm takes a waiting sum at least once per block.
TEST(GpuNormAccumulate, TheCpuGptTakesAWaitingSumInEveryBlock) {
  const nn::GPTConfig c = tiny_config();
  nn::GPT model(c);
  const Tensor ids = from_vector(kIds, {2, 8});
  const uint64_t before = pending_grads_taken();
  {
    autocast ac(DType::bf16);
    model.loss(ids, ids).backward();
  }
  EXPECT_GE(pending_grads_taken() - before, static_cast<uint64_t>(c.n_layer));
}

TEST(GpuNormAccumulate, TinyGptGradientsAreTheSameBitsWithFewerSums) {
  ATH_REQUIRE_GPU();
  const nn::GPTConfig c = tiny_config();
  auto model = std::make_shared<nn::GPT>(c);
  model->to(Device::cuda(0));
  const Tensor ids = from_vector(kIds, {2, 8}).cuda();
  auto run = [&](bool candidate) {
    cuda::CandidateOverride cand(cuda::Candidate::norm_accumulate_dx, candidate);
    for (auto& [name, p] : model->named_parameters()) p.set_grad(Tensor());
    const uint64_t before = pending_grads_taken();
    {
      autocast ac(DType::bf16);
      model->loss(ids, ids).backward();
    }
    GraphRun g;
    g.taken = pending_grads_taken() - before;
    for (auto& [name, p] : model->named_parameters()) g.grads.push_back(name + ":" + athanor::testing::tensor_bytes(p.grad()));
    return g;
  };
  const GraphRun off = run(false), on = run(true);
  ASSERT_EQ(on.grads.size(), off.grads.size());
  for (std::size_t i = 0; i < on.grads.size(); ++i)
    EXPECT_TRUE(on.grads[i] == off.grads[i]) << off.grads[i].substr(0, off.grads[i].find(':')) << "'s gradient differs";
  EXPECT_EQ(off.taken, 0u);
  EXPECT_GE(on.taken, static_cast<uint64_t>(c.n_layer)) << "at least ln_2's input (the residual stream) in every block";
}
