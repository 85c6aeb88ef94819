#include "athanor/core/allocator.h"

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "athanor/core/error.h"

namespace athanor {
namespace {

// Memory that libraries allocate with malloc must stay mapped between steps, too.
// oneDNN's sgemm mallocs its packing buffers on every call and glibc hands freed
// top-of-heap memory back to the kernel (brk shrink, munmap of thread arenas), so
// every step re-faults those pages: ~1,600 minor faults per step for a small GPT at
// ~10 us each on this machine (bench/RESULTS.md, tests/train/test_no_page_faults.cpp).
// Keeping freed memory in the process (no trimming, one arena, a generous top pad)
// makes steady-state steps fault-free. Runs before main(), before any thread exists.
__attribute__((constructor)) void keep_malloc_memory_mapped() {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum; larger blocks are mmapped
}
// What stays: a malloc whose block lands above the heap's high-water mark touches
// fresh pages of glibc's top pad (the 64 MiB the heap grows by at a time), one minor
// fault per 4 KiB page. Kernels that malloc per call (std::vector scratch) and
// long-lived small objects (autograd nodes) interleave, so with two threads the heap's
// used top creeps up a few pages in some warm steps (issue 7: 2-9 faults per GPT step,
// perf: memset in sum_3d's and index_accumulate_rows' vectors). Whenever the program
// break has moved, the top chunk (the free memory between the highest block and the
// break) is populated in one madvise(MADV_POPULATE_WRITE) call, so later growth into
// it takes no faults. Runs at most once per heap extension; a no-op where the kernel
// lacks MADV_POPULATE_WRITE (Linux < 5.14).
void populate_heap_top_if_grown() {
  static std::atomic<std::uintptr_t> seen_break{0};
  const auto brk_now = reinterpret_cast<std::uintptr_t>(sbrk(0));
  std::uintptr_t prev = seen_break.load(std::memory_order_relaxed);
  if (brk_now == prev || !seen_break.compare_exchange_strong(prev, brk_now)) return;
  const std::size_t top = mallinfo2().keepcost;  // bytes of the top chunk, ending at the break
  const std::uintptr_t page = 4096, lo = (brk_now - std::min<std::uintptr_t>(top, brk_now)) / page * page;
  if (brk_now > lo) madvise(reinterpret_cast<void*>(lo), brk_now - lo, MADV_POPULATE_WRITE);
}
constexpr std::size_t kAlign = 64;
constexpr std::size_t kHugeThreshold = std::size_t{2} << 20;
thread_local MemTag tls_tag = MemTag::other;

void* system_alloc(std::size_t n) {
  if (n >= kHugeThreshold) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    madvise(p, n, MADV_HUGEPAGE);
    return p;
  }
  return std::aligned_alloc(kAlign, n);
}
void system_free(void* p, std::size_t n) {
  if (n >= kHugeThreshold) munmap(p, n);
  else std::free(p);
}
std::string human(std::size_t b) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(1);
  if (b >= (1ull << 30)) o << b / double(1ull << 30) << " GiB";
  else if (b >= (1ull << 20)) o << b / double(1ull << 20) << " MiB";
  else if (b >= (1ull << 10)) o << b / double(1ull << 10) << " KiB";
  else o << b << " B";
  return o.str();
}
}  // namespace

const char* mem_tag_name(MemTag t) {
  switch (t) {
    case MemTag::parameter: return "parameter";
    case MemTag::gradient: return "gradient";
    case MemTag::optimizer_state: return "optimizer_state";
    case MemTag::activation: return "activation";
    case MemTag::workspace: return "workspace";
    case MemTag::packed_weights: return "packed_weights";
    case MemTag::other: return "other";
  }
  return "?";
}

std::string MemoryStats::str() const {
  std::ostringstream o;
  for (int i = 0; i < kNumMemTags; ++i)
    o << "  " << mem_tag_name(static_cast<MemTag>(i)) << ": " << human(current[i]) << " (peak " << human(peak[i]) << ")\n";
  o << "  total in use: " << human(current_total) << " (peak " << human(peak_total) << "), reserved: " << human(reserved);
  return o.str();
}

