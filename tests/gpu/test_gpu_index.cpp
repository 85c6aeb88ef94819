// The index arithmetic of the CUDA pointwise and reduction kernels
// (src/backend/cuda/strided_index.h), run on the CPU: these tests run without a GPU.
//  - strided_offset against offsets computed from explicit coordinates, on broadcast,
//    transposed and sliced operands of up to 8 dims;
//  - the reduction's chunking: an emulation of the two kernels' loops (partial sums per
//    (output, chunk) in the kernel's thread order, then the chunks in order) covers every
//    element exactly once and equals a naive sum, for shapes from 1 to >10^5 outputs.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/strided_index.h"

using namespace athanor::cuda;

namespace {

// Offsets from coordinates: for each linear index (row-major), its coordinates, then Σ c s.
std::vector<int64_t> by_coordinates(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  std::vector<int64_t> out;
  std::vector<int64_t> c(sizes.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (std::size_t d = 0; d < sizes.size(); ++d) off += c[d] * strides[d];
    out.push_back(off);
    for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
      if (++c[d] < sizes[d]) break;
      c[d] = 0;
    }
  }
  return out;
}

void expect_offsets(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  const std::vector<int64_t> want = by_coordinates(sizes, strides);
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(strided_offset(static_cast<int64_t>(i), sizes.data(), strides.data(), static_cast<int>(sizes.size())), want[i])
        << "element " << i;
}

}  // namespace

TEST(GpuIndex, StridedOffsetMatchesCoordinates) {
  expect_offsets({5}, {1});
  expect_offsets({3, 4}, {4, 1});     // contiguous
  expect_offsets({3, 4}, {1, 3});     // transposed
  expect_offsets({3, 4}, {0, 1});     // a row broadcast over 3 rows
  expect_offsets({3, 4}, {1, 0});     // a column broadcast
  expect_offsets({2, 3, 4}, {24, 8, 2});  // every other element (a step-2 slice)
  expect_offsets({2, 1, 3, 1, 2, 2, 1, 3}, {36, 0, 12, 0, 6, 3, 0, 1});  // 8 dims with size-1 dims
  expect_offsets({4, 5, 6}, {0, 6, 1});   // wpe [T, C] broadcast over the batch of [B, T, C]
  // A 0-d iteration space has one element at offset 0.
  EXPECT_EQ(strided_offset(0, nullptr, nullptr, 0), 0);
}

TEST(GpuIndex, ReductionChunksCoverEveryElementOnceInOrder) {
  std::mt19937 gen(3);
  for (const auto& [outputs, reduced] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {1, 63}, {1, 64}, {1, 65}, {1, 100003}, {3, 1000}, {768, 8192}, {131072, 5}, {200000, 70}, {7, 0}}) {
    const ReduceChunks ch = reduce_chunks(outputs, reduced);
    SCOPED_TRACE(std::to_string(outputs) + " outputs of " + std::to_string(reduced) + ": " + std::to_string(ch.chunks) +
                 " chunks of " + std::to_string(ch.chunk));
    ASSERT_GE(ch.chunks, 1);
    ASSERT_GE(ch.chunk, 1);
    if (reduced > 0) {
      EXPECT_GE(ch.chunks * ch.chunk, reduced);               // every element in some chunk
      EXPECT_LT((ch.chunks - 1) * ch.chunk, reduced);         // no empty trailing chunk
      EXPECT_TRUE(ch.chunks == 1 || ch.chunk >= 32) << "chunks too small to be worth a thread";
    }
    if (outputs * reduced > 4'000'000) continue;  // the emulation below is O(outputs x reduced)
    // The kernels' loops on a [outputs, reduced] tensor stored reduced-major (the bias
    // gradient's layout: kept dim inner), counting visits and summing small integers
    // (exact in double, so the sum checks the cover, not rounding).
    std::vector<int64_t> visits(static_cast<std::size_t>(outputs * reduced), 0);
    std::vector<double> x(visits.size());
    for (auto& v : x) v = static_cast<double>(gen() % 17);
    const int64_t kept_sizes[1] = {outputs}, kept_strides[1] = {1};
    const int64_t red_sizes[1] = {reduced}, red_strides[1] = {outputs};
    std::vector<double> partial(static_cast<std::size_t>(outputs * ch.chunks), 0.0);
    for (int64_t t = 0; t < outputs * ch.chunks; ++t) {
      const int64_t o = t % outputs, c = t / outputs;
      const int64_t base = strided_offset(o, kept_sizes, kept_strides, 1);
      double acc = 0;
      int64_t count = 0;
      for (int64_t r = c; r < reduced; r += ch.chunks, ++count) {
        const int64_t off = base + strided_offset(r, red_sizes, red_strides, 1);
        ++visits[static_cast<std::size_t>(off)];
        acc += x[static_cast<std::size_t>(off)];
      }
      partial[static_cast<std::size_t>(c * outputs + o)] = acc;
      EXPECT_LE(count, ch.chunk) << "chunk " << c << " holds more than `chunk` elements";
      if (reduced > 0) EXPECT_GE(count, 1) << "chunk " << c << " is empty";
    }
    for (int64_t v : visits) ASSERT_EQ(v, 1);
    for (int64_t o = 0; o < outputs; ++o) {
      double got = 0, want = 0;
      for (int64_t c = 0; c < ch.chunks; ++c) got += partial[static_cast<std::size_t>(c * outputs + o)];
      for (int64_t r = 0; r < reduced; ++r) want += x[static_cast<std::size_t>(r * outputs + o)];
      ASSERT_EQ(got, want) << "output " << o;
    }
  }
}
