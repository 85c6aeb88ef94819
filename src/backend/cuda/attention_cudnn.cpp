// cuDNN's fused flash attention on the backend API (attention_cudnn.h). The node structure of
// both graphs follows what cuDNN's runtime-fusion SDPA engines recognise (the graphs
// cudnn-frontend's SDPA nodes build, read for facts, not copied).
#include "backend/cuda/attention_cudnn.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cudnn_loader.h"
#include "backend/cuda/device_allocator.h"

namespace athanor::cuda {

std::string attention_cudnn_decline_reason(const AttentionDims& d, const AttentionLayout& L, DType dtype) {
  if (dtype != DType::bf16 && dtype != DType::f16)
    return std::string("dtype ") + dtype_name(dtype) + ": cuDNN's path takes bf16 and f16 only";
  if (d.kv_heads() != d.H) return "grouped-query heads (Hkv != H) are not wired to cuDNN's backward";
  if (d.D != d.Dv) return "D != Dv";
  if (d.D < 8 || d.D > 128 || d.D % 8 != 0) return "head dim " + std::to_string(d.D) + " (cuDNN's path takes 8..128, a multiple of 8)";
  if (d.B < 1 || d.H < 1 || d.Tq < 1 || d.Tk < 1) return "empty sizes";
  // cudnn-frontend's SDPA backward refuses s_q = s_kv = 1 (its support surface), so we do not
  // hand it to the backend either (the forward too: one rule for both directions).
  if (d.Tq == 1 && d.Tk == 1) return "Tq = Tk = 1 (cuDNN's fused attention backward does not support it)";
  for (const AttentionStrides* s : {&L.q, &L.k, &L.v, &L.o})
    if (s->b % 8 != 0 || s->h % 8 != 0 || s->t % 8 != 0 || s->b < 0 || s->h < 0 || s->t < 0)
      return "a stride that is not a multiple of 8 elements (16 bytes)";
  return "";
}

std::string attention_cudnn_unavailable_reason() { return cudnn_unavailable_reason(); }

bool attention_cudnn_supported(const void* q, const void* k, const void* v, const void* o, const AttentionDims& d,
                               const AttentionLayout& L, DType dtype) {
  for (const void* p : {q, k, v, o})
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  return attention_cudnn_decline_reason(d, L, dtype).empty() && cudnn_available();
}

#if !ATHANOR_HAS_CUDNN_HEADERS
bool attention_cudnn_forward(const void*, const void*, const void*, void*, float*, const AttentionDims&,
                             const AttentionLayout&, bool, double, DType, cudaStream_t) {
  return false;
}
bool attention_cudnn_backward(const void*, const void*, const void*, const void*, const void*, const float*, void*,
                              void*, void*, const AttentionDims&, const AttentionLayout&, bool, double, DType, void*,
                              cudaStream_t) {
  return false;
}
std::string attention_cudnn_last_failure() { return cudnn_unavailable_reason(); }
std::string attention_cudnn_graph_check(const AttentionDims&, const AttentionLayout&, bool, DType, bool) {
  return cudnn_unavailable_reason();
}
#else

namespace {

using Desc = cudnnBackendDescriptor_t;
using Dims = std::array<int64_t, 4>;

// The variant pack's tensors (virtual tensors take ids from kFirstVirtual up).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kDO, kDQ, kDK, kDV, kSoftmaxSum, kOne,
  kFirstVirtual = 100
};

// Builds one graph's descriptors; the first failure is kept (later calls do nothing) and every
// descriptor is owned (destroyed with the builder, or kept alive by the plan that moves them).
struct Builder {
  const CudnnApi& api;
  cudnnDataType_t io;  // bf16 or f16
  std::vector<Desc> owned;
  std::vector<Desc> ops;
  std::string err;
  int64_t next_virtual = kFirstVirtual;

  Builder(const CudnnApi& a, cudnnDataType_t io_type) : api(a), io(io_type) {}
  ~Builder() {
    for (Desc d : owned) api.BackendDestroyDescriptor(d);
  }
  Builder(const Builder&) = delete;
  Builder& operator=(const Builder&) = delete;

