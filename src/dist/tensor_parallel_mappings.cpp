// f, g and the sequence-parallel collectives as autograd functions (contract in
// include/athanor/dist/tensor_parallel_mappings.h). Each backward is written beside its
// forward: the backward of a collective is its conjugate collective.
#include "athanor/dist/tensor_parallel_mappings.h"

#include "athanor/autograd/function.h"
#include "athanor/autograd/saved_tensor_hooks.h"
#include "athanor/core/error.h"
#include "athanor/ops/autocast.h"
#include "athanor/ops/linalg.h"

namespace athanor::dist {

namespace {
int64_t wrap_dim(const Tensor& x, int64_t dim, const char* op) {
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  ATH_CHECK(d >= 0 && d < x.dim(), op, "dimension ", dim, " is out of range for ", x.describe());
  return d;
}
// [A, n, B] as the product of the dims before `dim`, dim itself, and the dims after.
void split_shape(const Shape& s, int64_t d, int64_t& A, int64_t& n, int64_t& B) {
  A = 1;
  B = 1;
  for (int64_t i = 0; i < d; ++i) A *= s[i];
  for (int64_t i = d + 1; i < static_cast<int64_t>(s.size()); ++i) B *= s[i];
  n = s[d];
}
}  // namespace

Tensor all_gather_along(const Tensor& x, ProcessGroup& g, int64_t dim) {
  const int64_t d = wrap_dim(x, dim, "all_gather_along");
  const int W = g.size();
  const Tensor in = x.detach().contiguous();
  int64_t A, n, B;
  split_shape(in.sizes(), d, A, n, B);
  Tensor buf = empty({W, A, n, B}, TensorOptions(in.dtype()));  // rank r's slice at [r]
  g.all_gather(buf, in);
  Shape out_shape = in.sizes();
  out_shape[d] = n * W;
  if (A == 1) return buf.view(out_shape);  // the ranks' slices are already in order
  Tensor out = empty(out_shape, TensorOptions(in.dtype()));
  // out[a, r·n + i, b] = buf[r, a, i, b]
  copy_into(make_view(out, {W, A, n, B}, {n * B, W * n * B, B, 1}, 0), buf);
  return out;
}

Tensor reduce_scatter_along(const Tensor& x, ProcessGroup& g, int64_t dim) {
  const int64_t d = wrap_dim(x, dim, "reduce_scatter_along");
  const int W = g.size();
  ATH_CHECK(x.size(d) % W == 0, "reduce_scatter_along", "dimension ", d, " of ", x.describe(),
            " is not divisible by the group size ", W,
            Hint{"with sequence parallelism the sequence length must be a multiple of dist.tp"});
  const Tensor in = x.detach().contiguous();
  int64_t A, N, B;
  split_shape(in.sizes(), d, A, N, B);
  const int64_t n = N / W;
  Shape out_shape = in.sizes();
  out_shape[d] = n;
  Tensor out = empty(out_shape, TensorOptions(in.dtype()));
  if (A == 1) {
    g.reduce_scatter(out, in);
    return out;
  }
  Tensor buf = empty({W, A, n, B}, TensorOptions(in.dtype()));  // buf[r, a, i, b] = in[a, r·n + i, b]
  copy_into(buf, make_view(in, {W, A, n, B}, {n * B, N * B, B, 1}, 0));
  g.reduce_scatter(out, buf);
  return out;
}

Tensor split_along(const Tensor& x, ProcessGroup& g, int64_t dim) {
  const int64_t d = wrap_dim(x, dim, "split_along");
  const int W = g.size();
  ATH_CHECK(x.size(d) % W == 0, "split_along", "dimension ", d, " of ", x.describe(), " is not divisible by the group size ",
            W, Hint{"with sequence parallelism the sequence length must be a multiple of dist.tp"});
  const int64_t n = x.size(d) / W;
  Shape sizes = x.sizes();
  sizes[d] = n;
  const Tensor xd = x.detach();
  return make_view(xd, sizes, xd.strides(), xd.storage_offset() + g.rank() * n * xd.stride(d)).contiguous();
}

Tensor copy_to_tensor_parallel_region(const Tensor& x, const GroupPtr& tp) {
  if (tp->size() == 1) return x;
  return record("tp_copy_f", {x}, x.detach(), [tp](const Node&, const Grads& g) {
    // Every rank's copy of x fed a different part of the layer: dx is the sum of the parts' gradients.
    Tensor s = g[0].contiguous().clone();
    tp->all_reduce(s, ReduceOp::sum);
    return Grads{s};
  });
}

Tensor reduce_from_tensor_parallel_region(const Tensor& x, const GroupPtr& tp) {
  if (tp->size() == 1) return x;
  Tensor y = x.detach().contiguous().clone();
  tp->all_reduce(y, ReduceOp::sum);
  // y = Σ_r x_r: d y / d x_r = 1, and every rank holds the same dy.
  return record("tp_reduce_g", {x}, y, [](const Node&, const Grads& g) { return Grads{g[0]}; });
}

Tensor gather_from_sequence_parallel_region(const Tensor& x, const GroupPtr& tp, int64_t dim, bool grad_reduce_scatter) {
  if (tp->size() == 1) return x;
  Tensor y = all_gather_along(x, *tp, dim);
  return record("sp_all_gather", {x}, y, [tp, dim, grad_reduce_scatter](const Node&, const Grads& g) {
    // A tensor-parallel consumer leaves each rank a partial gradient of the whole sequence:
    // sum them and keep this rank's rows. Otherwise every rank holds the full gradient already.
    return Grads{grad_reduce_scatter ? reduce_scatter_along(g[0], *tp, dim) : split_along(g[0], *tp, dim)};
  });
}

Tensor reduce_scatter_to_sequence_parallel_region(const Tensor& x, const GroupPtr& tp, int64_t dim) {
  if (tp->size() == 1) return x;
  Tensor y = reduce_scatter_along(x, *tp, dim);
  // y_r = (Σ_s x_s)[rows of r]: the gradient of every x_s is the gradient of the whole output.
  return record("sp_reduce_scatter", {x}, y,
                [tp, dim](const Node&, const Grads& g) { return Grads{all_gather_along(g[0], *tp, dim)}; });
}

Tensor scatter_to_sequence_parallel_region(const Tensor& x, const GroupPtr& tp, int64_t dim) {
  if (tp->size() == 1) return x;
  Tensor y = split_along(x, *tp, dim);
  return record("sp_scatter", {x}, y, [tp, dim](const Node&, const Grads& g) { return Grads{all_gather_along(g[0], *tp, dim)}; });
}

Tensor gather_from_tensor_parallel_region(const Tensor& x, const GroupPtr& tp, int64_t dim) {
  if (tp->size() == 1) return x;
  Tensor y = all_gather_along(x, *tp, dim);
  return record("tp_all_gather", {x}, y, [tp, dim](const Node&, const Grads& g) { return Grads{split_along(g[0], *tp, dim)}; });
}

Tensor scatter_to_tensor_parallel_region(const Tensor& x, const GroupPtr& tp, int64_t dim) {
  if (tp->size() == 1) return x;
  Tensor y = split_along(x, *tp, dim);
  return record("tp_scatter", {x}, y, [tp, dim](const Node&, const Grads& g) { return Grads{all_gather_along(g[0], *tp, dim)}; });
}

namespace {
// Stands in for the gathered input a linear saved: this rank's slice, gathered again on unpack.
class RegatherPack final : public SavedTensorPack {
 public:
  RegatherPack(const Tensor& local, GroupPtr tp, int64_t dim) : local_(local, "sequence-parallel input slice"), tp_(std::move(tp)), dim_(dim) {}
  Tensor unpack(const Node& owner) override {
    // Once per backward of the owning op, however often it unpacks (every rank unpacks alike).
    if (!gathered_.defined()) gathered_ = all_gather_along(local_.unpack(owner), *tp_, dim_);
    return gathered_;
  }

