// Indexing kernels (see index.h for the layouts and invariants).
#include "backend/cpu/index.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "athanor/core/convert.h"
#include "backend/cpu/workspace.h"

namespace athanor::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 15;  // elements below which threads cost more than they save
constexpr int64_t kBlock = 256;            // columns per scatter_add task
}  // namespace

template <class I> int64_t first_out_of_range(const I* idx, int64_t n, int64_t limit) {
  int64_t first = n;
#pragma omp parallel for reduction(min : first) if (n > (1 << 16)) schedule(static)
  for (int64_t j = 0; j < n; ++j)
    if (idx[j] < 0 || static_cast<int64_t>(idx[j]) >= limit) first = std::min(first, j);
  return first == n ? -1 : first;
}

template <class T, class I>
void index_select_3d(const T* x, const I* idx, T* out, int64_t outer, int64_t x_dim, int64_t n_idx, int64_t inner) {
#pragma omp parallel for collapse(2) if (outer * n_idx * inner > kParallelMin) schedule(static)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < n_idx; ++j) {
      const T* src = x + (o * x_dim + static_cast<int64_t>(idx[j])) * inner;
      std::copy(src, src + inner, out + (o * n_idx + j) * inner);
    }
}

template <class T, class I>
void gather_3d(const T* x, const I* idx, T* out, int64_t outer, int64_t x_dim, int64_t n_idx, int64_t inner) {
#pragma omp parallel for collapse(2) if (outer * n_idx * inner > kParallelMin) schedule(static)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < n_idx; ++j) {
      const I* ip = idx + (o * n_idx + j) * inner;
      T* dst = out + (o * n_idx + j) * inner;
      const T* xb = x + o * x_dim * inner;
      for (int64_t i = 0; i < inner; ++i) dst[i] = xb[static_cast<int64_t>(ip[i]) * inner + i];
    }
}

template <class T, class I>
void index_add_3d(const T* g, const I* idx, T* gx, int64_t outer, int64_t x_dim, int64_t n_idx, int64_t inner,
                  int64_t skip) {
  // Counting sort of the positions by index value (stable: increasing j within a value).
  // Scratch from the allocator (MemTag::workspace): no system allocation in a warm step.
  const Workspace ws(static_cast<std::size_t>(2 * (x_dim + 1) + n_idx) * sizeof(int64_t));
  int64_t* start = ws.as<int64_t>();
  int64_t* fill = start + x_dim + 1;
  int64_t* pos = fill + x_dim + 1;
  std::fill(start, start + x_dim + 1, int64_t{0});
  for (int64_t j = 0; j < n_idx; ++j) ++start[static_cast<int64_t>(idx[j]) + 1];
  for (int64_t v = 0; v < x_dim; ++v) start[v + 1] += start[v];
  std::copy(start, start + x_dim, fill);
  for (int64_t j = 0; j < n_idx; ++j) pos[fill[static_cast<int64_t>(idx[j])]++] = j;
  // Each output row is owned by one thread and summed in increasing j: deterministic.
#pragma omp parallel for collapse(2) if (outer * (x_dim + n_idx) * inner > kParallelMin) schedule(dynamic, 16)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t v = 0; v < x_dim; ++v) {
      T* dst = gx + (o * x_dim + v) * inner;
      std::fill(dst, dst + inner, T(0));
      if (v == skip) continue;
      for (int64_t p = start[v]; p < start[v + 1]; ++p) {
        const T* src = g + (o * n_idx + pos[p]) * inner;
#pragma omp simd
        for (int64_t i = 0; i < inner; ++i) dst[i] += src[i];
      }
    }
}

template <class T, class I>
void scatter_add_3d(const T* g, const I* idx, T* gx, int64_t outer, int64_t x_dim, int64_t n_idx, int64_t inner) {
  // Columns (o, i) are independent: a task owns a block of columns of one o.
  const int64_t nblocks = (inner + kBlock - 1) / kBlock;
#pragma omp parallel for collapse(2) if (outer * (x_dim + n_idx) * inner > kParallelMin) schedule(static)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t i0 = b * kBlock, i1 = std::min(inner, i0 + kBlock);
      T* gb = gx + o * x_dim * inner;
      for (int64_t v = 0; v < x_dim; ++v) std::fill(gb + v * inner + i0, gb + v * inner + i1, T(0));
      for (int64_t j = 0; j < n_idx; ++j) {
        const I* ip = idx + (o * n_idx + j) * inner;
        const T* src = g + (o * n_idx + j) * inner;
        for (int64_t i = i0; i < i1; ++i) gb[static_cast<int64_t>(ip[i]) * inner + i] += src[i];
      }
    }
}