  bool ok() const { return err.empty(); }
  void fail(const char* what, cudnnStatus_t s) {
    if (!err.empty()) return;
    err = std::string(what) + ": " + api.GetErrorString(s);
    if (api.GetLastErrorString) {
      char msg[512] = {0};
      api.GetLastErrorString(msg, sizeof msg);
      if (msg[0]) err += std::string(" (") + msg + ")";
    }
  }
  Desc make(cudnnBackendDescriptorType_t t, const char* what) {
    if (!ok()) return nullptr;
    Desc d = nullptr;
    const cudnnStatus_t s = api.BackendCreateDescriptor(t, &d);
    if (s != CUDNN_STATUS_SUCCESS) {
      fail(what, s);
      return nullptr;
    }
    owned.push_back(d);
    return d;
  }
  void set(Desc d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n, const void* v,
           const char* what) {
    if (!ok()) return;
    const cudnnStatus_t s = api.BackendSetAttribute(d, a, t, n, v);
    if (s != CUDNN_STATUS_SUCCESS) fail(what, s);
  }
  void finalize(Desc d, const char* what) {
    if (!ok()) return;
    const cudnnStatus_t s = api.BackendFinalize(d);
    if (s != CUDNN_STATUS_SUCCESS) fail(what, s);
  }

  Desc tensor(int64_t uid, cudnnDataType_t dt, const Dims& dims, const Dims& strides, bool is_virtual,
              bool by_value = false) {
    Desc t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor descriptor");
    const int64_t align = 16;
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dims");
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides");
    const bool virt = is_virtual, byv = by_value;
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "tensor virtual");
    if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byv, "tensor by value");
    finalize(t, "tensor finalize");
    return t;
  }
  // A virtual tensor: f32 intermediates unless told otherwise.
  Desc virt(const Dims& dims, const Dims& strides, cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
    return tensor(next_virtual++, dt, dims, strides, true);
  }
  // A scalar passed by value in the variant pack (f32 [1,1,1,1]).
  Desc scalar(int64_t uid) { return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true); }

  void op(Desc d, const char* what) {
    finalize(d, what);
    if (ok()) ops.push_back(d);
  }
  // y = mode(x[, b[, t]]) at math precision `prec`; axis >= 0 for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, Desc x, Desc b, Desc t, Desc y, cudnnDataType_t prec = CUDNN_DATA_FLOAT,
                 int64_t axis = -1) {
    Desc pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor");
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    finalize(pw, "pointwise finalize");
    Desc o = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
    set(o, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, "pointwise op desc");
    set(o, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "pointwise x");
    if (b) set(o, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "pointwise b");
    if (t) set(o, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, "pointwise t");
    set(o, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "pointwise y");
    op(o, "pointwise operation finalize");
  }
  // c = a @ b (batched over the first two dims), f32 accumulation.
  void matmul(Desc a, Desc b, Desc c) {
    Desc mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul descriptor");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul compute type");
    finalize(mm, "matmul finalize");
    Desc o = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
    set(o, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, "matmul a");
    set(o, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "matmul b");
    set(o, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, "matmul c");
    set(o, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, "matmul desc");
    op(o, "matmul operation finalize");
  }
  // y = reduce(x) over the dims where y has size 1.
  void reduction(cudnnReduceTensorOp_t mode, Desc x, Desc y) {
    Desc r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction descriptor");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction operator");
    set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "reduction compute type");
    finalize(r, "reduction finalize");
    Desc o = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
    set(o, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reduction x");
    set(o, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reduction y");
    set(o, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r, "reduction desc");
    op(o, "reduction operation finalize");
  }
  // y = x viewed with y's dims/strides (a transpose, and the cast to y's type).
  void reshape(Desc x, Desc y) {
    Desc o = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
    set(o, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reshape x");
    set(o, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reshape y");
    op(o, "reshape operation finalize");
  }

  // The causal mask (top-left: key j visible to query i when i >= j) on scores s: -inf above
  // the diagonal. Returns the masked scores.
  Desc causal_mask(Desc s, const Dims& sd, const Dims& ss) {
    Desc row = virt(sd, ss, CUDNN_DATA_INT32), col = virt(sd, ss, CUDNN_DATA_INT32);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, row, CUDNN_DATA_FLOAT, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, col, CUDNN_DATA_FLOAT, 3);
    Desc keep = virt(sd, ss, CUDNN_DATA_BOOLEAN);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep, CUDNN_DATA_BOOLEAN);
    Desc ninf = scalar(kNegInf), out = virt(sd, ss);
    // BINARY_SELECT: y = t ? x : b.
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, ninf, keep, out);
    return out;
  }
};

