// embedding: out[..., :] = weight[ids[...], :].
//
// Forward: ids are validated (an out-of-range id raises an Error naming the id,
// its position in ids and the table size), then rows are copied in parallel
// (cpu::index_select_3d with outer = 1).
// Backward: d out[p, :] / d weight[v, :] = I when ids[p] == v, so
//   grad_weight[v, :] = sum_{p : ids[p] == v} g[p, :],  and 0 for v == padding_idx.
// cpu::index_add_3d groups the positions by id (counting sort) and sums each
// row in increasing p on one thread: the result is bit-identical for any
// thread count. bf16/f16 gradients are summed in f32 and rounded once.
// For f32/f64 tables the backward emits the gradient row-sparse (Node::emit_row_sparse):
// the engine adds the rows (summed per id in the same order, cpu::index_accumulate_rows)
// into whatever dense gradient the table already has, so a tied lm_head's [V, C]
// gradient is not met by a second zero-filled [V, C] table.
#include <string>

#include "athanor/ops/embedding.h"
#include "backend/cpu/index.h"
#include "ops/op_args.h"
#include "ops/op_def.h"
#include "ops/op_utils.h"

namespace athanor {

namespace {
using detail::Grads;
using detail::Inputs;

using detail::EmbeddingArgs;  // shared with the CUDA kernel (ops/op_args.h)
struct EmbeddingSaved : OpSaved {
  SavedTensor ids;
  int64_t num = 0, dim = 0, n = 0, pad = -1;
  DType dtype = DType::f32;
};

std::vector<Tensor> embedding_cpu(OpCall& c) {
  const Tensor &weight = c.in(0), &ids = c.in(1);
  const std::optional<int64_t> padding_idx = c.args<EmbeddingArgs>().padding_idx;
  const char* op = "embedding";
  detail::check_floating(weight, op, "weight");
  detail::check_defined(ids, op, "ids");
  ATH_CHECK(weight.dim() == 2, op, "weight must be 2-D [num_embeddings, dim], got ", weight.describe(),
            Hint{"reshape the table to [num_embeddings, embedding_dim]"});
  ATH_CHECK(ids.dtype() == DType::i64 || ids.dtype() == DType::i32, op, "ids must be i64 or i32, got ", ids.describe(),
            Hint{"convert the ids with .to(DType::i64)"});
  const int64_t num = weight.size(0), dim = weight.size(1);
  int64_t pad = -1;
  if (padding_idx) {
    ATH_CHECK(*padding_idx >= -num && *padding_idx < num, op, "padding_idx ", *padding_idx,
              " is out of range for a table of ", num, " embeddings (weight ", weight.describe(), ")",
              Hint{"padding_idx must be in [-num_embeddings, num_embeddings)"});
    pad = *padding_idx < 0 ? *padding_idx + num : *padding_idx;
  }
  const Tensor ic = detail::contiguous_raw(ids);
  const int64_t n = ic.numel();
  int64_t bad = -1, value = 0;
  if (ic.dtype() == DType::i64) {
    bad = cpu::first_out_of_range(ic.data_ptr<int64_t>(), n, num);
    if (bad >= 0) value = ic.data_ptr<int64_t>()[bad];
  } else {
    bad = cpu::first_out_of_range(ic.data_ptr<int32_t>(), n, num);
    if (bad >= 0) value = ic.data_ptr<int32_t>()[bad];
  }
  if (bad >= 0) {
    Shape pos(ids.dim());  // coordinates of the bad id
    for (int64_t d = ids.dim() - 1, f = bad; d >= 0; --d) pos[d] = f % ids.sizes()[d], f /= ids.sizes()[d];
    ATH_FAIL(op, "id ", value, " at position ", shape_str(pos), " of ids ", ids.describe(),
             " is out of range for an embedding table of ", num, " rows (weight ", weight.describe(), ")",
             Hint{"ids must be in [0, " + std::to_string(num) +
                  "); check that the tokenizer's vocabulary size matches num_embeddings"});
  }
  Shape out_shape = ids.sizes();
  out_shape.push_back(dim);
  Tensor out = empty(out_shape, TensorOptions(weight.dtype()));
  const Tensor wc = detail::contiguous_raw(weight);
  dispatch(weight.dtype(), [&]<class T>() {
    if constexpr (is_float_type_v<T>) {
      if (ic.dtype() == DType::i64)
        cpu::index_select_3d<T, int64_t>(static_cast<const T*>(wc.raw_data()), ic.data_ptr<int64_t>(),
                                         static_cast<T*>(out.raw_data()), 1, num, n, dim);
      else
        cpu::index_select_3d<T, int32_t>(static_cast<const T*>(wc.raw_data()), ic.data_ptr<int32_t>(),
                                         static_cast<T*>(out.raw_data()), 1, num, n, dim);
    }
  });
  if (c.records()) {
    EmbeddingSaved& s = c.save<EmbeddingSaved>();
    s.ids = save(ic, "ids"), s.num = num, s.dim = dim, s.n = n, s.pad = pad, s.dtype = weight.dtype();
  }
  return {out};
}

Grads embedding_backward(const Node& node, const Grads& g, const OpSaved& saved) {
  const EmbeddingSaved& s = saved.as<EmbeddingSaved>();
  const Tensor idc = s.ids.unpack(node);
  // grad_weight[v, :] = sum over positions p with ids[p] == v of g[p, :]; row padding_idx stays 0.
  const DType work = s.dtype == DType::f64 ? DType::f64 : DType::f32;
  const Tensor gc = detail::to_raw(g[0], work);
  if (work == s.dtype) {
    // f32/f64 tables: hand the engine the rows (n of num) instead of a zero-filled [num, dim]
    // table; it adds them straight into the gradient they meet (a tied lm_head's, or .grad).
    node.emit_row_sparse(0, RowSparseGrad{make_view(idc, {s.n}, {1}, idc.storage_offset()),
                                          make_view(gc, {s.n, s.dim}, {s.dim, 1}, gc.storage_offset()), s.pad});
    return {Tensor(), Tensor()};
  }
  Tensor gw = empty({s.num, s.dim}, TensorOptions(work));
  dispatch(work, [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      if (idc.dtype() == DType::i64)
        cpu::index_add_3d<T, int64_t>(static_cast<const T*>(gc.raw_data()), idc.data_ptr<int64_t>(),
                                      static_cast<T*>(gw.raw_data()), 1, s.num, s.n, s.dim, s.pad);
      else
        cpu::index_add_3d<T, int32_t>(static_cast<const T*>(gc.raw_data()), idc.data_ptr<int32_t>(),
                                      static_cast<T*>(gw.raw_data()), 1, s.num, s.n, s.dim, s.pad);
    }
  });
  return {detail::to_raw(gw, s.dtype), Tensor()};  // ids are integers: no gradient
}

std::vector<Tensor> embedding_reference(OpCall& c) {  // out[p, :] = weight[ids[p], :]
  const Tensor& ids = c.in(1);
  std::vector<int64_t> idx;
  for (double e : ids.to_vector()) idx.push_back(static_cast<int64_t>(e));
  Shape out = ids.sizes();
  out.push_back(c.in(0).size(1));
  const Shape ist = contiguous_strides(ids.sizes());
  return {detail::ref_gather(c.in(0), out, [&](const Shape& oc) {
    int64_t flat = 0;
    for (size_t i = 0; i + 1 < oc.size(); ++i) flat += oc[i] * ist[i];
    return Shape{idx[static_cast<size_t>(flat)], oc.back()};
  })};
}

std::vector<OpCase> embedding_cases(int scale) {
  const int64_t s = scale;
  auto call = [](const Inputs& t, const EmbeddingArgs& a) { return Inputs{embedding(t[0], t[1], a.padding_idx)}; };
  std::vector<OpCase> cases = {
      make_case<EmbeddingArgs>("weight [6, 4], ids [2, 3] with repeats",
                               {case_randn({6, 4 * s}, 1), case_fixed(from_vector(std::vector<int64_t>{5, 0, 5, 2, 2, 1}, {2, 3}))}, {},
                               call),
      make_case<EmbeddingArgs>("weight [5, 3] transposed, i32 ids [4], padding_idx 2",
                               {case_randn({5, 3 * s}, 2, CaseLayout::transposed),
                                case_fixed(from_vector(std::vector<int64_t>{2, 4, 2, 0}, {4}).to(DType::i32))},
                               {2}, call),
      make_case<EmbeddingArgs>("weight [4, 2] strided, ids [] (0-d)",
                               {case_randn({4, 2 * s}, 3, CaseLayout::strided), case_fixed(scalar_tensor(3, TensorOptions(DType::i64)))}, {},
                               call),
  };
  cases[1].no_gradcheck = "padding_idx's row gets no gradient by definition (PyTorch's), not its derivative";
  return cases;
}
}  // namespace

namespace ops {
const OpDef& embedding_op() {
  static const OpDef d{.name = "embedding", .inputs = {"weight", "ids"}, .category = AutocastCategory::passthrough,
                       .kernels = detail::cpu_kernels(embedding_cpu, embedding_backward), .reference = embedding_reference,
                       .dtypes = detail::kFloatDTypes, .cases = embedding_cases,
                       .derivative = "scatter-add of g per id (f32/f64: row-sparse into the gradient it meets); padding row 0",
                       .file = "src/ops/embedding.cpp"};
  return d;
}
}  // namespace ops

Tensor embedding(const Tensor& weight, const Tensor& ids, std::optional<int64_t> padding_idx) {
  return call_op(ops::embedding_op(), {weight, ids}, EmbeddingArgs{padding_idx});
}

}  // namespace athanor
