#pragma once
// Automatic mixed precision: the autocast region.
// It lives in the ops layer because it intercepts op inputs (as PyTorch's
// dispatcher does); the amp layer above holds the GradScaler.
//
//   { athanor::autocast ac(DType::bf16);   // or DType::f16
//     loss = model(batch); }               // GEMM-bound ops run in bf16, the rest as the op table says
//   loss.backward();                       // outside the region, as in PyTorch
//
// Inside a region each op runs at the precision of its registered category
// (athanor/ops/registry.h; the op dispatch point applies it): `lower_precision` ops (matmul, linear, conv2d,
// scaled_dot_product_attention) cast f32/bf16/f16 inputs to the autocast dtype;
// `f32` ops (softmax, log_softmax, layer_norm, rms_norm, cross_entropy, sum,
// mean, …) run in f32: layer_norm, rms_norm, softmax, log_softmax, cross_entropy,
// sum and mean read a bf16/f16 input directly (f32 math and output, the gradient
// in the input's dtype; no full f32 copy), the others cast it to f32; `promote`
// ops already run in the widest input dtype; `passthrough` ops keep theirs. f64
// inputs are never touched.
//
// Invariants:
//  - state is thread-local (it lives in core, athanor/core/precision.h, so that
//    recompute can restore it); guards nest (an inner guard may switch dtype or
//    disable autocast) and restore the outer state on exit;
//  - the casts are differentiable (`cast`), so gradients reach f32 parameters
//    in f32;
//  - a leaf that requires grad (a parameter) is cast once per region and dtype:
//    the cast is cached under (TensorImpl*, version, dtype, grad mode) and
//    reused by every later op; an in-place update bumps the version and misses
//    the cache. The cache is cleared when the outermost guard exits;
//  - persistent casts (made by the optimizer in its update pass): a low-precision
//    copy of a parameter, held by the parameter's storage (athanor/core/derived.h),
//    is used instead of a fresh cast while the parameter's version is the one the
//    copy was written at; any other in-place change bumps the version and the
//    lookup falls back to casting. The copy joins the
//    graph through the same "cast" node as a fresh cast (backward: the gradient
//    cast back to the parameter's dtype), so gradients still reach the f32
//    parameter in f32.
#include <cstddef>
#include <initializer_list>

#include "athanor/core/precision.h"
#include "athanor/core/tensor.h"
#include "athanor/ops/registry.h"

namespace athanor {

class autocast {
 public:
  explicit autocast(DType dtype = DType::bf16, bool enabled = true);
  ~autocast();
  autocast(const autocast&) = delete;
  autocast& operator=(const autocast&) = delete;

 private:
  PrecisionScope scope_;
};

bool autocast_enabled();
DType autocast_dtype();  // the innermost region's dtype (bf16 outside any region)

// The dtype registered op `op` runs at for an input of dtype `in` under the current state
// (`in` itself when autocast is off or the op keeps it). An op name the registry does not
// know is an Error.
DType autocast_target(const char* op, DType in);
// The dtype an op of category `c` runs an input of dtype `in` at, autocast being on at `low`.
DType autocast_target(AutocastCategory c, DType in, DType low);
// True when autocast is on and some defined input of `op` would be cast.
bool autocast_needs_cast(const char* op, std::initializer_list<Tensor> inputs);
// `t` cast to the dtype `op` runs at (undefined and non-floating tensors pass through).
Tensor autocast_input(const Tensor& t, const char* op);
// `t` cast to `to` as autocast casts (a parameter once per region, through its persistent
// copy when current; an offered copy when one is waiting): what the dispatch point uses.
Tensor autocast_cast(const Tensor& t, DType to);

std::size_t autocast_cache_size();  // cached weight casts in this thread's region (tests, debugging)

// Offers `copy` (bf16/f16, contiguous, source's shape; the caller guarantees copy ==
// cast(source, copy.dtype()) bit for bit) as the cast of `source`, an activation the caller
// just produced in a pass that could write the copy for free (layer_norm under autocast,
// whose output feeds a linear). The next autocast_input of that same tensor to that dtype
// in this thread takes it instead of casting, through the same "cast" node. One offer at a
// time (a new one replaces it); it lapses when source changes version, when source is
// freed (it is held weakly) and when the outermost region exits. No-op outside autocast.
void autocast_offer_cast(const Tensor& source, const Tensor& copy);

// Makes `copy` (bf16 or f16, contiguous, source's shape) the persistent cast of `source`
// (a contiguous f32 tensor) at source's current version, held by source's storage: the
// caller guarantees that copy == cast(source, copy.dtype()) now. Replaces an earlier one.
void autocast_set_persistent_cast(const Tensor& source, const Tensor& copy);
// Drops the persistent cast of `source` to `dtype`, if any.
void autocast_forget_persistent_cast(const Tensor& source, DType dtype);
// The copy of `source` in `dtype` if it is still current, else undefined.
Tensor autocast_persistent_cast(const Tensor& source, DType dtype);
// The persistent casts `source`'s storage holds, current or not (tests, debugging).
std::size_t autocast_persistent_cast_count(const Tensor& source);

}  // namespace athanor
