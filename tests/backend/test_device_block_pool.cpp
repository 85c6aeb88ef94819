// The caching device allocator's bookkeeping (src/backend/cuda/block_pool.h) on the CPU:
// a fake raw allocator hands out host memory and counts calls, so size classes, splitting,
// coalescing, stream-ordered reuse, tags, empty_cache and the out-of-memory message are
// checked without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <vector>

#include "athanor/core/error.h"
#include "backend/cuda/block_pool.h"

using namespace athanor;
using athanor::cuda::BlockPool;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;

struct FakeDevice {
  explicit FakeDevice(std::size_t cap) : capacity(cap) {}
  std::size_t capacity;
  std::size_t used = 0;
  int allocs = 0, frees = 0;
  std::map<void*, std::size_t> live;
  cuda::RawMemory raw() {
    cuda::RawMemory r;
    r.allocate = [this](std::size_t n) -> void* {
      if (used + n > capacity) return nullptr;
      void* p = std::aligned_alloc(256, n);
      used += n;
      ++allocs;
      live[p] = n;
      return p;
    };
    r.release = [this](void* p, std::size_t n) {
      EXPECT_EQ(live.at(p), n) << "a segment must be released with the size it was allocated with";
      live.erase(p);
      used -= n;
      ++frees;
      std::free(p);
    };
    r.describe_device = [this] { return std::to_string(capacity - used) + " B free of " + std::to_string(capacity); };
    r.device_name = "fake:0";
    // Streams as counters: an event recorded on stream s completes once s has passed its
    // position then (advance(s)); wait_event runs the stream up to it (counted).
    r.record_event = [this](cuda::StreamId s) -> void* {
      events.push_back({s, queued[s]});
      ++live_events;
      return reinterpret_cast<void*>(events.size());  // 1-based
    };
    r.event_done = [this](void* e) { return done(e); };
    r.wait_event = [this](void* e) {
      ++waits;
      const Event& ev = events.at(reinterpret_cast<std::size_t>(e) - 1);
      passed[ev.stream] = std::max(passed[ev.stream], ev.at);
    };
    r.release_event = [this](void* e) {
      EXPECT_TRUE(done(e)) << "an event given back before it completed";
      --live_events;
    };
    return r;
  }
  struct Event {
    cuda::StreamId stream;
    int at;
  };
  std::vector<Event> events;
  std::map<cuda::StreamId, int> queued, passed;  // work queued on / completed by each stream
  int live_events = 0, waits = 0;
  void enqueue(cuda::StreamId s) { ++queued[s]; }   // a kernel queued on s
  void advance(cuda::StreamId s) { passed[s] = queued[s]; }  // s has run everything queued
  bool done(void* e) const {
    const Event& ev = events.at(reinterpret_cast<std::size_t>(e) - 1);
    auto it = passed.find(ev.stream);
    return (it == passed.end() ? 0 : it->second) >= ev.at;
  }
};
}  // namespace

TEST(DeviceBlockPool, SizeClasses) {
  EXPECT_EQ(BlockPool::round_size(0), 512u);
  EXPECT_EQ(BlockPool::round_size(1), 512u);
  EXPECT_EQ(BlockPool::round_size(512), 512u);
  EXPECT_EQ(BlockPool::round_size(513), 1024u);
  EXPECT_EQ(BlockPool::round_size(MiB), MiB);
  EXPECT_EQ(BlockPool::round_size(MiB + 1), 2 * MiB);
  EXPECT_EQ(BlockPool::round_size(5 * MiB + 3), 6 * MiB);
}