template <class T, class I>
void index_accumulate_rows(const T* g, const I* idx, T* dst, int64_t n_idx, int64_t inner, int64_t skip) {
  // Positions sorted by (index, j): a group per distinct row, cost O(n log n) whatever the table size.
  // Scratch (positions, group starts, one row sum per thread) from the allocator, before the
  // parallel region: no system allocation in a warm step.
  const int threads = omp_get_max_threads();
  const Workspace ws(static_cast<std::size_t>(2 * n_idx + 1) * sizeof(int64_t) + static_cast<std::size_t>(threads * inner) * sizeof(T));
  int64_t* pos = ws.as<int64_t>();
  int64_t* group = pos + n_idx;  // start of each group in pos, plus the end
  T* sums = reinterpret_cast<T*>(group + n_idx + 1);
  for (int64_t j = 0; j < n_idx; ++j) pos[j] = j;
  std::stable_sort(pos, pos + n_idx, [&](int64_t a, int64_t b) { return idx[a] < idx[b]; });
  int64_t ngroups = 0;
  for (int64_t p = 0; p < n_idx; ++p)
    if (p == 0 || idx[pos[p]] != idx[pos[p - 1]]) group[ngroups++] = p;
  group[ngroups] = n_idx;
#pragma omp parallel if (n_idx * inner > kParallelMin)
  {
    T* sum = sums + static_cast<int64_t>(omp_get_thread_num()) * inner;
#pragma omp for schedule(static)
    for (int64_t gi = 0; gi < ngroups; ++gi) {
      const int64_t v = static_cast<int64_t>(idx[pos[group[gi]]]);
      if (v == skip) continue;
      std::fill(sum, sum + inner, T(0));  // summed from 0 like the dense kernel, then added once
      for (int64_t p = group[gi]; p < group[gi + 1]; ++p) {
        const T* src = g + pos[p] * inner;
#pragma omp simd
        for (int64_t i = 0; i < inner; ++i) sum[i] += src[i];
      }
      T* d = dst + v * inner;
#pragma omp simd
      for (int64_t i = 0; i < inner; ++i) d[i] += sum[i];
    }
  }
}

void copy_rows(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t rows, int64_t row_bytes) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (row_bytes == dst_pitch && row_bytes == src_pitch) {  // one contiguous block
    std::memcpy(d, s, static_cast<size_t>(rows * row_bytes));
    return;
  }
#pragma omp parallel for if (rows * row_bytes > (1 << 20)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) std::memcpy(d + r * dst_pitch, s + r * src_pitch, static_cast<size_t>(row_bytes));
}

namespace ref {
template <class T, class I>
void index_select_3d(const T* x, const I* idx, T* out, int64_t outer, int64_t x_dim, int64_t n_idx, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < n_idx; ++j)
      for (int64_t i = 0; i < inner; ++i) out[(o * n_idx + j) * inner + i] = x[(o * x_dim + idx[j]) * inner + i];
}

template <class T, class I>
void gather_3d(const T* x, const I* idx, T* out, int64_t outer, int64_t x_dim, int64_t n_idx, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < n_idx; ++j)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t e = (o * n_idx + j) * inner + i;
        out[e] = x[(o * x_dim + idx[e]) * inner + i];
      }
}

template <class T, class I>
void index_add_3d(const T* g, const I* idx, T* gx, int64_t outer, int64_t x_dim, int64_t n_idx, int64_t inner,
                  int64_t skip) {
  std::fill(gx, gx + outer * x_dim * inner, T(0));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < n_idx; ++j) {
      if (idx[j] == skip) continue;
      for (int64_t i = 0; i < inner; ++i) gx[(o * x_dim + idx[j]) * inner + i] += g[(o * n_idx + j) * inner + i];
    }
}

