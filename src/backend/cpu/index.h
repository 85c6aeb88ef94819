#pragma once
// Indexing kernels over contiguous buffers viewed as [outer, dim, inner]
// (the indexed dimension in the middle), plus the row copy used by cat.
//
//   index_select_3d: out[o, j, :]    = x[o, idx[j], :]             idx: [n_idx]
//   index_add_3d:    gx[o, v, :]     = sum_{j : idx[j] == v} g[o, j, :]   (its adjoint)
//   gather_3d:       out[o, j, i]    = x[o, idx[o, j, i], i]       idx: [outer, n_idx, inner]
//   scatter_add_3d:  gx[o, idx[o,j,i], i] += g[o, j, i]            (its adjoint)
//   index_accumulate_rows: dst[v, :] += sum_{j : idx[j] == v} g[j, :]  (index_add_3d with
//                    outer = 1 added onto an existing buffer: a row-sparse gradient)
//
// Invariants:
//  - indices are trusted here (the ops validate them with first_out_of_range
//    and raise an Error naming the bad index before calling a kernel);
//  - the adjoint kernels write EVERY element of gx (zeros where nothing lands),
//    and are deterministic whatever the thread count: each output element is
//    summed by one thread, in increasing j. index_add_3d groups the positions
//    of each index value first (a counting sort), then parallelizes over the
//    output rows; scatter_add_3d parallelizes over (o, column block);
//  - forward kernels copy elements (any dtype); adjoint kernels are for float
//    and double (the ops run bf16/f16 gradients in f32 and round once).
#include <cstdint>

namespace athanor::cpu {

// Position of the first index outside [0, limit), or -1 when all are valid. I: int32_t, int64_t.
template <class I> int64_t first_out_of_range(const I* idx, int64_t n, int64_t limit);

// T: any element type; I: int32_t or int64_t.
template <class T, class I>
void index_select_3d(const T* x, const I* idx, T* out, int64_t outer, int64_t x_dim, int64_t n_idx, int64_t inner);
template <class T, class I>
void gather_3d(const T* x, const I* idx, T* out, int64_t outer, int64_t x_dim, int64_t n_idx, int64_t inner);

// T: float or double. Row `skip` (when >= 0) of gx is left zero (embedding's padding_idx).
template <class T, class I>
void index_add_3d(const T* g, const I* idx, T* gx, int64_t outer, int64_t x_dim, int64_t n_idx, int64_t inner,
                  int64_t skip = -1);
template <class T, class I>
void scatter_add_3d(const T* g, const I* idx, T* gx, int64_t outer, int64_t x_dim, int64_t n_idx, int64_t inner);
// Touches only the rows that idx names: each such row first sums its g rows from 0 in
// increasing j, then adds that sum to dst once, so the result is bit-identical to
// dst + index_add_3d(...) (the dense gradient it replaces). Rows equal to `skip` are ignored.
template <class T, class I>
void index_accumulate_rows(const T* g, const I* idx, T* dst, int64_t n_idx, int64_t inner, int64_t skip = -1);

// Copies `rows` rows of `row_bytes` bytes; row r starts at dst + r * dst_pitch and src + r * src_pitch (bytes).
void copy_rows(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t rows, int64_t row_bytes);

namespace ref {
// Naive loops in the obvious order (scatter kernels: zero-fill, then j-major accumulation).
template <class T, class I>
void index_select_3d(const T* x, const I* idx, T* out, int64_t outer, int64_t x_dim, int64_t n_idx, int64_t inner);
template <class T, class I>
void gather_3d(const T* x, const I* idx, T* out, int64_t outer, int64_t x_dim, int64_t n_idx, int64_t inner);
template <class T, class I>
void index_add_3d(const T* g, const I* idx, T* gx, int64_t outer, int64_t x_dim, int64_t n_idx, int64_t inner,
                  int64_t skip = -1);
template <class T, class I>
void scatter_add_3d(const T* g, const I* idx, T* gx, int64_t outer, int64_t x_dim, int64_t n_idx, int64_t inner);
template <class T, class I>
void index_accumulate_rows(const T* g, const I* idx, T* dst, int64_t n_idx, int64_t inner, int64_t skip = -1);
void copy_rows(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t rows, int64_t row_bytes);
}  // namespace ref

}  // namespace athanor::cpu
