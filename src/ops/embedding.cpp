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
#include "ops/op_utils.h"

namespace athanor {

Tensor embedding(const Tensor& weight, const Tensor& ids, std::optional<int64_t> padding_idx) {
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
  if (!any_requires_grad({weight})) return out;
  const DType dt = weight.dtype();
  return record(op, {weight}, out, [si = save(ic, "ids"), num, dim, n, pad, dt](const Node& node, const Grads& g) {
    const Tensor idc = si.unpack(node);
    // grad_weight[v, :] = sum over positions p with ids[p] == v of g[p, :]; row padding_idx stays 0.
    const DType work = dt == DType::f64 ? DType::f64 : DType::f32;
    const Tensor gc = detail::to_raw(g[0], work);
    if (work == dt) {
      // f32/f64 tables: hand the engine the rows (n of num) instead of a zero-filled [num, dim]
      // table; it adds them straight into the gradient they meet (a tied lm_head's, or .grad).
      node.emit_row_sparse(0, RowSparseGrad{make_view(idc, {n}, {1}, idc.storage_offset()),
                                            make_view(gc, {n, dim}, {dim, 1}, gc.storage_offset()), pad});
      return Grads{Tensor()};
    }
    Tensor gw = empty({num, dim}, TensorOptions(work));
    dispatch(work, [&]<class T>() {
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        if (idc.dtype() == DType::i64)
          cpu::index_add_3d<T, int64_t>(static_cast<const T*>(gc.raw_data()), idc.data_ptr<int64_t>(),
                                        static_cast<T*>(gw.raw_data()), 1, num, n, dim, pad);
        else
          cpu::index_add_3d<T, int32_t>(static_cast<const T*>(gc.raw_data()), idc.data_ptr<int32_t>(),
                                        static_cast<T*>(gw.raw_data()), 1, num, n, dim, pad);
      }
    });
    return Grads{detail::to_raw(gw, dt)};  // ids are integers: not an input of the node
  });
}

}  // namespace athanor
