// The attention ops on CUDA tensors at the head dims models use besides 64 and 128 (the CUDA
// kernels run them at a padded head dim, src/backend/cuda/attention.h): GPT-char's 48, the
// tiny test GPTs' 16, 80 and 160. causal_self_attention reads the packed qkv (the GPT path);
// scaled_dot_product_attention reads q, k, v as transposed [B, T, H, D] views with grouped
// kv heads (the Llama path). Forward and backward against the same ops on the CPU, f32 and
// bf16, with test_gpu_ops.cpp's tolerances; then the error for a head dim above the kernels'
// limit, raised before any work.
#include <string>
#include <vector>

#include "athanor/autograd/engine.h"
#include "athanor/core/error.h"
#include "athanor/ops/attention.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

namespace {

struct Tol {
  double atol, rtol;
};
Tol tolerance(DType dt) { return dt == DType::bf16 ? Tol{3e-2, 2e-2} : Tol{1e-5, 1e-4}; }

std::vector<double> host_values(const Tensor& t) { return t.cpu().to_vector(); }

Tensor random_tensor(const Shape& s, unsigned seed, DType dt) {
  int64_t n = 1;
  for (const int64_t x : s) n *= x;
  return from_vector(random_vector(static_cast<std::size_t>(n), seed), s, TensorOptions(dt));
}

// A CPU leaf and its copy on cuda:0, both requiring grad.
struct Leaf {
  Tensor cpu, gpu;
};
Leaf leaf(const Shape& s, unsigned seed, DType dt) {
  Leaf l{random_tensor(s, seed, dt), Tensor()};
  l.gpu = l.cpu.to(Device::cuda(0));
  l.cpu.requires_grad_(true);
  l.gpu.requires_grad_(true);
  return l;
}

// Forward outputs equal, then the gradients of every leaf for one random output gradient.
void compare(const Tensor& out_cpu, const Tensor& out_gpu, const std::vector<Leaf>& leaves, DType dt) {
  const Tol tol = tolerance(dt);
  ASSERT_EQ(out_gpu.device(), Device::cuda(0));
  ASSERT_EQ(out_gpu.sizes(), out_cpu.sizes());
  EXPECT_TRUE(all_close(host_values(out_gpu), host_values(out_cpu), tol.atol, tol.rtol)) << "output";
  const Tensor seed = random_tensor(out_cpu.sizes(), 99, dt);
  backward({out_cpu}, {seed});
  backward({out_gpu}, {seed.to(Device::cuda(0))});
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    ASSERT_TRUE(leaves[i].gpu.grad().defined() && leaves[i].cpu.grad().defined()) << "leaf " << i;
    EXPECT_EQ(leaves[i].gpu.grad().device(), Device::cuda(0)) << "leaf " << i;
    EXPECT_TRUE(all_close(host_values(leaves[i].gpu.grad()), host_values(leaves[i].cpu.grad()), tol.atol, tol.rtol))
        << "gradient of leaf " << i;
  }
}

void check_csa(int64_t B, int64_t T, int64_t H, int64_t D, DType dt) {
  SCOPED_TRACE("causal_self_attention B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
               " D=" + std::to_string(D) + " " + dtype_name(dt));
  const Leaf qkv = leaf({B, T, 3 * H * D}, 1, dt);
  compare(causal_self_attention(qkv.cpu, H), causal_self_attention(qkv.gpu, H), {qkv}, dt);
}

void check_sdpa(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, bool causal, DType dt) {
  SCOPED_TRACE("scaled_dot_product_attention B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" +
               std::to_string(H) + " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) +
               (causal ? " causal " : " ") + dtype_name(dt));
  const Leaf q = leaf({B, T, H, D}, 2, dt), k = leaf({B, T, Hkv, D}, 3, dt), v = leaf({B, T, Hkv, D}, 4, dt);
  auto run = [&](const Tensor& qq, const Tensor& kk, const Tensor& vv) {
    return scaled_dot_product_attention(qq.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2), causal,
                                        std::nullopt, /*enable_gqa=*/Hkv != H);
  };
  compare(run(q.cpu, k.cpu, v.cpu), run(q.gpu, k.gpu, v.gpu), {q, k, v}, dt);
}

}  // namespace

TEST(GpuAttentionOps, CausalSelfAttentionPaddedHeadDims) {
  ATH_REQUIRE_GPU();
  check_csa(2, 37, 4, 48, DType::f32);  // GPT-char
  check_csa(2, 37, 4, 48, DType::bf16);
  check_csa(1, 20, 2, 16, DType::f32);  // the tiny test GPTs
  check_csa(1, 30, 2, 80, DType::bf16);
}

TEST(GpuAttentionOps, SdpaGqaPaddedHeadDims) {
  ATH_REQUIRE_GPU();
  check_sdpa(1, 30, 4, 2, 80, true, DType::f32);
  check_sdpa(2, 25, 4, 1, 48, true, DType::bf16);
  check_sdpa(1, 19, 2, 2, 160, false, DType::f32);
}

TEST(GpuAttentionOps, HeadDimAboveTheLimitIsAClearError) {
  ATH_REQUIRE_GPU();
  const Tensor qkv = zeros({1, 4, 3 * 264}, TensorOptions(DType::f32).with_device(Device::cuda(0)));
  try {
    causal_self_attention(qkv, 1);
    ADD_FAILURE() << "head dim 264 accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("not yet supported on cuda"), std::string::npos) << m;
    EXPECT_NE(m.find("head dim 264"), std::string::npos) << m;
    EXPECT_NE(m.find("1 to 256"), std::string::npos) << m;
  }
}

// No queries: the keys and values get a zero gradient (no kernel runs, the buffers are written
// anyway), as on the CPU; f32 and f64 (the f64 path has its own kernels).
TEST(GpuAttentionOps, NoQueriesGiveZeroKeyAndValueGradients) {
  ATH_REQUIRE_GPU();
  for (DType dt : {DType::f32, DType::f64}) {
    const TensorOptions o = TensorOptions(dt).with_device(Device::cuda(0));
    // Blocks of the gradients' size holding non-zero bytes, freed to the caching allocator
    // first, so that a gradient nobody wrote shows as 7, not as a lucky 0.
    {
      std::vector<Tensor> junk;
      for (int i = 0; i < 8; ++i) junk.push_back(full({1, 2, 5, 16}, 7.0, o));
    }
    Tensor q = zeros({1, 2, 0, 16}, o).requires_grad_(true);
    Tensor k = full({1, 2, 5, 16}, 0.5, o).requires_grad_(true);
    Tensor v = full({1, 2, 5, 16}, -0.25, o).requires_grad_(true);
    Tensor y = scaled_dot_product_attention(q, k, v, false);
    backward({y}, {zeros(y.sizes(), o)});
    for (const Tensor* t : {&k, &v}) {
      ASSERT_TRUE(t->grad().defined()) << dtype_name(dt);
      for (double x : host_values(t->grad())) ASSERT_EQ(x, 0.0) << dtype_name(dt);
    }
  }
}
