// The pointwise kernel (src/backend/cuda/pointwise.h), f32/bf16/f16:
//  - the host-side plan (which kernel a call takes) and an emulation of the vectorized kernel's
//    grid over its elements: these run without a GPU;
//  - the vectorized candidate against the generic kernel, bit for bit, for every op and every
//    dtype form it is instantiated for, sizes around the vector width and above the grid,
//    views at element offsets 1..7 (the scalar head), dropout at a nonzero offset; and the
//    casts of core's copy (copy.cu) with the candidate on against off.
// f64: test_gpu_pointwise_f64.cpp.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "athanor/core/error.h"
#include "athanor/core/half.h"
#include "backend/cpu/dropout.h"
#include "backend/cuda/candidates.h"
#include "backend/cuda/pointwise.h"
#include "gpu_test.h"
#include "pointwise_test_util.h"

using namespace athanor;
using namespace athanor::gpu_test;
using namespace athanor::pointwise_test;
using cuda::PointwiseKernel;

namespace {

// ---- host side: the plan, on fake (never dereferenced) addresses

const void* at(uintptr_t byte_address) { return reinterpret_cast<const void*>(byte_address); }
constexpr uintptr_t kBase = 0x7f0000001000;  // 16-byte aligned

TEST(GpuPointwisePlan, F64TakesTheF64KernelWhateverTheCandidate) {
  for (bool vec : {false, true}) {
    PointwiseArgs a = args_1d(PointwiseOp::add, 64, DType::f64, DType::f32, DType::f64);
    a.in[0].data = at(kBase), a.in[1].data = at(kBase + 4096), a.out = const_cast<void*>(at(kBase + 8192));
    EXPECT_EQ(cuda::plan_pointwise(a, vec).kernel, PointwiseKernel::generic_f64);
    a = args_1d(PointwiseOp::copy, 64, DType::bf16, DType::bf16, DType::f64);  // only the output is f64
    a.in[0].data = at(kBase), a.out = const_cast<void*>(at(kBase + 8192));
    EXPECT_EQ(cuda::plan_pointwise(a, vec).kernel, PointwiseKernel::generic_f64);
  }
}

TEST(GpuPointwisePlan, TheFormsOfTheVectorizedKernel) {
  struct Want {
    PointwiseOp op;
    DType in0, in1, out;
    PointwiseKernel kernel;
  };
  const Want cases[] = {
      {PointwiseOp::gelu_tanh, DType::bf16, DType::bf16, DType::bf16, PointwiseKernel::vectorized},
      {PointwiseOp::add, DType::f32, DType::f32, DType::f32, PointwiseKernel::vectorized},
      {PointwiseOp::silu_mul_grad_gate, DType::f16, DType::f16, DType::f16, PointwiseKernel::vectorized},
      {PointwiseOp::copy, DType::f32, DType::f32, DType::bf16, PointwiseKernel::vectorized_cast},
      {PointwiseOp::copy, DType::bf16, DType::bf16, DType::f16, PointwiseKernel::vectorized_cast},
      {PointwiseOp::add, DType::f32, DType::bf16, DType::f32, PointwiseKernel::vectorized_mixed},  // the residual add
      {PointwiseOp::add, DType::bf16, DType::f32, DType::f32, PointwiseKernel::vectorized_mixed},
      {PointwiseOp::silu_mul_grad_up, DType::f32, DType::f16, DType::f32, PointwiseKernel::vectorized_mixed},
      // not instantiated: generic
      {PointwiseOp::relu, DType::f32, DType::f32, DType::bf16, PointwiseKernel::generic},  // a non-copy op changing dtype
      {PointwiseOp::add, DType::f32, DType::bf16, DType::bf16, PointwiseKernel::generic},
      {PointwiseOp::add, DType::bf16, DType::f16, DType::f32, PointwiseKernel::generic},
      {PointwiseOp::sub, DType::bf16, DType::bf16, DType::f32, PointwiseKernel::generic},
  };
  for (const Want& w : cases) {
    PointwiseArgs a = args_1d(w.op, 1000, w.in0, w.in1, w.out);
    for (int k = 0; k < a.n_in; ++k) a.in[k].data = at(kBase + 65536 * (k + 1));
    a.out = const_cast<void*>(at(kBase));
    EXPECT_EQ(cuda::plan_pointwise(a, true).kernel, w.kernel) << "op " << int(w.op) << " " << dtype_name(w.in0) << ","
                                                              << dtype_name(w.in1) << " -> " << dtype_name(w.out);
    EXPECT_EQ(cuda::plan_pointwise(a, false).kernel, PointwiseKernel::generic) << "the candidate off";
  }
  // Inputs 1 and 2 must share a dtype.
  PointwiseArgs a = args_1d(PointwiseOp::silu_mul_grad_gate, 1000, DType::f32, DType::f32, DType::f32);
  for (int k = 0; k < 3; ++k) a.in[k].data = at(kBase + 65536 * (k + 1));
  a.out = const_cast<void*>(at(kBase));
  EXPECT_EQ(cuda::plan_pointwise(a, true).kernel, PointwiseKernel::vectorized);
  a.in[2].dtype = DType::bf16;
  EXPECT_EQ(cuda::plan_pointwise(a, true).kernel, PointwiseKernel::generic);
  // A strided (or broadcast) input: generic.
  a.in[2].dtype = DType::f32;
  a.in[1].contiguous = false;
  EXPECT_EQ(cuda::plan_pointwise(a, true).kernel, PointwiseKernel::generic);
}

TEST(GpuPointwisePlan, HeadVectorsAndTail) {
  auto plan = [](int64_t n, DType in, uintptr_t in_addr, DType out, uintptr_t out_addr) {
    PointwiseArgs a = args_1d(in == out ? PointwiseOp::relu : PointwiseOp::copy, n, in, in, out);
    a.in[0].data = at(in_addr), a.out = const_cast<void*>(at(out_addr));
    return cuda::plan_pointwise(a, true);
  };
  // Aligned: no head; vectors of 8, a tail below 8.
  cuda::PointwisePlan p = plan(4096 + 3, DType::bf16, kBase, DType::bf16, kBase + 65536);
  EXPECT_EQ(p.kernel, PointwiseKernel::vectorized);
  EXPECT_EQ(p.n, 4099);
  EXPECT_EQ(p.head, 0);
  EXPECT_EQ(p.vectors, 512);
  // Both bf16 views at element offset 3: the head runs 5 elements to the 16-byte boundary.
  p = plan(4099, DType::bf16, kBase + 6, DType::bf16, kBase + 65536 + 6);
  EXPECT_EQ(p.kernel, PointwiseKernel::vectorized);
  EXPECT_EQ(p.head, 5);
  EXPECT_EQ(p.vectors, (4099 - 5) / 8);
  // f32 at element offset 1 into bf16 at element offset 5: 3 elements bring both to 16 bytes
  // (4 + 12 and 10 + 6).
  p = plan(100, DType::f32, kBase + 4, DType::bf16, kBase + 65536 + 10);
  EXPECT_EQ(p.kernel, PointwiseKernel::vectorized_cast);
  EXPECT_EQ(p.head, 3);
  EXPECT_EQ(p.vectors, (100 - 3) / 8);
  // A view at offset 1 read into an aligned output: no common head, generic.
  for (int k = 1; k < 8; ++k)
    EXPECT_EQ(plan(100, DType::bf16, kBase + 2 * k, DType::bf16, kBase + 65536).kernel, PointwiseKernel::generic) << k;
  // A pointer not aligned to its element: generic.
  EXPECT_EQ(plan(100, DType::bf16, kBase + 1, DType::bf16, kBase + 65536 + 1).kernel, PointwiseKernel::generic);
  // Fewer elements than the head: all of them are head, no vector.
  p = plan(3, DType::bf16, kBase + 2, DType::bf16, kBase + 65536 + 2);  // head would be 7
  EXPECT_EQ(p.kernel, PointwiseKernel::vectorized);
  EXPECT_EQ(p.head, 3);
  EXPECT_EQ(p.vectors, 0);
  // Nothing to do: generic (pointwise returns before any launch).
  p = plan(0, DType::f32, kBase, DType::f32, kBase + 65536);
  EXPECT_EQ(p.n, 0);
  EXPECT_EQ(p.kernel, PointwiseKernel::generic);
  // A 2-D contiguous call counts every element.
  PointwiseArgs a = args_1d(PointwiseOp::gelu_tanh, 0, DType::f16, DType::f16, DType::f16);
  a.ndim = 2, a.sizes[0] = 16, a.sizes[1] = 3072;
  a.in[0].data = at(kBase), a.out = const_cast<void*>(at(kBase + (1 << 20)));
  p = cuda::plan_pointwise(a, true);
  EXPECT_EQ(p.n, 16 * 3072);
  EXPECT_EQ(p.vectors, 16 * 3072 / 8);
}

// The vectorized kernel's coverage, emulated on the host with its own index function
// (pointwise_scalar_element) and grid (pointwise_vector_blocks): every element of [0, n)
// exactly once, by a step or by the scalar head and tail, each step's words 16-byte aligned.
TEST(GpuPointwisePlan, TheVectorizedKernelCoversEveryElementOnce) {
  for (int sms : {1, 132})  // one SM: at most 8 blocks, so n = 20000 takes two grid-stride rounds
    for (int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 100, 4095, 4099, 20000})
      for (int64_t k = 0; k < 8; ++k)
        for (DType in : {DType::f32, DType::bf16})
          for (DType out : {DType::f32, DType::bf16}) {
            SCOPED_TRACE("n " + std::to_string(n) + ", offset " + std::to_string(k) + ", " + dtype_name(in) + " -> " +
                         dtype_name(out) + ", SMs " + std::to_string(sms));
            PointwiseArgs a = args_1d(in == out ? PointwiseOp::relu : PointwiseOp::copy, n, in, in, out);
            const uintptr_t in_addr = kBase + k * dtype_size(in), out_addr = kBase + (1 << 20) + k * dtype_size(out);
            a.in[0].data = at(in_addr), a.out = const_cast<void*>(at(out_addr));
            const cuda::PointwisePlan p = cuda::plan_pointwise(a, true);
            ASSERT_NE(p.kernel, PointwiseKernel::generic);
            ASSERT_LT(p.head, cuda::kPointwiseVector);
            std::vector<int> hits(static_cast<std::size_t>(n), 0);
            const int64_t threads = int64_t{256} * cuda::pointwise_vector_blocks(p.vectors, sms);
            for (int64_t t = 0; t < threads; ++t) {
              for (int64_t s = t; s < p.vectors; s += threads) {  // the kernel's grid-stride loop
                const int64_t i0 = p.head + s * cuda::kPointwiseVector;
                ASSERT_EQ((in_addr + i0 * dtype_size(in)) % 16, 0u) << "step " << s;
                ASSERT_EQ((out_addr + i0 * dtype_size(out)) % 16, 0u) << "step " << s;
                for (int64_t j = 0; j < cuda::kPointwiseVector; ++j) {
                  ASSERT_LT(i0 + j, n) << "step " << s;
                  ++hits[static_cast<std::size_t>(i0 + j)];
                }
              }
              const int64_t i = cuda::pointwise_scalar_element(t, n, p.head, p.vectors);
              if (i < 0) continue;
              ASSERT_LT(t, 16) << "a scalar element beyond the first 16 threads";
              ASSERT_LT(i, n);
              ++hits[static_cast<std::size_t>(i)];
            }
            for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<std::size_t>(i)], 1) << "element " << i;
          }
}

