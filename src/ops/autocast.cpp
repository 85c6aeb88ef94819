// Autocast state (thread-local), the per-region cast cache and the helpers that
// op entry points call. See include/athanor/ops/autocast.h for the contract.
#include "athanor/ops/autocast.h"

#include <map>
#include <string>
#include <tuple>
#include <unordered_map>

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

struct AutocastState {
  bool enabled = false;
  DType dtype = DType::bf16;
  int depth = 0;
  std::map<CacheKey, CacheEntry> cache;
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

}  // namespace

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
  if (--s.depth == 0) s.cache.clear();
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
  if (!cacheable) return cast(t, to);
  AutocastState& s = state();
  const CacheKey key{t.impl(), to, grad_enabled()};
  const auto it = s.cache.find(key);
  if (it != s.cache.end() && it->second.version == t.version()) return it->second.cast;
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
