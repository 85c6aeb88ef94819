// The candidates' index arithmetic at the sizes of GPT-2 124M's B 64 x T 1024 step, past 2^31
// elements, where a 32-bit index or offset wraps (each suite a process of its own under
// gpu_check.sh, so an illegal address here costs this suite only):
//  - cross-entropy over [65536, 50304] bf16 logits (3.3e9 elements, 6.6 GB; row 42,692 is the
//    first to start past element 2^31): the vectorized kernels (candidate
//    cross_entropy_vectorized) and the established ones, forward over every row and backward
//    (the vectorized one in place, as the fused classifier runs it) on sampled rows, bit for bit
//    against the same kernels on the 61 distinct rows the big logits repeat, whose losses are
//    also held to a host log-sum-exp in double;
//  - the vectorized pointwise cast f32 -> bf16 (candidate pointwise_vectorized) over
//    2^31 + 2^20 + 13 elements from views at element offset 3 (a head of 5 elements, then
//    268M vectors, then the tail), every element against the same cast of the 1021-element
//    period the input repeats, and the guard elements around the output untouched.
// The data is a short period repeated by device-to-device copies, so the setup takes
// milliseconds; each test needs under 16 GB of device memory and a few seconds (most of it the
// pointwise test's 4.3 GB copy back to the host) and is skipped, naming the need, on a smaller GPU.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "athanor/core/half.h"
#include "backend/cuda/candidates.h"
#include "backend/cuda/cross_entropy_vec.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pointwise.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

namespace {

#define ATH_REQUIRE_DEVICE_BYTES(bytes)                                                                        \
  do {                                                                                                         \
    ATH_REQUIRE_GPU();                                                                                         \
    std::size_t free_b = 0, total_b = 0;                                                                       \
    ATH_CUDA(cudaMemGetInfo(&free_b, &total_b));                                                               \
    if (free_b < (bytes))                                                                                      \
      GTEST_SKIP() << "needs " << (bytes) / (1 << 20) << " MiB of device memory, " << free_b / (1 << 20)       \
                   << " MiB free";                                                                             \
  } while (0)

// dst[i] = src[i % period] for i < n (elements of `elem` bytes), by doubling device-to-device
// copies of the filled prefix (its length always a multiple of the period).
void fill_periodic(void* dst, const void* src, std::size_t period, std::size_t n, std::size_t elem) {
  auto* d = static_cast<char*>(dst);
  std::size_t have = std::min(period, n);
  ATH_CUDA(cudaMemcpyAsync(d, src, have * elem, cudaMemcpyDeviceToDevice, stream()));
  while (have < n) {
    const std::size_t k = std::min(have, n - have);
    ATH_CUDA(cudaMemcpyAsync(d + have * elem, d, k * elem, cudaMemcpyDeviceToDevice, stream()));
    have += k;
  }
}

template <class T> std::vector<T> host_range(const T* p, std::size_t first, std::size_t count) {
  std::vector<T> h(count);
  ATH_CUDA(cudaMemcpyAsync(h.data(), p + first, count * sizeof(T), cudaMemcpyDeviceToHost, stream()));
  ATH_CUDA(cudaStreamSynchronize(stream()));
  return h;
}

constexpr int64_t kIgnore = -100;

}  // namespace

