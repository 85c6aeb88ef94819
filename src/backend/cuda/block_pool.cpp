#include "backend/cuda/block_pool.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <tuple>

#include "athanor/core/error.h"

namespace athanor::cuda {

namespace {
std::string bytes_str(std::size_t b) {
  char buf[64];
  if (b >= (std::size_t{1} << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
  else if (b >= (std::size_t{1} << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
  else if (b >= 1024) std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%zu B", b);
  return buf;
}
std::size_t round_up(std::size_t n, std::size_t m) { return (n + m - 1) / m * m; }
}  // namespace

bool BlockPool::BySize::operator()(const Block* a, const Block* b) const {
  return std::tie(a->stream, a->size, a->ptr) < std::tie(b->stream, b->size, b->ptr);
}

BlockPool::BlockPool(RawMemory raw) : raw_(std::move(raw)) {}

BlockPool::~BlockPool() {
  for (const Pending& pd : pending_)
    for (void* e : pd.events)
      if (raw_.release_event) raw_.release_event(e);
  for (auto& [base, head] : segment_heads_) {
    std::size_t seg = 0;
    for (Block* b = head; b;) {
      seg += b->size;
      Block* n = b->next;
      delete b;
      b = n;
    }
    if (raw_.release) raw_.release(base, seg);
  }
}

std::size_t BlockPool::round_size(std::size_t nbytes) {
  if (nbytes == 0) nbytes = 1;  // a zero-size tensor still gets a distinct pointer
  return nbytes <= kSmallLimit ? round_up(nbytes, kSmallRound) : round_up(nbytes, kLargeRound);
}

BlockPool::Block* BlockPool::find_free_locked(std::size_t size, bool small, StreamId stream) {
  FreeSet& set = small ? free_small_ : free_large_;
  Block key{nullptr, size, stream, small};
  auto it = set.lower_bound(&key);  // the smallest cached block of this stream that fits
  if (it == set.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  set.erase(it);
  const std::size_t rest = b->size - size;
  if (rest >= (small ? kSmallRound : kMinLargeSplit)) {
    auto* r = new Block{b->ptr + size, rest, stream, small};
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    set.insert(r);
  }
  return b;
}

BlockPool::Block* BlockPool::new_segment_locked(std::size_t size, bool small, StreamId stream) {
  const std::size_t seg = small ? kSmallSegment : size;
  void* p = raw_.allocate(seg);
  if (!p) {
    // Cached segments of any stream may be what stands in the way: give them back, once
    // (the pending blocks too, after waiting for their streams: near out of memory only).
    process_pending_locked(/*wait=*/true);
    release_free_segments_locked();
    p = raw_.allocate(seg);
    if (!p) return nullptr;
  }
  ++stats_.system_allocs;
  ++n_segments_;
  stats_.reserved += seg;
  auto* b = new Block{static_cast<char*>(p), seg, stream, small};
  segment_heads_[b->ptr] = b;
  if (seg > size) {  // a small segment: the rest is cached for the next small requests
    auto* r = new Block{b->ptr + size, seg - size, stream, small};
    r->prev = b;
    b->next = r;
    b->size = size;
    free_small_.insert(r);
  }
  return b;
}

void* BlockPool::allocate(std::size_t nbytes, MemTag tag, StreamId stream) {
  std::lock_guard<std::mutex> l(mu_);
  const std::size_t size = round_size(nbytes);
  const bool small = size <= kSmallLimit;
  if (limit_ && stats_.current_total + nbytes > limit_) {
    ATH_FAIL("cuda allocator", raw_.device_name, " out of memory: a request of ", bytes_str(nbytes), " (",
             mem_tag_name(tag), ") would pass the limit of ", bytes_str(limit_), "\n", oom_message_locked(nbytes, tag),
             Hint{"lower the batch size or sequence length, turn on activation checkpointing, or raise the limit"});
  }
  if (!pending_.empty()) process_pending_locked(/*wait=*/false);
  Block* b = find_free_locked(size, small, stream);
  if (b) {
    ++stats_.cache_hits;
  } else {
    b = new_segment_locked(size, small, stream);
    if (!b) {
      ATH_FAIL("cuda allocator", raw_.device_name, " out of memory: cudaMalloc could not get ",
               bytes_str(small ? kSmallSegment : size), " for a request of ", bytes_str(nbytes), " (", mem_tag_name(tag),
               ")\n", oom_message_locked(nbytes, tag),
               Hint{"lower the batch size or sequence length, use bf16 autocast or activation checkpointing, "
                    "or shard the optimizer state (ZeRO); another process on this GPU also takes memory"});
    }
  }
  b->allocated = true;
  b->requested = nbytes;
  b->tag = tag;
  live_[b->ptr] = b;
  const int t = static_cast<int>(tag);
  stats_.current[t] += nbytes;
  stats_.current_total += nbytes;
  stats_.peak[t] = std::max(stats_.peak[t], stats_.current[t]);
  stats_.peak_total = std::max(stats_.peak_total, stats_.current_total);
  return b->ptr;
}

void BlockPool::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> l(mu_);
  auto it = live_.find(ptr);
  ATH_CHECK(it != live_.end(), "cuda allocator", raw_.device_name, ": free of a pointer this allocator did not give out",
            Hint{"this is a bug in athanor (a double free or a pointer from another device); please report it"});
  Block* b = it->second;
  live_.erase(it);
  const int t = static_cast<int>(b->tag);
  stats_.current[t] -= b->requested;
  stats_.current_total -= b->requested;
  if (!b->uses.empty()) {  // used on other streams: reusable once each has passed this point
    Pending pd{b, {}};
    for (StreamId s : b->uses) pd.events.push_back(raw_.record_event(s));
    b->uses.clear();
    pending_.push_back(std::move(pd));  // still marked allocated: no neighbour merges with it
    return;
  }
  free_block_locked(b);
}

void BlockPool::free_block_locked(Block* b) {
  b->allocated = false;
  FreeSet& set = b->small ? free_small_ : free_large_;
  // Coalesce with free neighbours (same segment, hence same stream and pool).
  if (Block* p = b->prev; p && !p->allocated) {
    set.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    delete b;
    b = p;
  }
  if (Block* n = b->next; n && !n->allocated) {
    set.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
  }
  set.insert(b);
}

void BlockPool::process_pending_locked(bool wait) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    Pending& pd = pending_[i];
    bool done = true;
    for (void* e : pd.events) {
      if (wait) raw_.wait_event(e);
      else if (!raw_.event_done(e)) {
        done = false;
        break;
      }
    }
    if (!done) {
      if (kept != i) pending_[kept] = std::move(pd);
      ++kept;
      continue;
    }
    for (void* e : pd.events) raw_.release_event(e);
    free_block_locked(pd.block);
  }
  pending_.resize(kept);
}

void BlockPool::record_stream(void* ptr, StreamId stream) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = live_.find(ptr);
  ATH_CHECK(it != live_.end(), "cuda allocator", raw_.device_name,
            ": record_stream of a pointer this allocator did not give out",
            Hint{"this is a bug in athanor; please report it"});
  Block* b = it->second;
  ATH_CHECK(raw_.record_event && raw_.event_done && raw_.wait_event && raw_.release_event, "cuda allocator",
            raw_.device_name, ": record_stream needs the raw memory's event functions",
            Hint{"this is a bug in athanor; please report it"});
  if (stream == b->stream) return;
  for (StreamId s : b->uses)
    if (s == stream) return;
  b->uses.push_back(stream);
}

StreamId BlockPool::stream_of(const void* ptr, StreamId none) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = live_.find(const_cast<void*>(ptr));
  return it == live_.end() ? none : it->second->stream;
}

std::size_t BlockPool::pending_blocks() const {
  std::lock_guard<std::mutex> l(mu_);
  return pending_.size();
}

void BlockPool::retag(void* ptr, MemTag to) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = live_.find(ptr);
  ATH_CHECK(it != live_.end(), "cuda allocator", raw_.device_name, ": retag of a pointer this allocator did not give out",
            Hint{"this is a bug in athanor; please report it"});
  Block* b = it->second;
  const int from = static_cast<int>(b->tag), t = static_cast<int>(to);
  stats_.current[from] -= b->requested;
  stats_.current[t] += b->requested;
  stats_.peak[t] = std::max(stats_.peak[t], stats_.current[t]);
  b->tag = to;
}

