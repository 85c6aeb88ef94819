// rope: rotary position embedding (Hugging Face's rotate_half convention) as one op.
//
//   forward   table cos/sin [T, D/2] of (offset + t) inv_freq[i] (made once per (T, D, options) and
//             reused while those stay the same: rope_table_for);
//             out[i] = x[i] cos - x[i + D/2] sin,  out[i + D/2] = x[i + D/2] cos + x[i] sin
//   backward  the rotation is orthogonal, so its transpose is the inverse rotation:
//             dx = the same pass on dy with -sin. Nothing is saved but the options and shape.
//
// Autocast category: passthrough. RoPE is a memory-bound elementwise pass between two
// lower-precision ops (the q/k projections and attention): upcasting its input to f32 would
// write and read an f32 copy and force the attention to cast back. The kernel computes in f32
// anyway and rounds once (PyTorch runs it in the input dtype; HF casts cos/sin to the input
// dtype and rounds after each multiply and add, so ours is at least as accurate).
#include "athanor/ops/rope.h"

#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/cpu/rope.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {
namespace {
using detail::Grads;
constexpr const char* kOp = "rope";

struct RopeSaved : OpSaved {
  RopeOptions opt;
  Shape shape;
  DType dtype = DType::f32;
};

std::optional<cpu::RopeLlama3> llama3_of(const RopeOptions& o) {
  if (!o.llama3) return std::nullopt;
  const RopeScaling& s = *o.llama3;
  return cpu::RopeLlama3{s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position};
}

void check_args(const Tensor& x, const RopeOptions& o) {
  detail::check_floating(x, kOp, "x");
  ATH_CHECK(x.dim() == 4, kOp, "expected x of shape [B, T, H, D], got ", x.describe(),
            Hint{"apply rope to the heads before the transpose: q_proj(x).view({B, T, H, D})"});
  ATH_CHECK(x.size(3) % 2 == 0, kOp, "the head dim D (dim 3) must be even (element i pairs with i + D/2), got ",
            x.describe(), Hint{"use an even head_dim (n_embd / n_head)"});
  ATH_CHECK(std::isfinite(o.theta) && o.theta > 0, kOp, "theta must be finite and > 0, got ", o.theta,
            " (x ", x.describe(), ")", Hint{"Llama 2 uses rope_theta 10000, Llama 3 500000"});
  ATH_CHECK(o.position_offset >= 0, kOp, "position_offset must be >= 0, got ", o.position_offset, " (x ", x.describe(), ")",
            Hint{"pass the number of tokens already in the KV cache"});
  if (o.llama3) {
    const RopeScaling& s = *o.llama3;
    ATH_CHECK(std::isfinite(s.factor) && s.factor > 0, kOp, "llama3 scaling: factor must be finite and > 0, got ", s.factor,
              Hint{"Llama 3.1 uses factor 8"});
    ATH_CHECK(std::isfinite(s.low_freq_factor) && s.low_freq_factor > 0, kOp,
              "llama3 scaling: low_freq_factor must be finite and > 0, got ", s.low_freq_factor, Hint{"Llama 3.1 uses 1"});
    ATH_CHECK(std::isfinite(s.high_freq_factor) && s.high_freq_factor > s.low_freq_factor, kOp,
              "llama3 scaling: high_freq_factor must be greater than low_freq_factor, got high_freq_factor ",
              s.high_freq_factor, " and low_freq_factor ", s.low_freq_factor, Hint{"Llama 3.1 uses 4 and 1"});
    ATH_CHECK(s.original_max_position > 0, kOp, "llama3 scaling: original_max_position must be > 0, got ",
              s.original_max_position, Hint{"HF's original_max_position_embeddings: 8192 for Llama 3.1"});
  }
}

// The cos/sin table [T, D/2] (cos, then sin) of one (T, D, options) in compute type C. The last
// table made for each compute type is kept and handed out again: a model's q and k of every layer
// (and the backward) use the same one, so a step computes it once instead of 4 n_layer times
// (T D / 2 sincos pairs in double: for T 256, D 64 about as long as the rotation of a
// [4, 256, 12, 64] f32 tensor). The table is immutable once made; a mutex guards the slot.
template <class C> struct RopeTable {
  int64_t T = 0, D = 0, offset = 0;
  double theta = 0;
  std::optional<RopeScaling> llama3;
  std::vector<C> cos_sin;
  bool same(int64_t t, int64_t d, const RopeOptions& o) const {
    auto eq = [](const std::optional<RopeScaling>& a, const std::optional<RopeScaling>& b) {
      return a.has_value() == b.has_value() &&
             (!a || (a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
                     a->high_freq_factor == b->high_freq_factor && a->original_max_position == b->original_max_position));
    };
    return T == t && D == d && offset == o.position_offset && theta == o.theta && eq(llama3, o.llama3);
  }
};
template <class C> std::shared_ptr<const RopeTable<C>> rope_table_for(int64_t T, int64_t D, const RopeOptions& o) {
  static std::mutex mu;
  static std::shared_ptr<const RopeTable<C>> last;
  {
    const std::lock_guard<std::mutex> lock(mu);
    if (last && last->same(T, D, o)) return last;
  }
  auto t = std::make_shared<RopeTable<C>>();
  t->T = T, t->D = D, t->offset = o.position_offset, t->theta = o.theta, t->llama3 = o.llama3;
  t->cos_sin.resize(static_cast<size_t>(2 * T * (D / 2)));
  cpu::rope_table<C>(cpu::rope_inv_freq(D, o.theta, llama3_of(o)), T, o.position_offset, t->cos_sin.data(),
                     t->cos_sin.data() + T * (D / 2));
  const std::lock_guard<std::mutex> lock(mu);
  last = t;
  return t;
}

// out = the rotation of x [B, T, H, D] (rows contiguous; any b/t/h strides) by sign * angle.
Tensor rotate(const Tensor& x, const RopeOptions& o, int sign) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  const Tensor xs = x.stride(3) == 1 || x.size(3) <= 1 ? x : detail::contiguous_raw(x);
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()));
  if (x.numel() == 0) return out;
  const cpu::RopeStrides st{xs.stride(0), xs.stride(1), xs.stride(2)};
  dispatch(x.dtype(), [&]<class E>() {
    if constexpr (is_float_type_v<E>) {
      using C = cpu::rope_acc_t<E>;
      const std::shared_ptr<const RopeTable<C>> table = rope_table_for<C>(T, D, o);
      const C *cs = table->cos_sin.data(), *sn = cs + T * (D / 2);
      cpu::rope_apply<E>(static_cast<const E*>(xs.raw_data()), st, static_cast<E*>(out.raw_data()), B, T, H, D, cs, sn, sign);
    }
  });
  return out;
}