TEST(GpuB64CrossEntropy, EveryRowPastTwoToThe31ElementsMatchesItsPeriod) {
  constexpr int64_t N = 64 * 1024, C = 50304, P = 61;
  const std::size_t big = static_cast<std::size_t>(N) * C;
  ATH_REQUIRE_DEVICE_BYTES(2 * big * 2 + (std::size_t{1} << 30));
  ASSERT_GT(big, std::size_t{1} << 31);
  ASSERT_GT((N - 1) * C, int64_t{1} << 31) << "the last rows start past element 2^31";

  // The period: P rows of N(0, 3) logits in bf16, row 1 ignored, row 2 with every 7th logit
  // masked (-inf); targets anywhere in [0, C) (the masked row's not on a masked logit).
  std::mt19937 g(64);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<uint16_t> xs(static_cast<std::size_t>(P * C));
  for (auto& v : xs) v = float_to_bf16_bits(dist(g));
  for (int64_t c = 0; c < C; c += 7) xs[static_cast<std::size_t>(2 * C + c)] = float_to_bf16_bits(-INFINITY);
  std::vector<int64_t> ts(static_cast<std::size_t>(P));
  std::uniform_int_distribution<int64_t> pick(0, C - 1);
  for (int64_t r = 0; r < P; ++r) ts[r] = r == 1 ? kIgnore : pick(g);
  if (ts[2] % 7 == 0) ts[2] += 1;
  std::vector<int64_t> tb(static_cast<std::size_t>(N));
  for (int64_t n = 0; n < N; ++n) tb[n] = ts[n % P];

  DeviceBuffer<uint16_t> small(xs), logits(big), dlogits_est(big);
  DeviceBuffer<int64_t> t_small(ts), t_big(tb);
  fill_periodic(logits.ptr, small.ptr, static_cast<std::size_t>(P * C), big, sizeof(uint16_t));
  ASSERT_TRUE(cuda::cross_entropy_vectorized_supported(logits.ptr, DType::bf16, C, logits.ptr));

  // Forward: both kernels on the period and on the big logits.
  DeviceBuffer<float> st_small_est(2 * P), st_small_vec(2 * P), l_small_est(P), l_small_vec(P);
  DeviceBuffer<float> st_est(2 * N), st_vec(2 * N), l_est(N), l_vec(N);
  cuda::cross_entropy_forward(small.ptr, DType::bf16, t_small.ptr, st_small_est.ptr, l_small_est.ptr, P, C, kIgnore, 0.1,
                              stream());
  cuda::cross_entropy_forward_vectorized(small.ptr, DType::bf16, t_small.ptr, st_small_vec.ptr, l_small_vec.ptr, P, C,
                                         kIgnore, 0.1, stream());
  cuda::cross_entropy_forward(logits.ptr, DType::bf16, t_big.ptr, st_est.ptr, l_est.ptr, N, C, kIgnore, 0.1, stream());
  cuda::cross_entropy_forward_vectorized(logits.ptr, DType::bf16, t_big.ptr, st_vec.ptr, l_vec.ptr, N, C, kIgnore, 0.1,
                                         stream());

  // The period's losses against a host log-sum-exp in double (the kernels' math is f32).
  const std::vector<float> lse = l_small_est.host(), lsv = l_small_vec.host();
  for (int64_t r = 0; r < P; ++r) {
    if (ts[r] == kIgnore) {
      EXPECT_EQ(lse[r], 0.0f);
      EXPECT_EQ(lsv[r], 0.0f);
      continue;
    }
    double m = -INFINITY, s = 0, sum = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, static_cast<double>(bf16_bits_to_float(xs[r * C + c])));
    for (int64_t c = 0; c < C; ++c) {
      const double v = bf16_bits_to_float(xs[r * C + c]);
      s += std::exp(v - m), sum += v;
    }
    const double want = std::log(s) - 0.9 * (bf16_bits_to_float(xs[r * C + ts[r]]) - m) - 0.1 * (sum / C - m);
    if (std::isinf(want)) {
      EXPECT_EQ(lse[r], want) << "row " << r;
      EXPECT_EQ(lsv[r], want) << "row " << r;
    } else {
      EXPECT_NEAR(lse[r], want, 1e-4 + 1e-5 * std::abs(want)) << "established, row " << r;
      EXPECT_NEAR(lsv[r], want, 1e-4 + 1e-5 * std::abs(want)) << "vectorized, row " << r;
    }
  }
  // Every big row: its period row's bits (the same kernel on the same row content).
  auto same_rows = [&](const std::vector<float>& got, const std::vector<float>& want, int64_t width, const char* what) {
    int64_t bad = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < width; ++k) {
        const float a = got[n * width + k], b = want[(n % P) * width + k];
        if (std::memcmp(&a, &b, sizeof a) != 0 && bad++ < 5)
          ADD_FAILURE() << what << ": row " << n << " (element " << n * C << "), [" << k << "] = " << a
                        << ", its period row " << n % P << " has " << b;
      }
    EXPECT_EQ(bad, 0) << what << ": rows that differ from their period row";
  };
  same_rows(l_est.host(), lse, 1, "established loss");
  same_rows(l_vec.host(), lsv, 1, "vectorized loss");
  same_rows(st_est.host(), st_small_est.host(), 2, "established stats");
  same_rows(st_vec.host(), st_small_vec.host(), 2, "vectorized stats");

  // Backward (mean over the counted rows: one factor for every row) from the established
  // statistics: the established kernel into a new buffer, then the vectorized one in place over
  // the big logits (the fused classifier's form). Both against the period's gradients, which the
  // two kernels give bit for bit alike (cross_entropy_vec.h).
  const std::vector<float> factor_h{1.0f / static_cast<float>(N)};
  DeviceBuffer<float> factor(factor_h);
  DeviceBuffer<uint16_t> d_small_est(static_cast<std::size_t>(P * C)), d_small_vec(static_cast<std::size_t>(P * C));
  cuda::cross_entropy_backward(small.ptr, DType::bf16, t_small.ptr, st_small_est.ptr, factor.ptr, 0, d_small_est.ptr, P, C,
                               kIgnore, 0.1, stream());
  cuda::cross_entropy_backward_vectorized(small.ptr, DType::bf16, t_small.ptr, st_small_est.ptr, factor.ptr, 0,
                                          d_small_vec.ptr, P, C, kIgnore, 0.1, stream());
  cuda::cross_entropy_backward(logits.ptr, DType::bf16, t_big.ptr, st_est.ptr, factor.ptr, 0, dlogits_est.ptr, N, C,
                               kIgnore, 0.1, stream());
  cuda::cross_entropy_backward_vectorized(logits.ptr, DType::bf16, t_big.ptr, st_est.ptr, factor.ptr, 0, logits.ptr, N, C,
                                          kIgnore, 0.1, stream());
  const std::vector<uint16_t> dse = d_small_est.host();
  ASSERT_TRUE(dse == d_small_vec.host()) << "the period's gradients: vectorized against established";
  // Sampled rows: the first and last 2 periods, those around element 2^31, every 331st.
  std::vector<int64_t> rows;
  const int64_t wrap = (int64_t{1} << 31) / C;
  for (int64_t n = 0; n < N; ++n)
    if (n < 2 * P || n >= N - 2 * P || std::abs(n - wrap) <= 2 * P || n % 331 == 0) rows.push_back(n);
  int64_t bad_est = 0, bad_vec = 0;
  for (const int64_t n : rows) {
    const uint16_t* want = dse.data() + (n % P) * C;
    const std::vector<uint16_t> e = host_range(dlogits_est.ptr, static_cast<std::size_t>(n * C), C);
    const std::vector<uint16_t> v = host_range(logits.ptr, static_cast<std::size_t>(n * C), C);
    if (std::memcmp(e.data(), want, C * sizeof(uint16_t)) != 0 && bad_est++ < 5)
      ADD_FAILURE() << "established dlogits, row " << n << " differs from its period row " << n % P;
    if (std::memcmp(v.data(), want, C * sizeof(uint16_t)) != 0 && bad_vec++ < 5)
      ADD_FAILURE() << "vectorized dlogits (in place), row " << n << " differs from its period row " << n % P;
  }
  EXPECT_EQ(bad_est, 0) << "of " << rows.size() << " sampled rows";
  EXPECT_EQ(bad_vec, 0) << "of " << rows.size() << " sampled rows";
}