void BlockPool::set_limit(std::size_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  limit_ = bytes;
}

void BlockPool::release_free_segments_locked() {
  for (auto it = segment_heads_.begin(); it != segment_heads_.end();) {
    Block* b = it->second;
    if (b->allocated || b->next) {  // in use, or split into blocks of which one is in use
      ++it;
      continue;
    }
    (b->small ? free_small_ : free_large_).erase(b);
    raw_.release(b->ptr, b->size);
    ++stats_.system_frees;
    --n_segments_;
    stats_.reserved -= b->size;
    delete b;
    it = segment_heads_.erase(it);
  }
}

void BlockPool::empty_cache() {
  std::lock_guard<std::mutex> l(mu_);
  process_pending_locked(/*wait=*/false);
  release_free_segments_locked();
}

MemoryStats BlockPool::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

void BlockPool::reset_peak() {
  std::lock_guard<std::mutex> l(mu_);
  stats_.peak = stats_.current;
  stats_.peak_total = stats_.current_total;
}

std::size_t BlockPool::largest_cached_block() const {
  std::lock_guard<std::mutex> l(mu_);
  std::size_t m = 0;
  for (const Block* b : free_small_) m = std::max(m, b->size);
  for (const Block* b : free_large_) m = std::max(m, b->size);
  return m;
}

std::size_t BlockPool::cached_bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  std::size_t s = 0;
  for (const Block* b : free_small_) s += b->size;
  for (const Block* b : free_large_) s += b->size;
  return s;
}

std::size_t BlockPool::segments() const {
  std::lock_guard<std::mutex> l(mu_);
  return n_segments_;
}

std::string BlockPool::oom_message(std::size_t nbytes, MemTag tag) const {
  std::lock_guard<std::mutex> l(mu_);
  return oom_message_locked(nbytes, tag);
}

std::string BlockPool::oom_message_locked(std::size_t nbytes, MemTag tag) const {
  std::ostringstream o;
  o << "memory in use on " << raw_.device_name << " by tag (current / peak):\n";
  for (int t = 0; t < kNumMemTags; ++t) {
    o << "  " << mem_tag_name(static_cast<MemTag>(t)) << ": " << bytes_str(stats_.current[t]) << " / "
      << bytes_str(stats_.peak[t]) << "\n";
  }
  std::size_t cached = 0, largest = 0;
  for (const FreeSet* s : {&free_small_, &free_large_}) {
    for (const Block* b : *s) {
      cached += b->size;
      largest = std::max(largest, b->size);
    }
  }
  o << "  total in use: " << bytes_str(stats_.current_total) << "; reserved by the allocator: "
    << bytes_str(stats_.reserved) << " in " << n_segments_ << " segments, of which cached (free): " << bytes_str(cached)
    << ", largest cached block: " << bytes_str(largest) << "\n";
  if (raw_.describe_device) o << "  device: " << raw_.describe_device();
  return o.str();
}

}  // namespace athanor::cuda