// The tensor dims/strides of an operand [B, heads, T, D] and of its transpose [B, heads, D, T].
Dims dims_of(const AttentionDims& d, int64_t heads, int64_t T) { return {d.B, heads, T, d.D}; }
Dims strides_of(const AttentionStrides& s) { return {s.b, s.h, s.t, 1}; }
Dims dims_t(const AttentionDims& d, int64_t heads, int64_t T) { return {d.B, heads, d.D, T}; }
Dims strides_t(const AttentionStrides& s) { return {s.b, s.h, 1, s.t}; }

// A built plan (its descriptors kept alive) or the reason none could be built.
struct Plan {
  const CudnnApi* api = nullptr;
  std::vector<Desc> owned;
  Desc plan = nullptr;
  int64_t workspace = 0;
  std::string failure;  // "" when usable
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (api)
      for (Desc d : owned) api->BackendDestroyDescriptor(d);
  }
};

// The forward graph: S = scale Q K^T, causal mask, softmax with stats (lse), O = P V.
void build_forward(Builder& g, const AttentionDims& d, const AttentionLayout& L, bool causal) {
  const int64_t B = d.B, H = d.H, Tq = d.Tq, Tk = d.Tk;
  const Dims sd{B, H, Tq, Tk}, ss{H * Tq * Tk, Tq * Tk, Tk, 1};
  const Dims rd{B, H, Tq, 1}, rs{H * Tq, Tq, 1, 1};
  Desc q = g.tensor(kQ, g.io, dims_of(d, H, Tq), strides_of(L.q), false);
  Desc kt = g.tensor(kK, g.io, dims_t(d, H, Tk), strides_t(L.k), false);
  Desc v = g.tensor(kV, g.io, dims_of(d, H, Tk), strides_of(L.v), false);
  Desc o = g.tensor(kO, g.io, dims_of(d, H, Tq), strides_of(L.o), false);
  Desc stats = g.tensor(kStats, CUDNN_DATA_FLOAT, rd, rs, false);
  Desc scale = g.scalar(kScale);

  Desc s = g.virt(sd, ss);
  g.matmul(q, kt, s);
  Desc s_scaled = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, nullptr, s_scaled);
  Desc last = causal ? g.causal_mask(s_scaled, sd, ss) : s_scaled;
  // Softmax with stats: M = max_j s, Z = sum_j exp(s - M), lse = M + log Z, P = exp(s - M) / Z.
  Desc m = g.virt(rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, last, m);
  Desc sub = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, last, m, nullptr, sub);
  Desc e = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_EXP, sub, nullptr, nullptr, e);
  Desc z = g.virt(rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  Desc logz = g.virt(rd, rs);
  g.pointwise(CUDNN_POINTWISE_LOG, z, nullptr, nullptr, logz);
  g.pointwise(CUDNN_POINTWISE_ADD, m, logz, nullptr, stats);
  Desc p = g.virt(sd, ss, g.io);  // P V's A operand in the input type (what the engines expect)
  g.pointwise(CUDNN_POINTWISE_DIV, e, z, nullptr, p);
  g.matmul(p, v, o);
}

