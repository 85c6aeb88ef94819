#pragma once
// Scratch memory for a kernel: one block from the tagged allocator (counted as
// MemTag::workspace), freed on scope exit. Allocate it before a parallel region:
// allocation may throw, and exceptions must not cross OpenMP.
#include <cstddef>

#include "athanor/core/allocator.h"

namespace athanor::cpu {

class Workspace {
 public:
  explicit Workspace(std::size_t bytes) : n_(bytes) {
    if (n_) p_ = Allocator::cpu().allocate(n_, MemTag::workspace);
  }
  ~Workspace() {
    if (p_) Allocator::cpu().deallocate(p_, n_, MemTag::workspace);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  template <class C> C* as() const { return static_cast<C*>(p_); }

 private:
  std::size_t n_ = 0;
  void* p_ = nullptr;
};

}  // namespace athanor::cpu
