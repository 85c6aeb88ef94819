// The tagged caching allocator: alignment, per-tag current/peak accounting
// (including retagging a live block), MemTagScope, zero system allocations in
// the steady state, and the out-of-memory error under a limit.
//
// The allocator is process-wide and other tests allocate too, so every check
// works on differences of the counters, and uses tags nothing else touches
// (optimizer_state, workspace) where absolute values matter.
#include <cstdint>

#include "test_util.h"

namespace athanor {
using namespace athanor::testing;

namespace {
Allocator& A() { return Allocator::cpu(); }
std::size_t cur(MemTag t) { return A().stats().of(t); }
}  // namespace

TEST(Allocator, SixtyFourByteAlignment) {
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{63}, std::size_t{64},
                        std::size_t{65}, std::size_t{100}, std::size_t{1000}, std::size_t{4095}, std::size_t{4097},
                        std::size_t{65537}, std::size_t{1} << 20, (std::size_t{2} << 20) - 1, std::size_t{2} << 20,
                        (std::size_t{3} << 20) + 7}) {
    for (int rep = 0; rep < 3; ++rep) {
      void* p = A().allocate(n, MemTag::workspace);
      ASSERT_NE(p, nullptr) << n;
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u) << "size " << n;
      if (n) static_cast<char*>(p)[n - 1] = 1;  // the whole requested range is writable
      blocks.emplace_back(p, n);
    }
  }
  for (auto [p, n] : blocks) A().deallocate(p, n, MemTag::workspace);
  // Tensors' data is aligned too, for every dtype and small size.
  for (DType dt : {DType::f32, DType::bf16, DType::u8, DType::f64})
    for (int64_t n = 1; n < 40; n += 3)
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(empty({n}, dt).raw_data()) % 64, 0u);
}

TEST(Allocator, PerTagCurrentAndPeak) {
  const std::size_t os0 = cur(MemTag::optimizer_state), ws0 = cur(MemTag::workspace);
  const std::size_t total0 = A().stats().current_total;
  A().reset_peak();
  {
    Tensor a = empty({1000}, TensorOptions(DType::f32).with_tag(MemTag::optimizer_state));  // 4000 B
    Tensor b = empty({500}, TensorOptions(DType::f64).with_tag(MemTag::workspace));         // 4000 B
    Tensor c = empty({10}, TensorOptions(DType::bf16).with_tag(MemTag::optimizer_state));   // 20 B: requested, not rounded
    MemoryStats s = A().stats();
    EXPECT_EQ(s.of(MemTag::optimizer_state), os0 + 4020);
    EXPECT_EQ(s.of(MemTag::workspace), ws0 + 4000);
    EXPECT_EQ(s.current_total, total0 + 8020);
    EXPECT_GE(s.reserved, s.current_total);
    {
      Tensor d = empty({2000}, TensorOptions(DType::f32).with_tag(MemTag::optimizer_state));
      EXPECT_EQ(cur(MemTag::optimizer_state), os0 + 12020);
    }
    s = A().stats();
    EXPECT_EQ(s.of(MemTag::optimizer_state), os0 + 4020);
    EXPECT_EQ(s.peak_of(MemTag::optimizer_state), os0 + 12020);  // the high-water mark stays
    EXPECT_EQ(s.peak_of(MemTag::workspace), ws0 + 4000);
    EXPECT_GE(s.peak_total, total0 + 16020);

    // Retag a live block: Storage::set_tag moves its bytes (current and peak) to the new tag.
    A().reset_peak();
    b.storage()->set_tag(MemTag::optimizer_state);
    EXPECT_EQ(b.storage()->tag(), MemTag::optimizer_state);
    s = A().stats();
    EXPECT_EQ(s.of(MemTag::workspace), ws0);
    EXPECT_EQ(s.of(MemTag::optimizer_state), os0 + 8020);
    EXPECT_EQ(s.peak_of(MemTag::optimizer_state), os0 + 8020);
    EXPECT_EQ(s.current_total, total0 + 8020);  // moving bytes between tags leaves the total alone
    b.storage()->set_tag(MemTag::optimizer_state);  // same tag: no change
    EXPECT_EQ(cur(MemTag::optimizer_state), os0 + 8020);
  }
  // Freed under the tag it had at the end: nothing is left behind in either tag.
  EXPECT_EQ(cur(MemTag::optimizer_state), os0);
  EXPECT_EQ(cur(MemTag::workspace), ws0);
  EXPECT_EQ(A().stats().current_total, total0);

  // Wrapped (externally owned) storage is not counted under any tag.
  std::vector<float> buf(256);
  bool released = false;
  {
    auto w = Storage::wrap(buf.data(), buf.size() * 4, [&](void*) { released = true; });
    EXPECT_EQ(A().stats().current_total, total0);
    w->set_tag(MemTag::workspace);
    EXPECT_EQ(cur(MemTag::workspace), ws0);
  }
  EXPECT_TRUE(released);

  const std::string report = A().stats().str();
  for (const char* tag : {"parameter", "gradient", "optimizer_state", "activation", "workspace", "other", "total"})
    EXPECT_NE(report.find(tag), std::string::npos) << report;
}