TEST(GpuPointwisePlan, GridAndRowMajorStrides) {
  EXPECT_EQ(cuda::pointwise_vector_blocks(0, 132), 1u);  // the head and tail still need a block
  EXPECT_EQ(cuda::pointwise_vector_blocks(1, 132), 1u);
  EXPECT_EQ(cuda::pointwise_vector_blocks(256, 132), 1u);
  EXPECT_EQ(cuda::pointwise_vector_blocks(257, 132), 2u);
  EXPECT_EQ(cuda::pointwise_vector_blocks(int64_t{1} << 30, 132), 132u * 8);
  EXPECT_EQ(cuda::pointwise_vector_blocks(int64_t{1} << 30, 0), 8u);
  const int64_t sizes[3] = {4, 1, 6};
  const int64_t dense[3] = {6, 999, 1}, transposed[3] = {1, 6, 4}, broadcast[3] = {0, 0, 1};
  EXPECT_TRUE(cuda::row_major_strides(3, sizes, dense));  // a size-1 dim's stride is free
  EXPECT_FALSE(cuda::row_major_strides(3, sizes, transposed));
  EXPECT_FALSE(cuda::row_major_strides(3, sizes, broadcast));
  EXPECT_TRUE(cuda::row_major_strides(0, sizes, dense));  // a scalar
}