// The backward graph (deterministic "dP workspace" form):
//   Delta = rowsum(dO * O) (non-virtual, "softmax_sum");  P = exp(mask(scale Q K^T) - lse);
//   dV = P^T dO;  dS = scale * P * (dO V^T - Delta);  dK = dS^T Q;  dQ = dS K.
void build_backward(Builder& g, const AttentionDims& d, const AttentionLayout& L, bool causal) {
  const int64_t B = d.B, H = d.H, Tq = d.Tq, Tk = d.Tk, D = d.D;
  const Dims sd{B, H, Tq, Tk}, ss{H * Tq * Tk, Tq * Tk, Tk, 1};
  const Dims td{B, H, Tk, Tq}, ts{H * Tq * Tk, Tq * Tk, 1, Tk};  // the score matrix transposed
  const Dims rd{B, H, Tq, 1}, rs{H * Tq, Tq, 1, 1};
  Desc q = g.tensor(kQ, g.io, dims_of(d, H, Tq), strides_of(L.q), false);
  Desc kt = g.tensor(kK, g.io, dims_t(d, H, Tk), strides_t(L.k), false);
  Desc vt = g.tensor(kV, g.io, dims_t(d, H, Tk), strides_t(L.v), false);
  Desc o = g.tensor(kO, g.io, dims_of(d, H, Tq), strides_of(L.o), false);
  Desc dout = g.tensor(kDO, g.io, dims_of(d, H, Tq), strides_of(L.o), false);
  Desc stats = g.tensor(kStats, CUDNN_DATA_FLOAT, rd, rs, false);
  Desc dq = g.tensor(kDQ, g.io, dims_of(d, H, Tq), strides_of(L.q), false);
  Desc dk = g.tensor(kDK, g.io, dims_of(d, H, Tk), strides_of(L.k), false);
  Desc dv = g.tensor(kDV, g.io, dims_of(d, H, Tk), strides_of(L.v), false);
  Desc delta = g.tensor(kSoftmaxSum, CUDNN_DATA_FLOAT, rd, rs, false);
  Desc scale = g.scalar(kScale), one = g.scalar(kOne);

  // Delta = sum_c dO * O (times 1: the dropout-scale slot of the pattern).
  Desc dod = g.virt({B, H, Tq, D}, {H * Tq * D, Tq * D, D, 1});
  g.pointwise(CUDNN_POINTWISE_MUL, dout, o, nullptr, dod);
  Desc red = g.virt(rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, dod, red);
  g.pointwise(CUDNN_POINTWISE_MUL, red, one, nullptr, delta);

  // P = exp(mask(scale Q K^T - lse)).
  Desc s = g.virt(sd, ss);
  g.matmul(q, kt, s);
  Desc s_scaled = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, nullptr, s_scaled);
  Desc s_sub = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, s_scaled, stats, nullptr, s_sub);
  Desc last = causal ? g.causal_mask(s_sub, sd, ss) : s_sub;
  Desc p = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_EXP, last, nullptr, nullptr, p);

  // dV = P^T dO.
  Desc pt = g.virt(td, ts, g.io);
  g.reshape(p, pt);
  g.matmul(pt, dout, dv);

  // dS = scale * P * (dO V^T - Delta).
  Desc dp = g.virt(sd, ss);
  g.matmul(dout, vt, dp);
  Desc dp_sub = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, delta, nullptr, dp_sub);
  Desc dp_p = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, dp_sub, p, nullptr, dp_p);
  Desc ds = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, dp_p, scale, nullptr, ds);

  // dK = dS^T Q.
  Desc dst = g.virt(td, ts, g.io);
  g.reshape(ds, dst);
  g.matmul(dst, q, dk);

  // dQ = dS K (K^T viewed back as K), written straight to dQ: no f32 accumulator, no atomics.
  Desc k = g.virt(dims_of(d, H, Tk), strides_of(L.k), g.io);
  g.reshape(kt, k);
  g.matmul(ds, k, dq);
}

