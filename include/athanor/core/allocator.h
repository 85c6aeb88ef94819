#pragma once
// The CPU allocator: every allocation carries a tag, and current/peak bytes are
// kept per tag and in total, so memory can be reported by what it holds.
//
// Invariants:
//  - every block is 64-byte aligned (a cache line, and one AVX-512 register);
//  - freed blocks are cached by size class and reused, never handed back to the
//    system between steps: a first touch of fresh memory costs ~10 µs per 4 KiB
//    page on the target machine, so after warm-up a training step makes no
//    system allocations (`system_allocs` stops growing);
//  - blocks of 2 MiB and more come from mmap with MADV_HUGEPAGE;
//  - ATHANOR_ALLOCATOR_CACHE=0 turns caching off (for AddressSanitizer runs).
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace athanor {

// packed_weights: weights also kept in a GEMM library's blocked layout (ops/packed_weights.h).
enum class MemTag : uint8_t { parameter, gradient, optimizer_state, activation, workspace, packed_weights, other };
inline constexpr int kNumMemTags = 7;
const char* mem_tag_name(MemTag t);

struct MemoryStats {
  std::array<std::size_t, kNumMemTags> current{};  // bytes in use per tag (requested sizes)
  std::array<std::size_t, kNumMemTags> peak{};     // high-water mark per tag since the last reset
  std::size_t current_total = 0, peak_total = 0;
  std::size_t reserved = 0;        // bytes obtained from the system and not returned (in use + cached)
  std::uint64_t system_allocs = 0; // calls that reached the system allocator
  std::uint64_t system_frees = 0;
  std::uint64_t cache_hits = 0;
  std::size_t of(MemTag t) const { return current[static_cast<int>(t)]; }
  std::size_t peak_of(MemTag t) const { return peak[static_cast<int>(t)]; }
  std::string str() const;  // a human-readable breakdown
};

class Allocator {
 public:
  static Allocator& cpu();
  void* allocate(std::size_t nbytes, MemTag tag);
  void deallocate(void* ptr, std::size_t nbytes, MemTag tag);
  void retag(std::size_t nbytes, MemTag from, MemTag to);  // move accounting of a live block
  MemoryStats stats() const;
  void reset_peak();
  void empty_cache();  // give every cached block back to the system
  // An upper bound on bytes in use (0 = none). Exceeding it raises an
  // out-of-memory Error that prints the breakdown by tag.
  void set_limit(std::size_t bytes);
  bool caching() const { return caching_; }

 private:
  Allocator();
  ~Allocator();
  void account_alloc(std::size_t n, MemTag tag);
  void release_cached_locked();
  static std::size_t size_class(std::size_t nbytes);
  mutable std::mutex mu_;
  bool caching_ = true;
  std::size_t limit_ = 0;
  MemoryStats stats_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;  // size class -> cached blocks
};

// The tag that new tensor storage gets when none is given (thread-local).
MemTag default_mem_tag();
class MemTagScope {
 public:
  explicit MemTagScope(MemTag tag);
  ~MemTagScope();
  MemTagScope(const MemTagScope&) = delete;
  MemTagScope& operator=(const MemTagScope&) = delete;
 private:
  MemTag prev_;
};

}  // namespace athanor