TEST(GpuPointwisePlan, BadCallsAreErrorsBeforeAnyWork) {
  PointwiseArgs a = args_1d(PointwiseOp::add, 10, DType::f32, DType::i32, DType::f32);
  a.in[0].data = at(kBase), a.in[1].data = at(kBase + 4096), a.out = const_cast<void*>(at(kBase + 8192));
  try {
    cuda::plan_pointwise(a, true);
    FAIL() << "an i32 input was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("input 1 is i32"), std::string::npos) << m;
    EXPECT_NE(m.find("f64"), std::string::npos) << m;  // the hint names the dtypes taken
  }
  a.in[1].dtype = DType::f32;
  a.n_in = 1;
  EXPECT_THROW(cuda::plan_pointwise(a, true), Error);  // add reads 2 inputs
  a.n_in = 2;
  a.ndim = cuda::kMaxIndexDims + 1;
  EXPECT_THROW(cuda::plan_pointwise(a, true), Error);
  a.ndim = 1;
  a.out_dtype = DType::boolean;
  EXPECT_THROW(cuda::plan_pointwise(a, true), Error);
  a.out_dtype = DType::f64;  // f64 is taken now
  EXPECT_NO_THROW(cuda::plan_pointwise(a, true));
}

// ---- the vectorized kernel against the generic one (GPU)