TEST(DeviceBlockPool, SmallRequestsShareOneSegment) {
  FakeDevice dev{64 * MiB};
  BlockPool pool(dev.raw());
  void* a = pool.allocate(100, MemTag::activation);
  void* b = pool.allocate(1000, MemTag::activation);
  void* c = pool.allocate(MiB, MemTag::gradient);
  EXPECT_EQ(dev.allocs, 1) << "three small requests fit one 2 MiB segment";
  EXPECT_EQ(pool.segments(), 1u);
  // Carved one after another from the segment, each rounded to 512 bytes.
  EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), 512);
  EXPECT_EQ(static_cast<char*>(c) - static_cast<char*>(b), 1024);
  EXPECT_EQ(pool.stats().reserved, 2 * MiB);
  EXPECT_EQ(pool.cached_bytes(), 2 * MiB - 512 - 1024 - MiB);
  void* d = pool.allocate(MiB, MemTag::gradient);  // no longer fits: a second segment
  EXPECT_EQ(dev.allocs, 2);
  for (void* p : {a, b, c, d}) pool.deallocate(p);
}

TEST(DeviceBlockPool, FreedBlocksCoalesceAndAreReused) {
  FakeDevice dev{64 * MiB};
  BlockPool pool(dev.raw());
  void* a = pool.allocate(4096, MemTag::activation);
  void* b = pool.allocate(4096, MemTag::activation);
  void* c = pool.allocate(4096, MemTag::activation);
  pool.deallocate(a);
  pool.deallocate(c);  // c merges with the segment's free tail
  pool.deallocate(b);  // b merges with a and the tail: one free block, the whole segment
  EXPECT_EQ(pool.largest_cached_block(), 2 * MiB);
  EXPECT_EQ(pool.cached_bytes(), 2 * MiB);
  void* d = pool.allocate(8192, MemTag::workspace);
  EXPECT_EQ(d, a) << "the segment's start is reused";
  EXPECT_EQ(dev.allocs, 1);
  EXPECT_EQ(pool.stats().cache_hits, 3u);  // b, c and d came from the cache
  pool.deallocate(d);
}

TEST(DeviceBlockPool, LargeRequestsAreRoundedAndSplit) {
  FakeDevice dev{256 * MiB};
  BlockPool pool(dev.raw());
  void* a = pool.allocate(20 * MiB + 1, MemTag::parameter);
  EXPECT_EQ(pool.stats().reserved, 22 * MiB);
  pool.deallocate(a);
  // A 5 MiB request takes the cached 22 MiB block, split: the rest stays cached.
  void* b = pool.allocate(5 * MiB, MemTag::parameter);
  EXPECT_EQ(b, a);
  EXPECT_EQ(dev.allocs, 1);
  EXPECT_EQ(pool.largest_cached_block(), 16 * MiB);
  void* c = pool.allocate(16 * MiB, MemTag::parameter);
  EXPECT_EQ(static_cast<char*>(c), static_cast<char*>(a) + 6 * MiB);
  EXPECT_EQ(dev.allocs, 1);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  pool.deallocate(b);
  pool.deallocate(c);
  EXPECT_EQ(pool.largest_cached_block(), 22 * MiB) << "the split halves coalesce again";
  // A large request never takes a small segment's block, and a small one never a large block.
  void* s = pool.allocate(1000, MemTag::activation);
  EXPECT_EQ(dev.allocs, 2);
  pool.deallocate(s);
}

TEST(DeviceBlockPool, ReuseIsPerStream) {
  FakeDevice dev{64 * MiB};
  BlockPool pool(dev.raw());
  void* a = pool.allocate(3 * MiB, MemTag::activation, /*stream=*/1);
  pool.deallocate(a);
  // Stream 2 may not take stream 1's freed block (stream 1's kernels may still use it).
  void* b = pool.allocate(3 * MiB, MemTag::activation, 2);
  EXPECT_NE(b, a);
  EXPECT_EQ(dev.allocs, 2);
  void* c = pool.allocate(3 * MiB, MemTag::activation, 1);
  EXPECT_EQ(c, a);
  pool.deallocate(b);
  pool.deallocate(c);
}