TEST(Allocator, MemTagScope) {
  EXPECT_EQ(default_mem_tag(), MemTag::other);
  {
    MemTagScope outer(MemTag::activation);
    EXPECT_EQ(empty({4}).storage()->tag(), MemTag::activation);
    {
      MemTagScope inner(MemTag::gradient);
      EXPECT_EQ(default_mem_tag(), MemTag::gradient);
      EXPECT_EQ(zeros({4}).storage()->tag(), MemTag::gradient);
      // An explicit tag wins over the scope.
      EXPECT_EQ(empty({4}, TensorOptions().with_tag(MemTag::parameter)).storage()->tag(), MemTag::parameter);
    }
    EXPECT_EQ(default_mem_tag(), MemTag::activation);
    const std::size_t act0 = cur(MemTag::activation);
    Tensor t = empty({256}, DType::f64);
    EXPECT_EQ(cur(MemTag::activation), act0 + 2048);
  }
  EXPECT_EQ(default_mem_tag(), MemTag::other);
  EXPECT_EQ(empty({4}).storage()->tag(), MemTag::other);
}

TEST(Allocator, SteadyStateMakesNoSystemAllocations) {
  if (!A().caching()) GTEST_SKIP() << "ATHANOR_ALLOCATOR_CACHE=0: every allocation reaches the system by design";
  // One "training step": the same sizes allocated and freed in the same pattern,
  // including sizes in the same size class and blocks >= 2 MiB (mmap path).
  auto step = [] {
    Tensor a = empty({1000});
    Tensor b = empty({1001});  // same size class as a
    Tensor c = empty({64, 64}, DType::f64);
    { Tensor tmp = empty({3}, DType::u8); }
    Tensor big = empty({1 << 20});  // 4 MiB
    Tensor d = empty({777}, DType::bf16);
    { Tensor e = empty({1 << 19}, DType::f64); }  // freed mid-step and reused below
    Tensor f = empty({1 << 19}, DType::f64);
  };
  for (int i = 0; i < 3; ++i) step();
  const MemoryStats before = A().stats();
  for (int i = 0; i < 50; ++i) step();
  const MemoryStats after = A().stats();
  EXPECT_EQ(after.system_allocs, before.system_allocs);
  EXPECT_EQ(after.system_frees, before.system_frees);
  EXPECT_EQ(after.reserved, before.reserved);
  EXPECT_GE(after.cache_hits - before.cache_hits, 50u * 8u);
  EXPECT_EQ(after.current_total, before.current_total);
}

TEST(Allocator, LimitRaisesOutOfMemoryWithBreakdown) {
  const MemoryStats s0 = A().stats();
  Tensor keep = empty({1024}, TensorOptions(DType::f32).with_tag(MemTag::parameter));  // something to report
  A().set_limit(A().stats().current_total + (std::size_t{1} << 20));                  // 1 MiB of headroom
  std::string msg;
  {
    Tensor ok = empty({1 << 17}, TensorOptions(DType::f32).with_tag(MemTag::activation));  // 512 KiB fits
    msg = error_message([] { empty({1 << 18}, TensorOptions(DType::f32).with_tag(MemTag::activation)); });  // 1 MiB does not
    // A large request by another route fails the same way and leaves no trace.
    EXPECT_THROW(A().allocate(std::size_t{8} << 20, MemTag::workspace), Error);
  }
  A().set_limit(0);  // back to unlimited before anything else can fail

  EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1.0 MiB"), std::string::npos) << msg;     // what was asked for
  EXPECT_NE(msg.find("activation"), std::string::npos) << msg;  // under which tag
  for (const char* tag : {"parameter:", "gradient:", "optimizer_state:", "activation:", "workspace:", "total in use"})
    EXPECT_NE(msg.find(tag), std::string::npos) << "breakdown lacks " << tag << ":\n" << msg;
  EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("batch size"), std::string::npos) << msg;

  // Nothing leaked or corrupted: the failed requests were never counted, and
  // allocation works again (and its memory is usable).
  keep = Tensor();
  const MemoryStats s1 = A().stats();
  EXPECT_EQ(s1.current_total, s0.current_total);
  for (int i = 0; i < kNumMemTags; ++i) EXPECT_EQ(s1.current[i], s0.current[i]) << mem_tag_name(static_cast<MemTag>(i));
  Tensor big = full({1 << 20}, 3.0);
  EXPECT_EQ(big.sum().item(), 3.0 * (1 << 20));
}

}  // namespace athanor