template <class T, class I>
void scatter_add_3d(const T* g, const I* idx, T* gx, int64_t outer, int64_t x_dim, int64_t n_idx, int64_t inner) {
  std::fill(gx, gx + outer * x_dim * inner, T(0));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < n_idx; ++j)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t e = (o * n_idx + j) * inner + i;
        gx[(o * x_dim + idx[e]) * inner + i] += g[e];
      }
}

template <class T, class I>
void index_accumulate_rows(const T* g, const I* idx, T* dst, int64_t n_idx, int64_t inner, int64_t skip) {
  // The dense gradient, then one add: the definition the fast kernel must match bit for bit.
  int64_t rows = 0;
  for (int64_t j = 0; j < n_idx; ++j) rows = std::max<int64_t>(rows, static_cast<int64_t>(idx[j]) + 1);
  std::vector<T> dense(rows * inner, T(0));
  for (int64_t j = 0; j < n_idx; ++j) {
    if (idx[j] == skip) continue;
    for (int64_t i = 0; i < inner; ++i) dense[idx[j] * inner + i] += g[j * inner + i];
  }
  for (int64_t e = 0; e < rows * inner; ++e) dst[e] += dense[e];
}

void copy_rows(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t rows, int64_t row_bytes) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < row_bytes; ++b) d[r * dst_pitch + b] = s[r * src_pitch + b];
}
}  // namespace ref

template int64_t first_out_of_range<int32_t>(const int32_t*, int64_t, int64_t);
template int64_t first_out_of_range<int64_t>(const int64_t*, int64_t, int64_t);

#define ATHANOR_INSTANTIATE_COPY_KERNELS(T, I)                                                         \
  template void index_select_3d<T, I>(const T*, const I*, T*, int64_t, int64_t, int64_t, int64_t);     \
  template void gather_3d<T, I>(const T*, const I*, T*, int64_t, int64_t, int64_t, int64_t);           \
  template void ref::index_select_3d<T, I>(const T*, const I*, T*, int64_t, int64_t, int64_t, int64_t); \
  template void ref::gather_3d<T, I>(const T*, const I*, T*, int64_t, int64_t, int64_t, int64_t);
#define ATHANOR_INSTANTIATE_ADD_KERNELS(T, I)                                                                  \
  template void index_add_3d<T, I>(const T*, const I*, T*, int64_t, int64_t, int64_t, int64_t, int64_t);       \
  template void scatter_add_3d<T, I>(const T*, const I*, T*, int64_t, int64_t, int64_t, int64_t);              \
  template void ref::index_add_3d<T, I>(const T*, const I*, T*, int64_t, int64_t, int64_t, int64_t, int64_t);  \
  template void ref::scatter_add_3d<T, I>(const T*, const I*, T*, int64_t, int64_t, int64_t, int64_t);            \
  template void index_accumulate_rows<T, I>(const T*, const I*, T*, int64_t, int64_t, int64_t);                \
  template void ref::index_accumulate_rows<T, I>(const T*, const I*, T*, int64_t, int64_t, int64_t);
#define ATHANOR_INSTANTIATE_INDEX(I)            \
  ATHANOR_INSTANTIATE_COPY_KERNELS(float, I)    \
  ATHANOR_INSTANTIATE_COPY_KERNELS(double, I)   \
  ATHANOR_INSTANTIATE_COPY_KERNELS(bfloat16, I) \
  ATHANOR_INSTANTIATE_COPY_KERNELS(float16, I)  \
  ATHANOR_INSTANTIATE_COPY_KERNELS(int32_t, I)  \
  ATHANOR_INSTANTIATE_COPY_KERNELS(int64_t, I)  \
  ATHANOR_INSTANTIATE_COPY_KERNELS(uint8_t, I)  \
  ATHANOR_INSTANTIATE_COPY_KERNELS(bool, I)     \
  ATHANOR_INSTANTIATE_ADD_KERNELS(float, I)     \
  ATHANOR_INSTANTIATE_ADD_KERNELS(double, I)
ATHANOR_INSTANTIATE_INDEX(int32_t)
ATHANOR_INSTANTIATE_INDEX(int64_t)
#undef ATHANOR_INSTANTIATE_INDEX
#undef ATHANOR_INSTANTIATE_ADD_KERNELS
#undef ATHANOR_INSTANTIATE_COPY_KERNELS

}  // namespace athanor::cpu