TEST(DeviceBlockPool, TagsCurrentAndPeak) {
  FakeDevice dev{64 * MiB};
  BlockPool pool(dev.raw());
  void* p = pool.allocate(1000, MemTag::parameter);
  void* g = pool.allocate(3000, MemTag::gradient);
  void* w = pool.allocate(5 * MiB, MemTag::workspace);
  auto s = pool.stats();
  EXPECT_EQ(s.of(MemTag::parameter), 1000u);
  EXPECT_EQ(s.of(MemTag::gradient), 3000u);
  EXPECT_EQ(s.of(MemTag::workspace), 5 * MiB);
  EXPECT_EQ(s.current_total, 4000u + 5 * MiB);
  pool.deallocate(w);
  pool.retag(g, MemTag::optimizer_state);
  s = pool.stats();
  EXPECT_EQ(s.of(MemTag::workspace), 0u);
  EXPECT_EQ(s.peak_of(MemTag::workspace), 5 * MiB);
  EXPECT_EQ(s.of(MemTag::gradient), 0u);
  EXPECT_EQ(s.of(MemTag::optimizer_state), 3000u);
  EXPECT_EQ(s.peak_total, 4000u + 5 * MiB);
  pool.reset_peak();
  EXPECT_EQ(pool.stats().peak_total, 4000u);
  pool.deallocate(p);
  pool.deallocate(g);
  EXPECT_EQ(pool.stats().current_total, 0u);
}

TEST(DeviceBlockPool, EmptyCacheReleasesOnlyWholeFreeSegments) {
  FakeDevice dev{64 * MiB};
  BlockPool pool(dev.raw());
  void* keep = pool.allocate(100, MemTag::activation);
  void* drop = pool.allocate(8 * MiB, MemTag::activation);
  pool.deallocate(drop);
  EXPECT_EQ(dev.used, 10 * MiB);
  pool.empty_cache();
  EXPECT_EQ(dev.used, 2 * MiB) << "the small segment still holds a live block";
  EXPECT_EQ(pool.stats().reserved, 2 * MiB);
  EXPECT_EQ(dev.frees, 1);
  pool.deallocate(keep);
  pool.empty_cache();
  EXPECT_EQ(dev.used, 0u);
  EXPECT_EQ(pool.segments(), 0u);
}

TEST(DeviceBlockPool, OutOfMemoryFreesTheCacheThenReportsTheBreakdown) {
  FakeDevice dev{16 * MiB};
  BlockPool pool(dev.raw());
  void* a = pool.allocate(10 * MiB, MemTag::parameter);
  pool.deallocate(a);  // cached, on stream 0
  // On another stream the cached block is not usable: the pool frees it and retries.
  void* b = pool.allocate(12 * MiB, MemTag::activation, 7);
  EXPECT_EQ(dev.frees, 1);
  EXPECT_EQ(pool.stats().of(MemTag::activation), 12 * MiB);
  try {
    pool.allocate(6 * MiB, MemTag::optimizer_state);
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("fake:0 out of memory"), std::string::npos) << m;
    EXPECT_NE(m.find("6.00 MiB (optimizer_state)"), std::string::npos) << m;
    EXPECT_NE(m.find("activation: 12.00 MiB / 12.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("parameter: 0 B / 10.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("largest cached block: 0 B"), std::string::npos) << m;
    EXPECT_NE(m.find("4194304 B free of 16777216"), std::string::npos) << m;
    EXPECT_FALSE(e.hint().empty());
  }
  pool.deallocate(b);
}

TEST(DeviceBlockPool, LimitAndBadFree) {
  FakeDevice dev{64 * MiB};
  BlockPool pool(dev.raw());
  pool.set_limit(MiB);
  EXPECT_THROW(pool.allocate(2 * MiB, MemTag::activation), Error);
  int x = 0;
  EXPECT_THROW(pool.deallocate(&x), Error);
}