std::vector<uint8_t> to_bytes(DType dt, const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * dtype_size(dt));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::f32) {
      std::memcpy(&b[4 * i], &v[i], 4);
    } else {
      const uint16_t h = dt == DType::bf16 ? float_to_bf16_bits(v[i]) : float_to_f16_bits(v[i]);
      std::memcpy(&b[2 * i], &h, 2);
    }
  }
  return b;
}

constexpr int64_t kBig = (int64_t{1} << 20) + 5;   // ~1M + 5
constexpr int64_t kHuge = (int64_t{1} << 22) + 5;  // 4M + 5: 512K vectors, more than the grid's threads below 256 SMs
constexpr int64_t kPoolElems = kHuge + 16;

// Inputs on the device: three slots per dtype, each kPoolElems long.
struct InputPool {
  std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> buf;  // [dtype index * 3 + slot]
  InputPool() {
    for (DType dt : kFloat3)
      for (int s = 0; s < 3; ++s) buf.push_back(std::make_unique<DeviceBuffer<uint8_t>>(to_bytes(dt, input_values(kPoolElems, s))));
  }
  const uint8_t* at(DType dt, int slot) const {
    const int d = dt == DType::f32 ? 0 : dt == DType::bf16 ? 1 : 2;
    return buf[static_cast<std::size_t>(d * 3 + slot)]->ptr;
  }
};

struct Form {
  PointwiseOp op;
  DType in0, in1, out;
};

// Every (op, dtypes) the vectorized kernel is instantiated for (pointwise.h's three forms).
std::vector<Form> vector_forms() {
  std::vector<Form> f;
  for (int k = 0; k < kOps; ++k)
    for (DType t : kFloat3) f.push_back({op_at(k), t, t, t});
  for (DType s : kFloat3)
    for (DType d : kFloat3)
      if (s != d) f.push_back({PointwiseOp::copy, s, s, d});
  for (int k = 0; k < kOps; ++k) {
    if (cuda::pointwise_arity(op_at(k)) < 2) continue;
    for (DType h : {DType::bf16, DType::f16}) {
      f.push_back({op_at(k), DType::f32, h, DType::f32});
      f.push_back({op_at(k), h, DType::f32, DType::f32});
    }
  }
  return f;
}

std::string describe(const Form& f, int64_t n, const int64_t* off) {
  char s[200];
  std::snprintf(s, sizeof s, "op %d (%s, %s -> %s), n %lld, offsets in %lld %lld %lld out %lld", static_cast<int>(f.op),
                dtype_name(f.in0), dtype_name(f.in1), dtype_name(f.out), static_cast<long long>(n),
                static_cast<long long>(off[0]), static_cast<long long>(off[1]), static_cast<long long>(off[2]),
                static_cast<long long>(off[3]));
  return s;
}

