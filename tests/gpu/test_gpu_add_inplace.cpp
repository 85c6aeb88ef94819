// Gradient accumulation's in-place add on CUDA (src/backend/cuda/copy.h: add_inplace): the
// vectorized kernel (candidate pointwise_vectorized) against the scalar one, bit for bit, for
// every dtype it takes, sizes around the vector width and misaligned buffers (which take the
// scalar kernel), and the scalar kernel against the host's arithmetic.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "athanor/core/half.h"
#include "backend/cuda/candidates.h"
#include "backend/cuda/copy.h"
#include "gpu_test.h"

using namespace athanor;
using namespace athanor::gpu_test;

namespace {

// n random elements of `dt` as raw bytes.
std::vector<uint8_t> random_bytes(DType dt, int64_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  const std::size_t es = dtype_size(dt);
  std::vector<uint8_t> b(static_cast<std::size_t>(n) * es);
  for (int64_t i = 0; i < n; ++i) {
    const double v = d(g);
    uint8_t* p = b.data() + i * es;
    if (dt == DType::f64) std::memcpy(p, &v, 8);
    else if (dt == DType::f32) {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
    } else {
      const uint16_t h = dt == DType::bf16 ? float_to_bf16_bits(static_cast<float>(v)) : float_to_f16_bits(static_cast<float>(v));
      std::memcpy(p, &h, 2);
    }
  }
  return b;
}

// acc + g through add_inplace at element offset `offset` of both device buffers; the sum's bytes.
std::vector<uint8_t> run_add(DType dt, const std::vector<uint8_t>& acc, const std::vector<uint8_t>& g, int64_t offset,
                             bool vectorized) {
  cuda::CandidateOverride cand(cuda::Candidate::pointwise_vectorized, vectorized);
  const std::size_t es = dtype_size(dt), off = static_cast<std::size_t>(offset) * es;
  DeviceBuffer<uint8_t> da(acc.size() + off + 16), dg(g.size() + off + 16);
  ATH_CUDA(cudaMemcpyAsync(da.ptr + off, acc.data(), acc.size(), cudaMemcpyHostToDevice, stream()));
  ATH_CUDA(cudaMemcpyAsync(dg.ptr + off, g.data(), g.size(), cudaMemcpyHostToDevice, stream()));
  cuda::add_inplace(da.ptr + off, dg.ptr + off, dt, static_cast<int64_t>(acc.size() / es), stream());
  std::vector<uint8_t> out(acc.size());
  ATH_CUDA(cudaMemcpyAsync(out.data(), da.ptr + off, out.size(), cudaMemcpyDeviceToHost, stream()));
  ATH_CUDA(cudaStreamSynchronize(stream()));
  return out;
}

}  // namespace

TEST(GpuAddInplace, VectorizedEqualsScalarBitForBit) {
  ATH_REQUIRE_GPU();
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{4096 + 3}, int64_t{(1 << 20) + 5}})
      for (int64_t offset : {int64_t{0}, int64_t{1}, int64_t{3}}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " n " + std::to_string(n) + " offset " + std::to_string(offset));
        const std::vector<uint8_t> a = random_bytes(dt, n, 1 + static_cast<unsigned>(n)), g = random_bytes(dt, n, 2);
        const std::vector<uint8_t> scalar = run_add(dt, a, g, offset, false);
        EXPECT_EQ(run_add(dt, a, g, offset, true), scalar);
        EXPECT_NE(scalar, a) << "the add changed nothing";
      }
}

TEST(GpuAddInplace, ScalarMatchesTheHostArithmetic) {
  ATH_REQUIRE_GPU();
  const int64_t n = 1000;
  const std::vector<uint8_t> a = random_bytes(DType::f32, n, 5), g = random_bytes(DType::f32, n, 6);
  const std::vector<uint8_t> got = run_add(DType::f32, a, g, 0, false);
  for (int64_t i = 0; i < n; ++i) {
    float x, y, z;
    std::memcpy(&x, a.data() + 4 * i, 4);
    std::memcpy(&y, g.data() + 4 * i, 4);
    std::memcpy(&z, got.data() + 4 * i, 4);
    ASSERT_EQ(z, x + y) << "element " << i;
  }
}