 private:
  SavedTensor local_;
  GroupPtr tp_;
  int64_t dim_;
  Tensor gathered_;
};

bool same_tensor_data(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && a.dtype() == b.dtype();
}
}  // namespace

Tensor sequence_parallel_apply(const Tensor& x_local, const GroupPtr& tp, int64_t dim, bool regather, const char* autocast_op,
                               const std::function<Tensor(const Tensor&)>& op) {
  // Cast first (autocast would cast the gathered tensor inside the op): the gathered tensor is
  // then the one the op saves, and the all-gather moves GEMM-dtype bytes.
  const Tensor x = autocast_input(x_local, autocast_op);
  const Tensor full = gather_from_sequence_parallel_region(x, tp, dim, /*grad_reduce_scatter=*/true);
  if (!regather || tp->size() == 1 || !grad_enabled()) return op(full);
  std::shared_ptr<RegatherPack> pack;  // one for every save of `full`: one all-gather in backward
  SavedTensorHooks hooks([&](const Tensor& t) -> std::shared_ptr<SavedTensorPack> {
    if (!same_tensor_data(t, full)) return nullptr;
    if (!pack) pack = std::make_shared<RegatherPack>(x, tp, dim);
    return pack;
  });
  return op(full);
}

Tensor sequence_parallel_linear(const Tensor& x_local, const Tensor& weight, const Tensor& bias, const GroupPtr& tp,
                                int64_t dim, bool regather) {
  return sequence_parallel_apply(x_local, tp, dim, regather, "linear", [&](const Tensor& full) { return linear(full, weight, bias); });
}

}  // namespace athanor::dist