std::vector<Tensor> rope_cpu(OpCall& c) {
  const Tensor& x = c.in(0);
  const RopeOptions& o = c.args<RopeOptions>();
  check_args(x, o);
  Tensor out = rotate(x, o, +1);
  if (c.records()) {
    RopeSaved& s = c.save<RopeSaved>();
    s.opt = o, s.shape = x.sizes(), s.dtype = x.dtype();
  }
  return {out};
}

Grads rope_backward(const Node& n, const Grads& g, const OpSaved& saved) {
  const RopeSaved& s = saved.as<RopeSaved>();
  if (!g[0].defined() || !needs_grad(n, 0)) return {Tensor()};
  return {rotate(detail::to_raw(g[0], s.dtype), s.opt, -1)};
}

std::vector<Tensor> rope_reference(OpCall& c) {
  const RopeOptions& o = c.args<RopeOptions>();
  return {cpu::ref::rope(detail::ref64(c.in(0)), o.theta, llama3_of(o), o.position_offset)};
}

std::vector<OpCase> rope_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const detail::Inputs& t, const RopeOptions& o) { return detail::Inputs{rope(t[0], o)}; };
  // theta 100, D 8: wavelengths 6.3, 20, 63, 199 against the band [64/8, 64/1]: one kept, two
  // interpolated, one divided by the factor.
  const RopeOptions l3{.theta = 100.0, .llama3 = RopeScaling{4.0, 1.0, 8.0, 64}, .position_offset = 7};
  return {
      make_case<RopeOptions>("x [2, 5, 3, 8] (odd T)", {case_randn({2 * s, 5, 3, 8}, 1)}, {}, call),
      // rows contiguous, positions and heads strided: read in place
      make_case<RopeOptions>("x [1, 5, 3, 4] dims 1, 2 transposed, offset 3, theta 500000",
                             {case_randn({s, 5, 3, 4}, 2, CaseLayout::transposed12)},
                             {.theta = 500000.0, .llama3 = std::nullopt, .position_offset = 3}, call),
      make_case<RopeOptions>("x [1, 3, 2, 8] strided, llama3 scaling (factor 4, band 8..64), theta 100, offset 7",
                             {case_randn({s, 3, 2, 8}, 3, CaseLayout::strided)}, l3, call),
      make_case<RopeOptions>("x [1, 2, 2, 6] transposed (all dims)", {case_randn({s, 2, 2, 6}, 4, CaseLayout::transposed)}, {},
                             call),
  };
}
}  // namespace

namespace ops {
const OpDef& rope_op() {
  static const OpDef d{.name = "rope", .inputs = {"x"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(rope_cpu, rope_backward), .reference = rope_reference,
                       .dtypes = detail::kFloatDTypes, .cases = rope_cases,
                       .derivative = "the inverse rotation: dx = rope(dy) with -sin", .file = "src/ops/rope.cpp"};
  return d;
}
}  // namespace ops

Tensor rope(const Tensor& x, const RopeOptions& opt) { return call_op(ops::rope_op(), {x}, opt); }

}  // namespace athanor
