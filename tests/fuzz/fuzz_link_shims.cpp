// The fuzz target compiles only the core tensor sources and the safetensors
// reader with clang (not the whole gcc-built library). These Tensor methods live
// in the autograd/ops layers; the reader never calls them, and if a change made
// it call one, the fuzzer stops here with a report instead of linking silently.
#include <cstdio>
#include <cstdlib>

#include "athanor/core/tensor.h"

namespace athanor {
namespace {
[[noreturn]] void not_linked(const char* what) {
  std::fprintf(stderr, "fuzz_safetensors: %s is not linked into the fuzz target (tests/fuzz/fuzz_link_shims.cpp)\n", what);
  std::abort();
}
}  // namespace

bool Tensor::requires_grad() const { not_linked("Tensor::requires_grad"); }
Tensor& Tensor::requires_grad_(bool) { not_linked("Tensor::requires_grad_"); }
Tensor Tensor::contiguous() const { not_linked("Tensor::contiguous"); }

}  // namespace athanor
