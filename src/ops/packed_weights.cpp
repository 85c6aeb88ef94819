// Packed weight copies (packed_weights.h), held by the weights' own storages: requests from
// the GEMM call sites, refreshes from the optimizer. A lookup is a scan of the few derived
// copies of one storage under that storage's lock.
#include "ops/packed_weights.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "athanor/core/derived.h"
#include "backend/cpu/stealing_runs.h"

namespace athanor::detail {
namespace {

struct Switch {
  // ATHANOR_PACKED_WEIGHTS=0 turns the path off for the whole process (A/B timing), whatever set_packed_weights_enabled says.
  const bool env_off = [] {
    const char* v = std::getenv("ATHANOR_PACKED_WEIGHTS");
    return v && std::strcmp(v, "0") == 0;
  }();
  std::atomic<bool> enabled{!env_off};
};
Switch& state() {
  static Switch s;
  return s;
}

struct Stats {
  std::atomic<uint64_t> hits{0}, misses{0}, packs_in_ops{0}, packs_in_refresh{0};
};
Stats& stats() {
  static Stats s;
  return s;
}

bool packable(const Tensor& w) {
  return w.defined() && w.dim() == 2 && w.is_contiguous() && (w.dtype() == DType::f32 || w.dtype() == DType::bf16) &&
         w.numel() > 0;
}

DerivedKind kind_of(WeightUse use) {
  return use == WeightUse::forward ? DerivedKind::packed_forward : DerivedKind::packed_input_grad;
}
bool is_packed(DerivedKind k) { return k == DerivedKind::packed_forward || k == DerivedKind::packed_input_grad; }

cpu::PackedLayout layout_for(DType dtype, const Shape& sizes, bool forward) {
  const int64_t rows = sizes[0], cols = sizes[1];
  // forward: B = W^T is [cols, rows]; input_grad: B = W is [rows, cols].
  return forward ? cpu::packed_layout(dtype == DType::bf16, cols, rows) : cpu::packed_layout(dtype == DType::bf16, rows, cols);
}

void ensure_buffer(DerivedCopy& e, const cpu::PackedLayout& l) {
  if (!e.copy.defined()) e.copy = zeros({l.elements()}, TensorOptions(e.dtype).with_tag(MemTag::packed_weights));
}

void drop_packed_of(const Tensor& t) {
  if (DerivedCopies* d = t.defined() ? t.storage()->derived_if_any() : nullptr)
    d->retain_if([&](const DerivedCopy& c) { return !(is_packed(c.kind) && c.offset == t.storage_offset()); });
}

}  // namespace

PackedWeight packed_weight(const Tensor& w, WeightUse use) {
  if (!packable(w)) return {};
  if (!state().enabled.load(std::memory_order_relaxed)) {
    if (w.storage()->derived_if_any()) drop_packed_of(w);  // copies made while it was on: freed now
    return {};
  }
  const uint64_t version = w.version();
  const bool forward = use == WeightUse::forward;
  return w.storage()->derived().with(kind_of(use), w, true, [&](DerivedCopy* e) -> PackedWeight {
    e->requested = true;
    const cpu::PackedLayout l = layout_for(e->dtype, e->sizes, forward);
    if (e->version != version) {
      if (e->missed != version) {  // first sight at this version: plain GEMM, and note the request
        e->missed = version;
        stats().misses.fetch_add(1, std::memory_order_relaxed);
        return {};
      }
      ensure_buffer(*e, l);  // second sight, not refreshed meanwhile: the weight is not changing, pack it here
      cpu::pack_weight(l, forward, w.raw_data(), e->sizes[1], e->copy.raw_data());
      e->version = version;
      stats().packs_in_ops.fetch_add(1, std::memory_order_relaxed);
    }
    stats().hits.fetch_add(1, std::memory_order_relaxed);
    return PackedWeight{e->copy.raw_data(), l};
  });
}

void refresh_packed_weights(const std::vector<Tensor>& written) {
  thread_local std::vector<PackJob> kept;  // capacity kept: no allocation per step
  std::vector<PackJob>& jobs = kept;       // (the OpenMP workers must see this thread's list, not their own)
  jobs.clear();
  const bool on = state().enabled.load(std::memory_order_relaxed);
  for (const Tensor& t : written) {
    if (!t.defined()) continue;
    DerivedCopies* d = t.storage()->derived_if_any();
    if (!d) continue;  // nothing ever asked for this one (the MLP's biases, f64 models): no lock
    if (!on || !packable(t)) {
      drop_packed_of(t);
      continue;
    }
    const uint64_t version = t.version();
    // Every requested copy of t is rewritten and marked current at t's new version; a copy
    // nobody asked for since the last refresh is dropped (memory comes back).
    d->retain_if([&](DerivedCopy& e) {
      if (!is_packed(e.kind) || e.offset != t.storage_offset()) return true;
      if (!e.requested || e.sizes != t.sizes() || e.dtype != t.dtype()) return false;
      e.requested = false;
      const bool forward = e.kind == DerivedKind::packed_forward;
      const cpu::PackedLayout l = layout_for(e.dtype, e.sizes, forward);
      ensure_buffer(e, l);
      stats().packs_in_refresh.fetch_add(1, std::memory_order_relaxed);
      jobs.push_back({l, forward, t.raw_data(), e.sizes[0], e.sizes[1], e.copy.raw_data()});
      e.version = version;
      return true;
    });
  }
  if (jobs.empty()) return;
  // The copies are marked current already; nothing reads them before this region ends
  // (the caller is the optimizer's step, on the training thread).
  int64_t work = 0;
  for (const PackJob& j : jobs) work += j.layout.elements();
  // Blocks of rows (a multiple of 16, as pack_weight_rows wants). Thread t's run is the t-th
  // share of every weight's rows, the rows the multi-tensor pass wrote on it, and a thread
  // done early takes blocks from the back of the other's run: with fixed shares alone one
  // thread waited for the other at the end of the refresh (bench/RESULTS.md, session 12).
  constexpr int64_t kBlockRows = 64;
  thread_local std::vector<int64_t> kept_rows;
  std::vector<int64_t>& rows = kept_rows;
  rows.clear();
  for (const PackJob& j : jobs) rows.push_back(j.rows);
  cpu::for_each_chunk(rows, kBlockRows, work > (1 << 15),
                      [&](int k, int64_t r0, int64_t r1, int64_t) { jobs[static_cast<std::size_t>(k)].run(r0, r1); });
}

void drop_packed_weights(const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors) drop_packed_of(t);
}

std::size_t packed_weight_count(const Tensor& w) {
  std::size_t n = 0;
  if (DerivedCopies* d = w.defined() ? w.storage()->derived_if_any() : nullptr)
    d->retain_if([&](const DerivedCopy& c) {
      n += is_packed(c.kind) && c.offset == w.storage_offset() && c.copy.defined();
      return true;
    });
  return n;
}

PackedWeightStats packed_weight_stats() {
  const Stats& s = stats();
  return PackedWeightStats{s.hits.load(), s.misses.load(), s.packs_in_ops.load(), s.packs_in_refresh.load()};
}

void set_packed_weights_enabled(bool enabled) { state().enabled.store(enabled && !state().env_off, std::memory_order_relaxed); }

bool packed_weights_enabled() { return state().enabled.load(std::memory_order_relaxed); }

}  // namespace athanor::detail