TEST(GpuB64Pointwise, VectorizedCastPastTwoToThe31Elements) {
  constexpr std::size_t P = 1021, kOff = 3;
  const std::size_t n = (std::size_t{1} << 31) + (std::size_t{1} << 20) + 13;
  ATH_REQUIRE_DEVICE_BYTES((n + 8) * 6 + (std::size_t{1} << 30));

  // The period: uniform values with ±0, ±inf, subnormals and large values (no NaN: the device's
  // NaN is canonical), cast by the generic kernel for the expected bits.
  std::mt19937 g(31);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> pat(P);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, 1e-40f, -3e-39f, 70000.0f, -1e30f, 1.0f + 1.0f / 256};
  for (std::size_t i = 0; i < P; ++i) pat[i] = i % 17 < 9 ? specials[i % 17] : dist(g);
  DeviceBuffer<float> small(pat);
  DeviceBuffer<uint16_t> small_out(P);
  cuda::PointwiseArgs a;
  a.op = cuda::PointwiseOp::copy;
  a.ndim = 1;
  a.sizes[0] = static_cast<int64_t>(P);
  a.n_in = 1;
  a.in[0].data = small.ptr, a.in[0].dtype = DType::f32, a.in[0].strides[0] = 1, a.in[0].contiguous = true;
  a.out = small_out.ptr, a.out_dtype = DType::bf16;
  {
    cuda::CandidateOverride generic(cuda::Candidate::pointwise_vectorized, false);
    cuda::pointwise(a, stream());
  }
  const std::vector<uint16_t> want = small_out.host();

  // The big input repeats the period from element 0 of its buffer; the call reads it from
  // element kOff and writes the output from element kOff of a buffer filled with 0xffff.
  DeviceBuffer<float> in(n + 8);
  DeviceBuffer<uint16_t> out(n + 8);
  fill_periodic(in.ptr, small.ptr, P, n + 8, sizeof(float));
  ATH_CUDA(cudaMemsetAsync(out.ptr, 0xff, (n + 8) * sizeof(uint16_t), stream()));
  a.sizes[0] = static_cast<int64_t>(n);
  a.in[0].data = in.ptr + kOff, a.out = out.ptr + kOff;
  const cuda::PointwisePlan plan = cuda::plan_pointwise(a, true);
  ASSERT_EQ(plan.kernel, cuda::PointwiseKernel::vectorized_cast);
  ASSERT_EQ(plan.head, 5);
  ASSERT_GT(plan.vectors * cuda::kPointwiseVector, int64_t{1} << 31);
  {
    cuda::CandidateOverride vectorized(cuda::Candidate::pointwise_vectorized, true);
    cuda::pointwise(a, stream());
  }
  const std::vector<uint16_t> got = out.host();
  int64_t bad = 0;
  for (std::size_t i = 0, j = kOff % P; i < n; ++i) {
    if (got[kOff + i] != want[j] && bad++ < 5)
      ADD_FAILURE() << "element " << i << " (head " << plan.head << ", vectors " << plan.vectors << "): got 0x" << std::hex
                    << got[kOff + i] << ", want 0x" << want[j] << std::dec;
    if (++j == P) j = 0;
  }
  EXPECT_EQ(bad, 0) << "elements that differ from the period's cast";
  for (std::size_t i = 0; i < kOff; ++i) EXPECT_EQ(got[i], 0xffff) << "guard element " << i << " before the output";
  for (std::size_t i = kOff + n; i < n + 8; ++i) EXPECT_EQ(got[i], 0xffff) << "guard element " << i << " after the output";
}
