#pragma once
// The bookkeeping of the caching device allocator, with no CUDA in it: which cached block
// serves a request, how segments are split and coalesced, and the per-tag byte accounting.
// The memory itself comes from a RawMemory (cudaMalloc/cudaFree in device_allocator.cpp, a
// fake in the tests), so every rule here is tested on the CPU.
//
// Invariants:
//  - requests of at most kSmallLimit bytes are rounded up to kSmallRound and carved from
//    kSmallSegment (2 MiB) segments; larger ones are rounded up to kLargeRound and get a
//    segment of their own size, or a cached large block split to fit;
//  - a segment belongs to the stream it was first allocated for, and its blocks are reused
//    only by requests on that stream: a block freed on a stream is free "in stream order"
//    (every later kernel on that stream runs after the last use), so no event is needed;
//  - a block also used on other streams (record_stream: an upload's block belongs to the
//    copy stream and is read by the compute stream) is, when freed, pending: an event is
//    recorded on each of those streams then, and the block joins its stream's free blocks
//    only once every event has completed (queried without blocking at the next allocate;
//    waited for only before an out-of-memory error). PyTorch's record_stream rule: the
//    reuse is ordered after the last use on every stream that used it;
//  - a freed block merges with its free neighbours in the same segment, so a segment
//    whose blocks are all free is one block again and can be released whole;
//  - the raw allocator is called only when no cached block fits; when it fails, every
//    whole free segment is released and the call is tried once more before the
//    out-of-memory error (which prints the breakdown by tag and the largest cached block);
//  - current/peak bytes per tag count requested sizes, `reserved` the segments' bytes.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "athanor/core/allocator.h"

namespace athanor::cuda {

using StreamId = std::uintptr_t;  // a cudaStream_t as an integer (0: the legacy default stream)

struct RawMemory {
  std::function<void*(std::size_t)> allocate;         // nullptr when out of memory
  std::function<void(void*, std::size_t)> release;
  std::function<std::string()> describe_device;       // e.g. "cuda:0: 1.2 GiB free of 80 GiB"
  std::string device_name = "device";                 // for messages: "cuda:0"
  // Events (cudaEvent_t in device_allocator.cpp, a fake in the tests): one recorded on a
  // stream now; whether it has completed (never blocks); waiting for it (blocks); giving it
  // back. Needed only by record_stream's blocks.
  std::function<void*(StreamId)> record_event;
  std::function<bool(void*)> event_done;
  std::function<void(void*)> wait_event;
  std::function<void(void*)> release_event;
};

class BlockPool {
 public:
  static constexpr std::size_t kSmallLimit = std::size_t{1} << 20;    // 1 MiB
  static constexpr std::size_t kSmallRound = 512;
  static constexpr std::size_t kSmallSegment = std::size_t{2} << 20;  // 2 MiB
  static constexpr std::size_t kLargeRound = std::size_t{2} << 20;    // 2 MiB
  // A large cached block is split only when the rest is at least this big (smaller rests
  // stay with the block: internal slack, not a fragment nobody can use).
  static constexpr std::size_t kMinLargeSplit = std::size_t{1} << 20;

  explicit BlockPool(RawMemory raw);
  ~BlockPool();  // releases every segment (blocks still in use are a caller's bug, not checked)
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  static std::size_t round_size(std::size_t nbytes);

  // Throws athanor::Error (op "cuda allocator") when the memory cannot be had.
  void* allocate(std::size_t nbytes, MemTag tag, StreamId stream = 0);
  void deallocate(void* ptr);  // ptr must come from allocate(); nullptr is ignored
  // The block `ptr` (from allocate()) is also used by work on `stream`: its reuse after
  // deallocate() waits until `stream` has passed the point where it was freed.
  void record_stream(void* ptr, StreamId stream);
  // The stream a live block was allocated for; `none` when ptr is not the start of one.
  StreamId stream_of(const void* ptr, StreamId none) const;
  std::size_t pending_blocks() const;  // freed, waiting for another stream's events
  void retag(void* ptr, MemTag to);
  // An upper bound on bytes in use (0: none), as Allocator::set_limit on the CPU.
  void set_limit(std::size_t bytes);

  MemoryStats stats() const;
  void reset_peak();
  std::size_t largest_cached_block() const;
  std::size_t cached_bytes() const;  // free bytes inside reserved segments
  std::size_t segments() const;
  // Releases every segment that is wholly free (pending blocks whose events are done first;
  // the caller has waited for the device when it wants them all).
  void empty_cache();
  std::string oom_message(std::size_t nbytes, MemTag tag) const;

 private:
  struct Block {
    char* ptr;
    std::size_t size;
    StreamId stream;
    bool small;
    bool allocated = false;
    std::size_t requested = 0;
    MemTag tag = MemTag::other;
    Block* prev = nullptr;  // neighbours inside the same segment
    Block* next = nullptr;
    std::vector<StreamId> uses{};  // other streams that used it (record_stream)
  };
  struct Pending {
    Block* block;
    std::vector<void*> events;  // one per stream in the block's uses, recorded at deallocate
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeSet = std::set<Block*, BySize>;

  Block* find_free_locked(std::size_t size, bool small, StreamId stream);
  Block* new_segment_locked(std::size_t size, bool small, StreamId stream);
  void release_free_segments_locked();
  void free_block_locked(Block* b);
  // Blocks whose events have all completed join the free sets (wait: block on them first).
  void process_pending_locked(bool wait);
  std::string oom_message_locked(std::size_t nbytes, MemTag tag) const;

  RawMemory raw_;
  mutable std::mutex mu_;
  FreeSet free_small_, free_large_;
  std::unordered_map<void*, Block*> live_;  // allocated blocks by pointer
  std::map<char*, Block*> segment_heads_;   // first block of every segment
  std::vector<Pending> pending_;            // freed, used on other streams: not yet reusable
  MemoryStats stats_;
  std::size_t limit_ = 0;
  std::size_t n_segments_ = 0;
};

}  // namespace athanor::cuda
