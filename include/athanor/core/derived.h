#pragma once
// Derived copies of a tensor's values: a parameter's low-precision copy (autocast reads it
// instead of casting), its packed GEMM layouts (oneDNN's blocked B operand). They belong to
// the storage they are derived from: they live and die with it, and one is current only
// while that storage's version counter still reads the version it was written at. Whoever
// changes the values (the optimizer's update pass) rewrites them and records the new
// version; any other in-place write bumps the version and the copy goes stale, so a reader
// can never see old values. There is no global table: a lookup is a scan of the few
// entries of one storage under its own lock.
//
// What the kinds mean, and who writes them, is the ops layer's business
// (ops/autocast.cpp, ops/packed_weights.cpp); core only keeps them.
#include <cstdint>
#include <mutex>
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor {

enum class DerivedKind : uint8_t {
  cast_bf16,          // the tensor rounded to bf16 (autocast's persistent cast)
  cast_f16,           // ... to f16
  packed_forward,     // W packed as the B = W^T of y = x W^T
  packed_input_grad,  // W packed as the B = W of dx = dy W
};

inline constexpr uint64_t kNoVersion = ~uint64_t{0};

struct DerivedCopy {
  DerivedKind kind = DerivedKind::cast_bf16;
  int64_t offset = 0;  // the source view it derives from: element offset, sizes and dtype (contiguous)
  Shape sizes;
  DType dtype = DType::f32;
  Tensor copy;                     // the derived values (undefined until first written)
  uint64_t version = kNoVersion;   // the storage version `copy` holds
  uint64_t missed = kNoVersion;    // the version at the last lookup that found no current copy
  bool requested = false;          // looked up since the last refresh
};

class DerivedCopies {
 public:
  // fn(DerivedCopy*) under this set's lock, on the entry of `kind` for the view `source`
  // (same offset, sizes and dtype); when there is none, a new empty entry if `create`, else
  // null. Returns what fn returns.
  template <class Fn> decltype(auto) with(DerivedKind kind, const Tensor& source, bool create, Fn&& fn) {
    std::lock_guard<std::mutex> lock(mu_);
    DerivedCopy* e = nullptr;
    for (DerivedCopy& c : entries_)
      if (c.kind == kind && c.offset == source.storage_offset() && c.dtype == source.dtype() && c.sizes == source.sizes()) {
        e = &c;
        break;
      }
    if (!e && create) {
      DerivedCopy c;
      c.kind = kind, c.offset = source.storage_offset(), c.sizes = source.sizes(), c.dtype = source.dtype();
      entries_.push_back(std::move(c));
      e = &entries_.back();
    }
    return fn(e);
  }
  // fn(DerivedCopy&) on every entry under the lock; an entry for which fn returns false is dropped.
  template <class Fn> void retain_if(Fn&& fn) {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(entries_, [&](DerivedCopy& c) { return !fn(c); });
  }
  std::size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_.size();
  }

 private:
  std::mutex mu_;
  std::vector<DerivedCopy> entries_;
};

}  // namespace athanor