// An upload's block belongs to the copy stream (1) and is read by the compute stream (2):
// freed, it is reused by the next upload only once the compute stream has run every kernel
// queued before the free (record_stream), never earlier, and without any wait.
TEST(DeviceBlockPool, RecordStreamDefersReuseUntilTheOtherStreamPasses) {
  FakeDevice dev{64 * MiB};
  BlockPool pool(dev.raw());
  constexpr cuda::StreamId copy = 1, compute = 2;
  void* a = pool.allocate(64 * 1024, MemTag::activation, copy);
  pool.record_stream(a, compute);
  pool.record_stream(a, compute);  // once is enough
  pool.record_stream(a, copy);     // its own stream: nothing to record
  EXPECT_EQ(pool.stream_of(a, 0), copy);
  EXPECT_EQ(pool.stream_of(static_cast<char*>(a) + 512, 99), 99u) << "not the start of a block";
  dev.enqueue(compute);  // the step's kernels reading the batch
  const auto in_use = pool.stats().current_total;
  pool.deallocate(a);
  EXPECT_EQ(pool.stats().current_total, in_use - 64 * 1024) << "freed bytes leave the in-use count at once";
  EXPECT_EQ(pool.pending_blocks(), 1u);
  EXPECT_EQ(dev.events.size(), 1u) << "one event, on the compute stream only";
  EXPECT_EQ(dev.events[0].stream, compute);
  // The compute stream has not passed the free: the next upload gets other memory.
  void* b = pool.allocate(64 * 1024, MemTag::activation, copy);
  EXPECT_NE(b, a);
  EXPECT_EQ(pool.pending_blocks(), 1u);
  EXPECT_EQ(dev.waits, 0) << "reuse is decided by queries, never by a wait";
  dev.advance(compute);
  void* c = pool.allocate(64 * 1024, MemTag::activation, copy);
  EXPECT_EQ(c, a) << "once the compute stream passed the free, the block is reused";
  EXPECT_EQ(pool.pending_blocks(), 0u);
  EXPECT_EQ(dev.live_events, 0) << "the event was given back";
  // A block of the compute stream never serves the copy stream, pending or not.
  void* k = pool.allocate(64 * 1024, MemTag::activation, compute);
  pool.deallocate(k);
  void* d = pool.allocate(64 * 1024, MemTag::activation, copy);
  EXPECT_NE(d, k);
  for (void* p : {b, c, d}) pool.deallocate(p);
  EXPECT_EQ(pool.pending_blocks(), 0u) << "blocks without other streams free at once";
}

// A pending block neither merges with its free neighbours nor lets its segment go until its
// events complete; near out of memory the pool waits for them instead of failing.
TEST(DeviceBlockPool, PendingBlocksKeepTheirSegmentAndAreWaitedForBeforeOutOfMemory) {
  FakeDevice dev{16 * MiB};
  BlockPool pool(dev.raw());
  constexpr cuda::StreamId copy = 1, compute = 2;
  void* big = pool.allocate(12 * MiB, MemTag::activation, copy);
  pool.record_stream(big, compute);
  dev.enqueue(compute);
  pool.deallocate(big);
  pool.empty_cache();  // its event has not completed: the segment stays
  EXPECT_EQ(pool.segments(), 1u);
  EXPECT_EQ(pool.cached_bytes(), 0u) << "a pending block is not cached (not reusable) yet";
  EXPECT_EQ(dev.waits, 0);
  // 8 MiB on the compute stream does not fit beside the pending 12 MiB segment: the pool
  // waits for the compute stream's event, releases the segment and retries.
  void* x = pool.allocate(8 * MiB, MemTag::activation, compute);
  EXPECT_NE(x, nullptr);
  EXPECT_EQ(dev.waits, 1);
  EXPECT_EQ(dev.frees, 1);
  EXPECT_EQ(pool.pending_blocks(), 0u);
  EXPECT_EQ(dev.live_events, 0);
  pool.deallocate(x);
  // Destroying a pool with pending blocks gives their events back.
  {
    FakeDevice d2{16 * MiB};
    {
      BlockPool p2(d2.raw());
      void* y = p2.allocate(1000, MemTag::activation, copy);
      p2.record_stream(y, compute);
      p2.deallocate(y);
      d2.advance(compute);  // (release_event checks completion)
    }
    EXPECT_EQ(d2.live_events, 0);
    EXPECT_EQ(d2.used, 0u);
  }
}
