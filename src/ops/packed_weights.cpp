// The packed-weight registry (packed_weights.h): requests from the GEMM call sites,
// refreshes from the optimizer, all under one mutex (lookups cost a map find per GEMM).
#include "ops/packed_weights.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "backend/cpu/stealing_runs.h"

namespace athanor::detail {
namespace {

constexpr uint64_t kNever = ~uint64_t{0};

struct Entry {
  std::weak_ptr<Storage> storage;
  DType dtype = DType::f32;
  int64_t rows = 0, cols = 0;  // W's shape
  cpu::PackedLayout layout;
  Tensor packed;                  // zero-filled when made (the layout's padding stays zero)
  uint64_t packed_version = kNever;  // W's version when packed
  uint64_t seen_version = kNever;    // W's version at the last request that missed
  bool used = true;                  // asked for since the last refresh
};

using Key = std::tuple<const Storage*, int64_t, WeightUse>;  // storage, element offset, use

struct Registry {
  std::mutex mu;
  std::map<Key, Entry> entries;
  // ATHANOR_PACKED_WEIGHTS=0 turns the path off for the whole process (A/B timing), whatever set_packed_weights_enabled says.
  const bool env_off = [] {
    const char* v = std::getenv("ATHANOR_PACKED_WEIGHTS");
    return v && std::strcmp(v, "0") == 0;
  }();
  bool enabled = !env_off;
  PackedWeightStats stats;
};
Registry& registry() {
  static Registry r;
  return r;
}

bool packable(const Tensor& w) {
  return w.defined() && w.dim() == 2 && w.is_contiguous() && (w.dtype() == DType::f32 || w.dtype() == DType::bf16) &&
         w.numel() > 0;
}

cpu::PackedLayout layout_for(const Tensor& w, WeightUse use) {
  const int64_t rows = w.size(0), cols = w.size(1);
  // forward: B = W^T is [cols, rows]; input_grad: B = W is [rows, cols].
  return use == WeightUse::forward ? cpu::packed_layout(w.dtype() == DType::bf16, cols, rows)
                                   : cpu::packed_layout(w.dtype() == DType::bf16, rows, cols);
}

void ensure_buffer(Entry& e) {
  if (!e.packed.defined()) e.packed = zeros({e.layout.elements()}, TensorOptions(e.dtype).with_tag(MemTag::packed_weights));
}

}  // namespace

PackedWeight packed_weight(const Tensor& w, WeightUse use) {
  Registry& r = registry();
  if (!r.enabled || !packable(w)) return {};
  const uint64_t version = w.version();
  std::lock_guard<std::mutex> lock(r.mu);
  const Key key{w.storage().get(), w.storage_offset(), use};
  auto it = r.entries.find(key);
  if (it != r.entries.end() && (it->second.storage.lock() != w.storage() || it->second.dtype != w.dtype() ||
                                it->second.rows != w.size(0) || it->second.cols != w.size(1))) {
    r.entries.erase(it);  // a reused address, or a view of another shape: start over
    it = r.entries.end();
  }
  if (it == r.entries.end()) {
    // Forget requests whose storage is gone (casts made per autocast region, freed weights).
    for (auto j = r.entries.begin(); j != r.entries.end();) j = j->second.storage.expired() ? r.entries.erase(j) : std::next(j);
    Entry e;
    e.storage = w.storage(), e.dtype = w.dtype(), e.rows = w.size(0), e.cols = w.size(1), e.layout = layout_for(w, use);
    it = r.entries.emplace(key, std::move(e)).first;
  }
  Entry& e = it->second;
  e.used = true;
  if (e.packed_version != version) {
    if (e.seen_version != version) {  // first sight at this version: plain GEMM, and note the request
      e.seen_version = version;
      ++r.stats.misses;
      return {};
    }
    ensure_buffer(e);  // second sight, not refreshed meanwhile: the weight is not changing, pack it here
    cpu::pack_weight(e.layout, use == WeightUse::forward, w.raw_data(), e.cols, e.packed.raw_data());
    e.packed_version = version;
    ++r.stats.packs_in_ops;
  }
  ++r.stats.hits;
  return PackedWeight{e.packed.raw_data(), e.layout};
}

namespace {
// Appends the jobs that rewrite every requested copy of `t` and marks those copies current
// at t's version; drops the copies nobody asked for since the last refresh. Under r.mu.
void claim_locked(Registry& r, const Tensor& t, std::vector<PackJob>& jobs) {
  const Storage* s = t.storage().get();
  for (auto it = r.entries.lower_bound({s, t.storage_offset(), WeightUse::forward});
       it != r.entries.end() && std::get<0>(it->first) == s && std::get<1>(it->first) == t.storage_offset();) {
    Entry& e = it->second;
    if (!e.used || e.storage.lock() != t.storage() || e.rows != t.size(0) || e.cols != t.size(1) || e.dtype != t.dtype()) {
      it = r.entries.erase(it);  // nobody asked for it since the last refresh (or stale): drop it
      continue;
    }
    e.used = false;
    ensure_buffer(e);
    ++r.stats.packs_in_refresh;
    jobs.push_back({e.layout, std::get<2>(it->first) == WeightUse::forward, t.raw_data(), e.rows, e.cols, e.packed.raw_data()});
    e.packed_version = t.version();
    ++it;
  }
}
}  // namespace

void refresh_packed_weights(const std::vector<Tensor>& written) {
  Registry& r = registry();
  thread_local std::vector<PackJob> kept;  // capacity kept: no allocation per step
  std::vector<PackJob>& jobs = kept;       // (the OpenMP workers must see this thread's list, not their own)
  jobs.clear();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (!r.enabled || r.entries.empty()) return;  // nothing ever asked (the MLP, f64 models): one lock per step
    for (const Tensor& t : written)
      if (packable(t)) claim_locked(r, t, jobs);
  }
  if (jobs.empty()) return;
  // The copies are marked current already; nothing reads them before this region ends
  // (the caller is the optimizer's step, on the training thread).
  int64_t work = 0;
  for (const PackJob& j : jobs) work += j.layout.elements();
  // Blocks of rows (a multiple of 16, as pack_weight_rows wants). Thread t's run is the t-th
  // share of every weight's rows, the rows the multi-tensor pass wrote on it, and a thread
  // done early takes blocks from the back of the other's run. With fixed shares alone, one
  // thread waited 200-400 us for the other at the end of the tiny GPT's refresh (1.4 ms per
  // step; LD_PRELOAD region timing).
  constexpr int64_t kBlockRows = 64;
  thread_local std::vector<int64_t> kept_rows;
  std::vector<int64_t>& rows = kept_rows;
  rows.clear();
  for (const PackJob& j : jobs) rows.push_back(j.rows);
  cpu::for_each_chunk(rows, kBlockRows, work > (1 << 15),
                      [&](int k, int64_t r0, int64_t r1, int64_t) { jobs[static_cast<std::size_t>(k)].run(r0, r1); });
}

void drop_packed_weights(const std::vector<Tensor>& tensors) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto it = r.entries.begin(); it != r.entries.end();) {
    bool drop = it->second.storage.expired();
    for (const Tensor& t : tensors)
      drop = drop || (t.defined() && std::get<0>(it->first) == t.storage().get() && std::get<1>(it->first) == t.storage_offset());
    it = drop ? r.entries.erase(it) : std::next(it);
  }
}

std::size_t packed_weight_count() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::size_t n = 0;
  for (const auto& [key, e] : r.entries) n += e.packed.defined();
  return n;
}

PackedWeightStats packed_weight_stats() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.stats;
}

void set_packed_weights_enabled(bool enabled) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.enabled = enabled && !r.env_off;
  if (!r.enabled) r.entries.clear();
}

bool packed_weights_enabled() { return registry().enabled; }

}  // namespace athanor::detail