// Operation graph, heuristics (mode A), the first engine config whose plan finalizes (the
// backward skipping configs noted NONDETERMINISTIC). Fills `plan` or its failure.
void build_plan(Builder& g, cudnnHandle_t handle, bool backward, Plan& plan) {
  const CudnnApi& api = g.api;
  Desc graph = g.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
  g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(g.ops.size()),
        g.ops.data(), "graph ops");
  g.finalize(graph, "operation graph finalize");
  Desc heur = g.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
  g.set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph, "heuristics graph");
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  g.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
  g.finalize(heur, "heuristics finalize");
  int64_t count = 0;
  if (g.ok()) {
    const cudnnStatus_t s =
        api.BackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
    if (s != CUDNN_STATUS_SUCCESS) g.fail("heuristics result count", s);
  }
  if (g.ok() && count <= 0) g.err = "heuristics found no engine config for the graph";
  std::vector<Desc> cfgs;
  for (int64_t i = 0; g.ok() && i < count; ++i) cfgs.push_back(g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
  if (g.ok()) {
    int64_t got = 0;
    const cudnnStatus_t s =
        api.BackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs.data());
    if (s != CUDNN_STATUS_SUCCESS) g.fail("heuristics results", s);
    cfgs.resize(static_cast<std::size_t>(std::max<int64_t>(0, std::min(got, count))));
  }
  std::string tried;
  for (Desc cfg : cfgs) {
    if (!g.ok()) break;
    if (backward) {
      // Skip configs cuDNN itself notes as nondeterministic.
      Desc engine = g.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
      if (!g.ok()) break;
      int64_t n = 0;
      cudnnStatus_t s = api.BackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine);
      std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
      int64_t nn = 0;
      if (s == CUDNN_STATUS_SUCCESS)
        s = api.BackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                    CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes.data());
      if (s != CUDNN_STATUS_SUCCESS) {
        // Unknown determinism is not determinism: skip the config.
        tried += std::string(" [numerical notes unreadable: ") + api.GetErrorString(s) + "]";
        continue;
      }
      bool nondeterministic = false;
      for (int64_t i = 0; i < nn && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; ++i)
        nondeterministic |= notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
      if (nondeterministic) {
        tried += " [a config noted NONDETERMINISTIC, skipped]";
        continue;
      }
    }
    Desc ep = g.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
    if (!g.ok()) break;
    cudnnStatus_t s = api.BackendSetAttribute(ep, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    if (s == CUDNN_STATUS_SUCCESS)
      s = api.BackendSetAttribute(ep, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
    if (s == CUDNN_STATUS_SUCCESS) s = api.BackendFinalize(ep);
    if (s != CUDNN_STATUS_SUCCESS) {
      tried += std::string(" [") + api.GetErrorString(s) + "]";
      continue;
    }
    int64_t ws = 0, n = 0;
    s = api.BackendGetAttribute(ep, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
    if (s != CUDNN_STATUS_SUCCESS) {
      g.fail("plan workspace size", s);
      break;
    }
    plan.plan = ep;
    plan.workspace = ws;
    return;
  }
  if (g.ok()) g.err = "no engine config of " + std::to_string(cfgs.size()) + " finalized:" + tried;
}

struct Key {
  int device;
  bool backward, causal;
  DType dtype;
  uint64_t scale_bits;
  std::array<int64_t, 7> dims;
  std::array<int64_t, 12> strides;
  bool operator<(const Key& o) const {
    return std::tie(device, backward, causal, dtype, scale_bits, dims, strides) <
           std::tie(o.device, o.backward, o.causal, o.dtype, o.scale_bits, o.dims, o.strides);
  }
};

struct State {
  std::mutex mu;
  std::map<Key, std::unique_ptr<Plan>> plans;
  std::string last_failure;
};
// Never destroyed: destroying execution plans at exit could run after the CUDA runtime has
// been torn down (the handles are kept for the process's life for the same reason).
State& state() {
  static State* s = new State;
  return *s;
}

// Finds or builds the plan for the call (under the state's lock); nullptr when none can run.
Plan* plan_for(State& st, const CudnnApi& api, cudnnHandle_t handle, const Key& key, const AttentionDims& d,
                     const AttentionLayout& L) {
  auto it = st.plans.find(key);
  if (it == st.plans.end()) {
    auto plan = std::make_unique<Plan>();
    Builder g(api, key.dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF);
    if (key.backward)
      build_backward(g, d, L, key.causal);
    else
      build_forward(g, d, L, key.causal);
    if (g.ok()) build_plan(g, handle, key.backward, *plan);
    if (g.ok()) {
      plan->api = &api;
      plan->owned = std::move(g.owned);  // the plan keeps every descriptor it was built from alive
      g.owned.clear();
    } else {
      plan->failure = std::string(key.backward ? "cuDNN attention backward" : "cuDNN attention forward") +
                      " (B=" + std::to_string(d.B) + " H=" + std::to_string(d.H) + " Tq=" + std::to_string(d.Tq) +
                      " Tk=" + std::to_string(d.Tk) + " D=" + std::to_string(d.D) + "): " + g.err;
      plan->plan = nullptr;
    }
    it = st.plans.emplace(key, std::move(plan)).first;
    // cuDNN's plan build makes runtime calls of its own (a config that does not finalize, say,
    // one asking for more shared memory than this GPU has, may leave a non-sticky error behind,
    // even when a later config finalizes): not ours to report. Cleared, or the next
    // ATH_CUDA_LAUNCHED check (our fallback kernels', or any later op's) would throw it.
    cudaGetLastError();
  }
  if (!it->second->failure.empty()) {
    st.last_failure = it->second->failure;
    return nullptr;
  }
  return it->second.get();
}

Key make_key(int device, bool backward, bool causal, DType dtype, double scale, const AttentionDims& d,
             const AttentionLayout& L) {
  Key k{};
  k.device = device, k.backward = backward, k.causal = causal, k.dtype = dtype;
  const float sf = static_cast<float>(scale);
  uint32_t bits = 0;
  std::memcpy(&bits, &sf, sizeof bits);
  k.scale_bits = bits;
  k.dims = {d.B, d.H, d.Tq, d.Tk, d.D, d.Dv, d.kv_heads()};
  k.strides = {L.q.b, L.q.h, L.q.t, L.k.b, L.k.h, L.k.t, L.v.b, L.v.h, L.v.t, L.o.b, L.o.h, L.o.t};
  return k;
}

// Plans (building on first use) and runs one call: `uids` / `ptrs` are the variant pack's
// device tensors; the scalars are added here. False (with last_failure set) when it cannot.
bool run(bool backward, bool causal, double scale, DType dtype, const AttentionDims& d, const AttentionLayout& L,
         std::vector<int64_t> uids, std::vector<void*> ptrs, cudaStream_t stream) {
  const CudnnApi* api = cudnn_api();
  State& st = state();
  if (!api) {
    std::lock_guard<std::mutex> lock(st.mu);
    st.last_failure = cudnn_unavailable_reason();
    return false;
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  std::lock_guard<std::mutex> lock(st.mu);
  std::string why;
  cudnnHandle_t handle = cudnn_handle(device, &why);
  if (!handle) {
    st.last_failure = why;
    return false;
  }
  Plan* plan = plan_for(st, *api, handle, make_key(device, backward, causal, dtype, scale, d, L), d, L);
  if (!plan) return false;

  // Scalars by value: host pointers read when the call is enqueued.
  float scale_f = static_cast<float>(scale), one = 1.0f;
  float neg_inf = api->GetVersion() < 91000 ? std::numeric_limits<float>::lowest()
                                             : -std::numeric_limits<float>::infinity();
  uids.push_back(kScale), ptrs.push_back(&scale_f);
  if (causal) uids.push_back(kNegInf), ptrs.push_back(&neg_inf);
  if (backward) uids.push_back(kOne), ptrs.push_back(&one);

  DeviceAllocator& alloc = DeviceAllocator::get(device);
  void* ws = nullptr;
  if (plan->workspace > 0) {
    // The dP workspace is large (about 2 B H Tq Tk bytes): where it does not fit, our kernels
    // (which need none) run instead of the step failing.
    try {
      ws = alloc.allocate(static_cast<std::size_t>(plan->workspace), MemTag::workspace, stream);
    } catch (const std::exception& e) {
      // Kept as the plan's failure: this shape stays on our kernels. Retrying every call would
      // repeat the allocator's out-of-memory path each step (it waits for the streams and gives
      // every cached segment back to cudaFree before it throws), flushing the cache that our
      // kernels and every other op then refill.
      st.last_failure = "cuDNN attention: its workspace of " + std::to_string(plan->workspace) +
                        " bytes could not be allocated: " + e.what();
      plan->failure = st.last_failure;
      return false;
    }
  }
  std::string err;
  cudnnStatus_t s = api->SetStream(handle, stream);
  if (s != CUDNN_STATUS_SUCCESS) err = std::string("cudnnSetStream: ") + api->GetErrorString(s);
  cudnnBackendDescriptor_t pack = nullptr;
  if (err.empty()) {
    s = api->BackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (s != CUDNN_STATUS_SUCCESS) err = std::string("variant pack: ") + api->GetErrorString(s), pack = nullptr;
  }
  const int64_t n = static_cast<int64_t>(uids.size());
  if (err.empty()) s = api->BackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids.data());
  if (err.empty() && s == CUDNN_STATUS_SUCCESS)
    s = api->BackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs.data());
  if (err.empty() && s == CUDNN_STATUS_SUCCESS)
    s = api->BackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  if (err.empty() && s == CUDNN_STATUS_SUCCESS) s = api->BackendFinalize(pack);
  if (err.empty() && s == CUDNN_STATUS_SUCCESS) s = api->BackendExecute(handle, plan->plan, pack);
  if (err.empty() && s != CUDNN_STATUS_SUCCESS) {
    err = std::string(backward ? "cuDNN attention backward" : "cuDNN attention forward") +
          " execute: " + api->GetErrorString(s);
    if (api->GetLastErrorString) {
      char msg[512] = {0};
      api->GetLastErrorString(msg, sizeof msg);
      if (msg[0]) err += std::string(" (") + msg + ")";
    }
  }
  if (pack) api->BackendDestroyDescriptor(pack);
  if (ws) alloc.deallocate(ws);  // stream-ordered: reused only by work queued after this call
  if (!err.empty()) {
    // A failed execution may leave a non-sticky launch error behind: cleared, so that the
    // fallback kernels' launch checks do not report cuDNN's failure as theirs (a sticky error
    // stays, and surfaces there).
    cudaGetLastError();
    st.last_failure = err;
    plan->failure = err;  // this shape runs on our kernels from now on
    return false;
  }
  return true;
}

}  // namespace