// Runs the form over n elements, inputs k at element offset off[k] of their pool slot, the
// output at element offset off[3] of a fresh buffer with a guard pattern around it, once with
// the candidate off (generic) and once on; the two buffers, guards included, must be the same
// bytes. `must_vectorize`: the plan has to give a vectorized kernel (so the candidate ran).
::testing::AssertionResult candidate_matches_generic(const InputPool& pool, const Form& f, int64_t n, const int64_t* off,
                                                     bool must_vectorize) {
  PointwiseArgs a = args_1d(f.op, n, f.in0, f.in1, f.out);
  for (int k = 0; k < a.n_in; ++k) a.in[k].data = pool.at(a.in[k].dtype, k) + off[k] * dtype_size(a.in[k].dtype);
  const std::size_t os = dtype_size(f.out);
  const std::size_t bytes = static_cast<std::size_t>(n + off[3] + 16) * os;
  DeviceBuffer<uint8_t> generic(bytes), vectorized(bytes);
  ATH_CUDA(cudaMemsetAsync(generic.ptr, 0xA5, bytes, stream()));
  ATH_CUDA(cudaMemsetAsync(vectorized.ptr, 0xA5, bytes, stream()));
  a.out = generic.ptr + off[3] * os;
  {
    cuda::CandidateOverride o(cuda::Candidate::pointwise_vectorized, false);
    cuda::pointwise(a, stream());
  }
  a.out = vectorized.ptr + off[3] * os;
  const cuda::PointwisePlan plan = cuda::plan_pointwise(a, true);
  if (must_vectorize && (plan.kernel == PointwiseKernel::generic || plan.kernel == PointwiseKernel::generic_f64))
    return ::testing::AssertionFailure() << describe(f, n, off) << ": the plan gives the generic kernel";
  {
    cuda::CandidateOverride o(cuda::Candidate::pointwise_vectorized, true);
    cuda::pointwise(a, stream());
  }
  const std::vector<uint8_t> g = generic.host(), v = vectorized.host();
  for (std::size_t b = 0; b < bytes; ++b)
    if (g[b] != v[b]) {
      const int64_t e = static_cast<int64_t>(b / os) - off[3];
      return ::testing::AssertionFailure() << describe(f, n, off) << ": element " << e
                                           << (e < 0 || e >= n ? " (outside the output: a guard byte)" : "")
                                           << " differs (byte " << int(g[b]) << " generic, " << int(v[b])
                                           << " vectorized; head " << plan.head << ", vectors " << plan.vectors << ")";
    }
  return ::testing::AssertionSuccess();
}

TEST(GpuPointwise, VectorizedMatchesGenericBitForBit) {
  ATH_REQUIRE_GPU();
  const InputPool pool;
  const int64_t zero[4] = {0, 0, 0, 0};
  int cases = 0;
  for (const Form& f : vector_forms())
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{4095}, int64_t{4096 + 3}, kBig}) {
      ASSERT_TRUE(candidate_matches_generic(pool, f, n, zero, n > 0));
      ++cases;
    }
  // More vectors than the grid has threads: the grid-stride loop's later rounds.
  for (const Form& f : {Form{PointwiseOp::copy, DType::f32, DType::f32, DType::bf16},
                        Form{PointwiseOp::add, DType::f32, DType::bf16, DType::f32},
                        Form{PointwiseOp::gelu_tanh, DType::bf16, DType::bf16, DType::bf16},
                        Form{PointwiseOp::dropout, DType::f32, DType::f32, DType::f32}})
    ASSERT_TRUE(candidate_matches_generic(pool, f, kHuge, zero, true));
  std::printf("[ pointwise ] %d forms x sizes compared\n", cases);
}