Allocator& Allocator::cpu() {
  static Allocator* a = new Allocator();  // never destroyed: tensors may outlive static destruction
  return *a;
}

Allocator::Allocator() {
  const char* env = std::getenv("ATHANOR_ALLOCATOR_CACHE");
  caching_ = !(env && std::strcmp(env, "0") == 0);
}
Allocator::~Allocator() { release_cached_locked(); }

std::size_t Allocator::size_class(std::size_t n) {
  // Round up to one of 8 steps per power of two (<= 12.5% waste), at least 64 B.
  if (n <= kAlign) return kAlign;
  const std::size_t p = std::bit_floor(n);
  const std::size_t step = std::max(kAlign, p / 8);
  return (n + step - 1) / step * step;
}

void Allocator::account_alloc(std::size_t n, MemTag tag) {
  const int t = static_cast<int>(tag);
  stats_.current[t] += n;
  stats_.peak[t] = std::max(stats_.peak[t], stats_.current[t]);
  stats_.current_total += n;
  stats_.peak_total = std::max(stats_.peak_total, stats_.current_total);
}

void* Allocator::allocate(std::size_t nbytes, MemTag tag) {
  const std::size_t cls = size_class(nbytes);
  populate_heap_top_if_grown();
  std::lock_guard<std::mutex> lock(mu_);
  if (limit_ && stats_.current_total + nbytes > limit_) {
    ATH_FAIL("allocate", "out of memory: asked for ", human(nbytes), " (", mem_tag_name(tag), ") with ",
             human(stats_.current_total), " in use and a limit of ", human(limit_), "\n", stats_.str(),
             Hint{"lower the batch size, enable gradient_checkpointing, use bf16, or raise the memory limit"});
  }
  void* p = nullptr;
  if (caching_) {
    auto it = free_.find(cls);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      ++stats_.cache_hits;
    }
  }
  if (!p) {
    p = system_alloc(cls);
    if (!p) {
      release_cached_locked();
      p = system_alloc(cls);
    }
    if (!p)
      ATH_FAIL("allocate", "out of memory: the system refused ", human(cls), " (", mem_tag_name(tag), ")\n", stats_.str(),
               Hint{"lower the batch size, enable gradient_checkpointing, or use bf16"});
    ++stats_.system_allocs;
    stats_.reserved += cls;
  }
  account_alloc(nbytes, tag);
  return p;
}

void Allocator::deallocate(void* ptr, std::size_t nbytes, MemTag tag) {
  if (!ptr) return;
  const std::size_t cls = size_class(nbytes);
  std::lock_guard<std::mutex> lock(mu_);
  const int t = static_cast<int>(tag);
  stats_.current[t] -= nbytes;
  stats_.current_total -= nbytes;
  if (caching_) {
    free_[cls].push_back(ptr);
  } else {
    system_free(ptr, cls);
    ++stats_.system_frees;
    stats_.reserved -= cls;
  }
}

void Allocator::retag(std::size_t nbytes, MemTag from, MemTag to) {
  if (from == to) return;
  std::lock_guard<std::mutex> lock(mu_);
  stats_.current[static_cast<int>(from)] -= nbytes;
  stats_.current_total -= nbytes;
  account_alloc(nbytes, to);
}

MemoryStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak = stats_.current;
  stats_.peak_total = stats_.current_total;
}

void Allocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

void Allocator::release_cached_locked() {
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) {
      system_free(p, cls);
      ++stats_.system_frees;
      stats_.reserved -= cls;
    }
    blocks.clear();
  }
}

void Allocator::set_limit(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = bytes;
}

MemTag default_mem_tag() { return tls_tag; }
MemTagScope::MemTagScope(MemTag tag) : prev_(tls_tag) { tls_tag = tag; }
MemTagScope::~MemTagScope() { tls_tag = prev_; }

}  // namespace athanor
