// Autocast state (thread-local), the per-region cast cache and the helpers that
// op entry points call. See include/athanor/ops/autocast.h for the contract.
#include "athanor/ops/autocast.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "athanor/autograd/function.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"
#include "athanor/ops/op_table.h"
#include "athanor/ops/shape.h"

namespace athanor {
namespace {

using CacheKey = std::tuple<const TensorImpl*, DType, bool>;  // source, target dtype, grad mode
struct CacheEntry {
  Tensor source;     // keeps the source alive, so its TensorImpl* cannot be reused while cached
  uint64_t version;  // the source's version when cast: an in-place update invalidates the entry
  Tensor cast;
};

// A low-precision copy of an activation offered by the op that produced it (see
// autocast_offer_cast). The source is held weakly: the offer must not keep a full-precision
// activation alive; one offer at a time, so an unused copy costs at most one tensor.
struct OfferedCast {
  std::weak_ptr<TensorImpl> source;
  uint64_t version = 0;
  Tensor copy;
};

struct AutocastState {
  bool enabled = false;
  DType dtype = DType::bf16;
  int depth = 0;
  std::map<CacheKey, CacheEntry> cache;
  OfferedCast offered;
};
AutocastState& state() {
  thread_local AutocastState s;
  return s;
}

AutocastCategory category_of(const char* op) {
  static const std::unordered_map<std::string, AutocastCategory> table = [] {
    std::unordered_map<std::string, AutocastCategory> m;
    for (const OpInfo& info : op_table()) m.emplace(info.name, info.autocast);
    return m;
  }();
  const auto it = table.find(op);
  return it == table.end() ? AutocastCategory::passthrough : it->second;
}

bool is_lowp(DType d) { return d == DType::bf16 || d == DType::f16; }

// Persistent casts: process-wide (parameters are shared by threads), under a mutex.
// An entry does not keep its source alive (the optimizer that registered it does, and
// forgets it when destroyed); the weak handles make a reused address miss.
struct PersistentCast {
  std::weak_ptr<TensorImpl> source;
  std::weak_ptr<Storage> storage;  // the source's storage when registered (the version lives there)
  uint64_t version;
  Tensor copy;
};
struct PersistentCasts {
  std::mutex mutex;
  std::map<std::pair<const TensorImpl*, DType>, PersistentCast> entries;
};
PersistentCasts& persistent() {
  static PersistentCasts p;
  return p;
}

// The copy as a fresh cast would return it: a new handle on the copy's storage joined to
// the graph by the same "cast" node as cast() records (the gradient cast back to `in`).
Tensor as_cast_of(const Tensor& source, const Tensor& copy) {
  const DType in = source.dtype();
  return record("cast", {source}, copy.detach(), [in](const Node&, const Grads& g) { return Grads{cast(g[0], in)}; });
}

}  // namespace

void autocast_set_persistent_cast(const Tensor& source, const Tensor& copy) {
  ATH_CHECK(source.defined() && copy.defined(), "autocast_set_persistent_cast", "source and copy must be defined");
  ATH_CHECK(source.dtype() == DType::f32 && is_lowp(copy.dtype()) && copy.sizes() == source.sizes() &&
                copy.is_contiguous(),
            "autocast_set_persistent_cast", "a persistent cast maps an f32 tensor to a contiguous bf16/f16 copy of its "
            "shape; got source ", source.describe(), " and copy ", copy.describe());
  PersistentCasts& p = persistent();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.entries.insert_or_assign({source.impl(), copy.dtype()},
                             PersistentCast{source.impl_ptr(), source.storage(), source.version(), copy});
}

void autocast_forget_persistent_cast(const Tensor& source, DType dtype) {
  PersistentCasts& p = persistent();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.entries.erase({source.impl(), dtype});
}

Tensor autocast_persistent_cast(const Tensor& source, DType dtype) {
  PersistentCasts& p = persistent();
  std::lock_guard<std::mutex> lock(p.mutex);
  if (p.entries.empty() || !source.defined()) return Tensor();
  const auto it = p.entries.find({source.impl(), dtype});
  if (it == p.entries.end()) return Tensor();
  const PersistentCast& e = it->second;
  const bool current = e.source.lock().get() == source.impl() && e.storage.lock().get() == source.storage().get() &&
                       e.version == source.version();
  return current ? e.copy : Tensor();
}

std::size_t autocast_persistent_cast_count() {
  PersistentCasts& p = persistent();
  std::lock_guard<std::mutex> lock(p.mutex);
  return p.entries.size();
}

autocast::autocast(DType dtype, bool enabled) {
  ATH_CHECK(!enabled || is_lowp(dtype), "autocast", "autocast dtype must be bf16 or f16, got ", dtype_name(dtype),
            Hint{"use autocast(DType::bf16) on CPU (AVX512_BF16) or autocast(DType::f16) with a GradScaler"});
  AutocastState& s = state();
  prev_enabled_ = s.enabled;
  prev_dtype_ = s.dtype;
  s.enabled = enabled;
  if (enabled) s.dtype = dtype;
  ++s.depth;
}

autocast::~autocast() {
  AutocastState& s = state();
  s.enabled = prev_enabled_;
  s.dtype = prev_dtype_;
  if (--s.depth == 0) {
    s.cache.clear();
    s.offered = OfferedCast{};
  }
}

void autocast_offer_cast(const Tensor& source, const Tensor& copy) {
  ATH_CHECK(source.defined() && copy.defined() && is_floating(source.dtype()) && is_lowp(copy.dtype()) &&
                copy.sizes() == source.sizes() && copy.is_contiguous(),
            "autocast_offer_cast", "an offered cast maps a floating tensor to a contiguous bf16/f16 copy of its shape; got "
            "source ", source.describe(), " and copy ", copy.describe());
  AutocastState& s = state();
  if (!s.enabled) return;
  s.offered = OfferedCast{source.impl_ptr(), source.version(), copy.detach()};
}

bool autocast_enabled() { return state().enabled; }
DType autocast_dtype() { return state().dtype; }

DType autocast_target(const char* op, DType in) {
  const AutocastState& s = state();
  if (!s.enabled) return in;
  switch (category_of(op)) {
    case AutocastCategory::lower_precision: return (in == DType::f32 || is_lowp(in)) ? s.dtype : in;
    case AutocastCategory::f32: return is_lowp(in) ? DType::f32 : in;
    default: return in;
  }
}

bool autocast_needs_cast(const char* op, std::initializer_list<Tensor> inputs) {
  if (!state().enabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && is_floating(t.dtype()) && autocast_target(op, t.dtype()) != t.dtype()) return true;
  return false;
}

Tensor autocast_input(const Tensor& t, const char* op) {
  if (!t.defined() || !is_floating(t.dtype())) return t;
  const DType to = autocast_target(op, t.dtype());
  if (to == t.dtype()) return t;
  // Parameters (leaves that require grad) are cast once per region.
  const bool cacheable = is_lowp(to) && t.is_leaf() && t.requires_grad();
  AutocastState& s = state();
  if (!cacheable) {
    // The copy its producer offered (same tensor, unchanged since): taken once, joined to
    // the graph by the same "cast" node as a fresh cast.
    OfferedCast& o = s.offered;
    if (o.copy.defined() && o.copy.dtype() == to && o.source.lock().get() == t.impl() && o.version == t.version()) {
      const Tensor copy = std::move(o.copy);
      o = OfferedCast{};
      return as_cast_of(t, copy);
    }
    return cast(t, to);
  }
  const CacheKey key{t.impl(), to, grad_enabled()};
  const auto it = s.cache.find(key);
  if (it != s.cache.end() && it->second.version == t.version()) return it->second.cast;
  // A current persistent copy (written by the optimizer) replaces the cast pass.
  if (const Tensor copy = autocast_persistent_cast(t, to); copy.defined()) {
    Tensor c = as_cast_of(t, copy);
    s.cache.insert_or_assign(key, CacheEntry{t, t.version(), c});
    return c;
  }
  Tensor c = cast(t, to);
  // The low-precision copy of a weight is parameter memory, not activation memory: it
  // scales with the model, not with batch x sequence (the usual mixed-precision
  // accounting: 16-bit parameters + f32 master weights). Only a fresh block is retagged.
  if (c.storage() && c.storage().use_count() == 1 && c.storage()->tag() == MemTag::activation)
    c.storage()->set_tag(MemTag::parameter);
  s.cache.insert_or_assign(key, CacheEntry{t, t.version(), c});
  return c;
}

std::size_t autocast_cache_size() { return state().cache.size(); }

}  // namespace athanor