bool attention_cudnn_forward(const void* q, const void* k, const void* v, void* o, float* lse, const AttentionDims& d,
                             const AttentionLayout& L, bool causal, double scale, DType dtype, cudaStream_t stream) {
  // lse (the Stats tensor, declared 16-byte aligned) is not among supported()'s operands.
  if (reinterpret_cast<std::uintptr_t>(lse) % 16 != 0) {
    std::lock_guard<std::mutex> lock(state().mu);
    state().last_failure = "cuDNN attention forward: lse is not 16-byte aligned";
    return false;
  }
  return run(false, causal, scale, dtype, d, L, {kQ, kK, kV, kO, kStats},
             {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), o, lse}, stream);
}

bool attention_cudnn_backward(const void* q, const void* k, const void* v, const void* o, const void* dout,
                              const float* lse, void* dq, void* dk, void* dv, const AttentionDims& d,
                              const AttentionLayout& L, bool causal, double scale, DType dtype, void* workspace,
                              cudaStream_t stream) {
  // dO, the gradients and the workspace must be 16-byte aligned too (the tensors' alignment).
  for (const void* p : {dout, static_cast<const void*>(lse), static_cast<const void*>(dq),
                        static_cast<const void*>(dk), static_cast<const void*>(dv), static_cast<const void*>(workspace)})
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) {
      std::lock_guard<std::mutex> lock(state().mu);
      state().last_failure = "cuDNN attention backward: an operand or the workspace is not 16-byte aligned";
      return false;
    }
  return run(true, causal, scale, dtype, d, L, {kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kSoftmaxSum},
             {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), const_cast<void*>(o),
              const_cast<void*>(dout), const_cast<float*>(lse), dq, dk, dv, workspace},
             stream);
}

std::string attention_cudnn_graph_check(const AttentionDims& d, const AttentionLayout& L, bool causal, DType dtype,
                                        bool backward) {
  const CudnnApi* api = cudnn_api();
  if (!api) return cudnn_unavailable_reason();
  // cuDNN divides by the sizes while finalizing (a zero size is a SIGFPE there, not a status).
  if (d.B < 1 || d.H < 1 || d.Tq < 1 || d.Tk < 1 || d.D < 1) return "empty sizes";
  Builder g(*api, dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF);
  if (backward)
    build_backward(g, d, L, causal);
  else
    build_forward(g, d, L, causal);
  Desc graph = g.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(g.ops.size()),
        g.ops.data(), "graph ops");
  g.finalize(graph, "operation graph finalize");
  return g.err;
}

std::string attention_cudnn_last_failure() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.last_failure;
}

#endif  // ATHANOR_HAS_CUDNN_HEADERS

}  // namespace athanor::cuda
