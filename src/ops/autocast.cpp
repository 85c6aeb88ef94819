// Autocast: the guard (over core's precision state), the per-region cast cache, offered and
// persistent casts, and the casts the op dispatch point asks for. See
// include/athanor/ops/autocast.h for the contract.
#include "athanor/ops/autocast.h"

#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "athanor/autograd/function.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/core/derived.h"
#include "athanor/core/error.h"
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

// The per-region state of this thread (the precision itself lives in core): emptied when the
// outermost region exits (core calls region_exit on this thread).
struct RegionState {
  std::map<CacheKey, CacheEntry> cache;
  OfferedCast offered;
};
thread_local RegionState t_region;
void region_exit() {
  t_region.cache.clear();
  t_region.offered = OfferedCast{};
}
RegionState& region() {
  static const bool hooked = (set_precision_region_exit_hook(&region_exit), true);  // before the first entry
  (void)hooked;
  return t_region;
}

bool is_lowp(DType d) { return d == DType::bf16 || d == DType::f16; }

DerivedKind cast_kind(DType d) { return d == DType::bf16 ? DerivedKind::cast_bf16 : DerivedKind::cast_f16; }

// The copy as a fresh cast would return it: a new handle on the copy's storage joined to
// the graph by the same "cast" node as cast() records (the gradient cast back to `in`).
Tensor as_cast_of(const Tensor& source, const Tensor& copy) {
  const DType in = source.dtype();
  return record("cast", {source}, copy.detach(), [in](const Node&, const Grads& g) { return Grads{cast(g[0], in)}; });
}

AutocastCategory category_of(const char* op) {
  const OpDef* def = find_op(op);
  ATH_CHECK(def != nullptr, "autocast", "'", op, "' is not a registered op",
            Hint{"`athanor ops` lists the registered ops and their autocast categories"});
  return *def->category;
}

}  // namespace

void autocast_set_persistent_cast(const Tensor& source, const Tensor& copy) {
  ATH_CHECK(source.defined() && copy.defined(), "autocast_set_persistent_cast", "source and copy must be defined");
  ATH_CHECK(source.dtype() == DType::f32 && source.is_contiguous() && is_lowp(copy.dtype()) &&
                copy.sizes() == source.sizes() && copy.is_contiguous(),
            "autocast_set_persistent_cast", "a persistent cast maps a contiguous f32 tensor to a contiguous bf16/f16 copy "
            "of its shape; got source ", source.describe(), " and copy ", copy.describe());
  const uint64_t version = source.version();
  source.storage()->derived().with(cast_kind(copy.dtype()), source, true, [&](DerivedCopy* e) {
    e->copy = copy;
    e->version = version;
  });
}

void autocast_forget_persistent_cast(const Tensor& source, DType dtype) {
  if (!source.defined() || !is_lowp(dtype)) return;
  if (DerivedCopies* d = source.storage()->derived_if_any()) {
    const DerivedKind kind = cast_kind(dtype);
    d->retain_if([&](const DerivedCopy& c) {
      return !(c.kind == kind && c.offset == source.storage_offset() && c.sizes == source.sizes() && c.dtype == source.dtype());
    });
  }
}

Tensor autocast_persistent_cast(const Tensor& source, DType dtype) {
  if (!source.defined() || !is_lowp(dtype) || !source.is_contiguous()) return Tensor();
  DerivedCopies* d = source.storage()->derived_if_any();
  if (!d) return Tensor();
  const uint64_t version = source.version();
  return d->with(cast_kind(dtype), source, false,
                 [&](DerivedCopy* e) { return e && e->version == version ? e->copy : Tensor(); });
}

std::size_t autocast_persistent_cast_count(const Tensor& source) {
  std::size_t n = 0;
  if (DerivedCopies* d = source.defined() ? source.storage()->derived_if_any() : nullptr)
    d->retain_if([&](const DerivedCopy& c) {
      n += c.kind == DerivedKind::cast_bf16 || c.kind == DerivedKind::cast_f16;
      return true;
    });
  return n;
}

autocast::autocast(DType dtype, bool enabled)
    : scope_([&] {
        ATH_CHECK(!enabled || is_lowp(dtype), "autocast", "autocast dtype must be bf16 or f16, got ", dtype_name(dtype),
                  Hint{"use autocast(DType::bf16) on CPU (AVX512_BF16) or autocast(DType::f16) with a GradScaler"});
        return Precision{enabled, dtype};
      }()) {}

autocast::~autocast() = default;

void autocast_offer_cast(const Tensor& source, const Tensor& copy) {
  ATH_CHECK(source.defined() && copy.defined() && is_floating(source.dtype()) && is_lowp(copy.dtype()) &&
                copy.sizes() == source.sizes() && copy.is_contiguous(),
            "autocast_offer_cast", "an offered cast maps a floating tensor to a contiguous bf16/f16 copy of its shape; got "
            "source ", source.describe(), " and copy ", copy.describe());
  if (!current_precision().autocast) return;
  region().offered = OfferedCast{source.impl_ptr(), source.version(), copy.detach()};
}

bool autocast_enabled() { return current_precision().autocast; }
DType autocast_dtype() { return current_precision().dtype; }

DType autocast_target(AutocastCategory c, DType in, DType low) {
  switch (c) {
    case AutocastCategory::lower_precision: return (in == DType::f32 || is_lowp(in)) ? low : in;
    case AutocastCategory::f32: return is_lowp(in) ? DType::f32 : in;
    default: return in;
  }
}

DType autocast_target(const char* op, DType in) {
  const AutocastCategory c = category_of(op);
  const Precision p = current_precision();
  return p.autocast ? autocast_target(c, in, p.dtype) : in;
}

bool autocast_needs_cast(const char* op, std::initializer_list<Tensor> inputs) {
  const AutocastCategory c = category_of(op);
  const Precision p = current_precision();
  if (!p.autocast) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && is_floating(t.dtype()) && autocast_target(c, t.dtype(), p.dtype) != t.dtype()) return true;
  return false;
}

Tensor autocast_input(const Tensor& t, const char* op) {
  if (!t.defined() || !is_floating(t.dtype())) return t;
  return autocast_cast(t, autocast_target(op, t.dtype()));
}

Tensor autocast_cast(const Tensor& t, DType to) {
  if (!t.defined() || !is_floating(t.dtype()) || to == t.dtype()) return t;
  // Parameters (leaves that require grad) are cast once per region.
  const bool cacheable = is_lowp(to) && t.is_leaf() && t.requires_grad() && current_precision().autocast;
  RegionState& s = region();
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

std::size_t autocast_cache_size() { return region().cache.size(); }

}  // namespace athanor