TEST(GpuPointwise, VectorizedMatchesGenericAtUnalignedOffsets) {
  ATH_REQUIRE_GPU();
  const InputPool pool;
  for (const Form& f : vector_forms())
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{9}, int64_t{4096 + 3}})
      for (int64_t k = 1; k < 8; ++k) {
        // Every operand a view at element offset k: the head of 8 - k elements brings each of
        // them (2 or 4 bytes an element) to a 16-byte boundary.
        const int64_t same[4] = {k, k, k, k};
        ASSERT_TRUE(candidate_matches_generic(pool, f, n, same, true));
        // Inputs at offset k, the output aligned: no common head, the generic kernel.
        const int64_t in_only[4] = {k, k, k, 0};
        ASSERT_TRUE(candidate_matches_generic(pool, f, n, in_only, false));
      }
  // Different offsets with a common head: f32 at element offset 1, bf16 at 5 (head 3).
  const int64_t mixed[4] = {1, 5, 5, 1};
  for (PointwiseOp op : {PointwiseOp::add, PointwiseOp::mul, PointwiseOp::silu_mul_grad_gate})
    for (int64_t n : {int64_t{2}, int64_t{11}, int64_t{4096 + 3}})
      ASSERT_TRUE(candidate_matches_generic(pool, Form{op, DType::f32, DType::bf16, DType::f32}, n, mixed, true));
}

TEST(GpuPointwise, VectorizedDropoutKeepsTheCpuMaskAtAnOffset) {
  ATH_REQUIRE_GPU();
  // The candidate equals the generic kernel (above); here its mask is also the CPU's (the
  // keep bit of element i at Philox counter offset + i / 4), and not trivial.
  const int64_t n = 4096 + 5;
  std::vector<float> x(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = 1.0f + static_cast<float>(i % 13);
  DeviceBuffer<float> dx(x), dy(static_cast<std::size_t>(n));
  PointwiseArgs a = args_1d(PointwiseOp::dropout, n, DType::f32, DType::f32, DType::f32);
  a.in[0].data = dx.ptr, a.out = dy.ptr;
  ASSERT_EQ(cuda::plan_pointwise(a, true).kernel, PointwiseKernel::vectorized);
  {
    cuda::CandidateOverride o(cuda::Candidate::pointwise_vectorized, true);
    cuda::pointwise(a, stream());
  }
  std::vector<float> want(static_cast<std::size_t>(n));
  cpu::dropout_apply<float>(x.data(), want.data(), n, kSeed, kOffset, kThreshold, 2.0);
  const std::vector<float> got = dy.host();
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i], want[i]) << "element " << i;
    kept += got[i] != 0.0f;
  }
  EXPECT_GT(kept, n / 3);
  EXPECT_LT(kept, 2 * n / 3);
}

// core's casts (copy.cu, the "cast" op and Tensor::to) with the candidate on against off.
TEST(GpuPointwise, CastsThroughCoreCopyMatchWithTheCandidate) {
  ATH_REQUIRE_GPU();
  for (DType s : kFloat3)
    for (DType d : kFloat3) {
      if (s == d) continue;
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{9}, int64_t{4096 + 3}, kBig}) {
        const Tensor src = from_vector(input_values(n, 0), {n}, TensorOptions(DType::f32)).to(s).cuda();
        Tensor off, on;
        {
          cuda::CandidateOverride o(cuda::Candidate::pointwise_vectorized, false);
          off = src.to(d).cpu();
        }
        {
          cuda::CandidateOverride o(cuda::Candidate::pointwise_vectorized, true);
          on = src.to(d).cpu();
        }
        ASSERT_EQ(std::memcmp(off.raw_data(), on.raw_data(), off.nbytes()), 0) << dtype_name(s) << " -> " << dtype_name(d) << ", n " << n;
        ASSERT_TRUE(same_bits_or_nan(off, src.cpu().to(d)));  // and the CPU's cast
      }
      // Views at element offset k on both sides (copy_ into a slice): the head.
      const int64_t n = 1000;
      for (int64_t k = 1; k < 8; ++k) {
        const Tensor base = from_vector(input_values(n + 8, 1), {n + 8}, TensorOptions(DType::f32)).to(s).cuda();
        const Tensor src = make_view(base, {n}, {1}, k);
        Tensor bytes[2];
        for (int c = 0; c < 2; ++c) {
          cuda::CandidateOverride o(cuda::Candidate::pointwise_vectorized, c == 1);
          Tensor dst = zeros({n + 8}, TensorOptions(d).with_device(Device::cuda(0)));
          make_view(dst, {n}, {1}, k).copy_(src);
          bytes[c] = dst.cpu();
        }
        ASSERT_EQ(std::memcmp(bytes[0].raw_data(), bytes[1].raw_data(), bytes[0].nbytes()), 0)
            << dtype_name(s) << " -> " << dtype_name(d) << ", offset " << k;
      }
    }
}

}  // namespace
