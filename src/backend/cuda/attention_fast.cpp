// Host side of the fast flash attention (attention_fast.h): the implementation switch and the
// fast forward's preconditions. Plain C++ so that it is tested without a GPU.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "athanor/core/error.h"
#include "backend/cuda/attention_fast.h"

namespace athanor::cuda {

AttentionImpl parse_attention_impl(const char* value) {
  if (value == nullptr || value[0] == '\0' || std::strcmp(value, "fast") == 0) return AttentionImpl::fast;
  if (std::strcmp(value, "reference") == 0) return AttentionImpl::reference;
  if (std::strcmp(value, "fast_fwd") == 0) return AttentionImpl::fast_fwd;
  ATH_FAIL("ATHANOR_CUDA_ATTENTION", "unknown CUDA attention implementation '", value, "'",
           Hint{"set ATHANOR_CUDA_ATTENTION to 'fast', 'fast_fwd' (fast forward, reference backward) or 'reference' "
                "(or leave it unset: fast)"});
}

const char* attention_impl_name(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::fast: return "fast";
    case AttentionImpl::fast_fwd: return "fast_fwd";
    default: return "reference";
  }
}

namespace {
// -1: not decided yet; otherwise an AttentionImpl. The environment is read on first use, so a
// bad value fails at the first attention call, with the variable's name.
std::atomic<int> g_impl{-1};
}  // namespace

AttentionImpl attention_impl() {
  int v = g_impl.load(std::memory_order_acquire);
  if (v < 0) {
    v = static_cast<int>(parse_attention_impl(std::getenv("ATHANOR_CUDA_ATTENTION")));
    int expected = -1;
    if (!g_impl.compare_exchange_strong(expected, v, std::memory_order_acq_rel)) v = expected;
  }
  return static_cast<AttentionImpl>(v);
}

void set_attention_impl(AttentionImpl impl) { g_impl.store(static_cast<int>(impl), std::memory_order_release); }

const char* fwd_tiles_name(FwdTiles t) {
  switch (t) {
    case FwdTiles::f128x64w8: return "f128x64w8";
    case FwdTiles::f128x64w4: return "f128x64w4";
    case FwdTiles::f64x128w4: return "f64x128w4";
    default: return "f64x64w4";
  }
}

const char* bwd_tiles_name(BwdTiles t) {
  switch (t) {
    case BwdTiles::b128x64w8: return "b128x64w8";
    case BwdTiles::b128x16w4: return "b128x16w4";
    default: return "b64x64w4";
  }
}

namespace {
template <class E, std::size_t N> std::string names_of(const E (&all)[N], const char* (*name)(E)) {
  std::string s;
  for (const E e : all) s += std::string(s.empty() ? "" : ", ") + name(e);
  return s;
}
}  // namespace

AttentionTiles parse_attention_tiles(const char* value) {
  AttentionTiles tiles;
  if (value == nullptr || value[0] == '\0') return tiles;
  const std::string v = value;
  const auto comma = v.find(',');
  const std::string f = v.substr(0, comma), b = comma == std::string::npos ? std::string() : v.substr(comma + 1);
  bool f_ok = false, b_ok = false;
  for (const FwdTiles t : kFwdTilesAll)
    if (f == fwd_tiles_name(t)) tiles.fwd = t, f_ok = true;
  for (const BwdTiles t : kBwdTilesAll)
    if (b == bwd_tiles_name(t)) tiles.bwd = t, b_ok = true;
  if (comma == std::string::npos || !f_ok || !b_ok)
    ATH_FAIL("ATHANOR_CUDA_ATTENTION_TILES", "'", v, "' is not '<forward>,<backward>' of known tile configurations",
             Hint{"forward: " + names_of(kFwdTilesAll, fwd_tiles_name) +
                  "; backward: " + names_of(kBwdTilesAll, bwd_tiles_name) + " (or leave it unset: " +
                  fwd_tiles_name(AttentionTiles{}.fwd) + "," + bwd_tiles_name(AttentionTiles{}.bwd) + ")"});
  return tiles;
}

namespace {
// -1: not decided yet; otherwise fwd * 256 + bwd (read on first use, as g_impl).
std::atomic<int> g_tiles{-1};
int encode(AttentionTiles t) { return static_cast<int>(t.fwd) * 256 + static_cast<int>(t.bwd); }
}  // namespace

AttentionTiles attention_tiles() {
  int v = g_tiles.load(std::memory_order_acquire);
  if (v < 0) {
    v = encode(parse_attention_tiles(std::getenv("ATHANOR_CUDA_ATTENTION_TILES")));
    int expected = -1;
    if (!g_tiles.compare_exchange_strong(expected, v, std::memory_order_acq_rel)) v = expected;
  }
  return AttentionTiles{static_cast<FwdTiles>(v / 256), static_cast<BwdTiles>(v % 256)};
}

void set_attention_tiles(AttentionTiles tiles) { g_tiles.store(encode(tiles), std::memory_order_release); }

// f128x64w4, f64x128w4 and b128x16w4 have kernels at D 64 only (attention_fast.h).
bool attention_tiles_instantiated(FwdTiles t, int64_t D) {
  return (t != FwdTiles::f128x64w4 && t != FwdTiles::f64x128w4) || D == 64;
}
bool attention_tiles_instantiated(BwdTiles t, int64_t D) { return t != BwdTiles::b128x16w4 || D == 64; }

namespace {
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
// 8 elements of 2 bytes: every row start is 16-byte aligned when the base pointer is.
bool strides_by8(const AttentionStrides& s) { return s.b % 8 == 0 && s.h % 8 == 0 && s.t % 8 == 0; }
}  // namespace

bool attention_fast_supported(const void* q, const void* k, const void* v, const void* o, const AttentionDims& d,
                              const AttentionLayout& L, DType dtype) {
  if (dtype != DType::bf16 && dtype != DType::f16) return false;
  if (d.D != d.Dv || (d.D != 64 && d.D != 128)) return false;
  // The output is written 4 bytes at a time (two elements of a row): 4-byte alignment would do,
  // but the same 16-byte rule keeps one condition.
  return aligned16(q) && aligned16(k) && aligned16(v) && aligned16(o) && strides_by8(L.q) && strides_by8(L.k) &&
         strides_by8(L.v) && strides_by8(L.o);
}

bool attention_fast_backward_supported(const void* q, const void* k, const void* v, const void* o, const void* dout,
                                       const void* dq, const void* dk, const void* dv, const AttentionDims& d,
                                       const AttentionLayout& L, DType dtype) {
  return attention_fast_supported(q, k, v, o, d, L, dtype) && aligned16(dout) && aligned16(dq) && aligned16(dk) &&
         aligned16(dv);
}

}  // namespace athanor::cuda
