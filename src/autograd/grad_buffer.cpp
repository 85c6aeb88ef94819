#include "grad_buffer.h"

#include "athanor/core/convert.h"
#include "athanor/core/device_hooks.h"
#include "athanor/core/error.h"
#include "athanor/core/storage.h"
#include "backend/cpu/index.h"

namespace athanor {

void add_into(Tensor& acc, const Tensor& g) {
  ATH_ASSERT(acc.is_contiguous());
  Tensor src = g;
  if (g.dtype() != acc.dtype() || !g.is_contiguous() || g.sizes() != acc.sizes()) {
    src = empty(acc.sizes(), TensorOptions(acc.dtype()).with_tag(MemTag::workspace).with_device(acc.device()));
    copy_into(src, g);
  }
  if (const Device d = acc.device(); !d.is_cpu()) {  // on the device: its kernel, in stream order
    require_device_hooks(d, "gradient accumulation")
        .add_into(acc.device_data(), src.device_data(), acc.dtype(), acc.numel(), d.index, "gradient accumulation");
    acc.bump_version();
    return;
  }
  dispatch(acc.dtype(), [&]<class T>() {
    T* a = static_cast<T*>(acc.raw_data());
    const T* b = static_cast<const T*>(src.raw_data());
    const int64_t n = acc.numel();
    if constexpr (is_half_v<T>) {
#pragma omp parallel for if (n > (1 << 16)) schedule(static)
      for (int64_t i = 0; i < n; ++i) a[i] = T(static_cast<float>(a[i]) + static_cast<float>(b[i]));
    } else if constexpr (std::is_same_v<T, bool>) {
      for (int64_t i = 0; i < n; ++i) a[i] = a[i] || b[i];
    } else {
#pragma omp parallel for simd if (n > (1 << 16)) schedule(static)
      for (int64_t i = 0; i < n; ++i) a[i] += b[i];
    }
  });
  acc.bump_version();
}

Tensor add_new(const Tensor& a, const Tensor& b) {
  Tensor out = empty(a.sizes(), TensorOptions(a.dtype()).with_device(a.device()));
  copy_into(out, a);
  add_into(out, b);
  return out;
}

bool exclusively_owned(const Tensor& t, long handles) {
  if (!t.defined() || t.impl_ptr().use_count() != handles || t.requires_grad()) return false;
  const auto& st = t.storage();
  return st && st.use_count() == 1 && st->owned() && t.storage_offset() == 0 && t.is_contiguous() &&
         st->nbytes() == t.nbytes();
}

bool rows_addable(const Tensor& dense, const RowSparseGrad& g) {
  return dense.is_contiguous() && (dense.dtype() == DType::f32 || dense.dtype() == DType::f64) &&
         g.rows.dtype() == dense.dtype() && g.rows.is_contiguous() &&
         (g.indices.dtype() == DType::i64 || g.indices.dtype() == DType::i32) && g.indices.is_contiguous() &&
         g.rows.numel() == g.indices.numel() * (dense.dim() == 0 ? 1 : dense.numel() / std::max<int64_t>(dense.size(0), 1));
}

void add_rows_into(Tensor& dense, const RowSparseGrad& g) {
  ATH_ASSERT(rows_addable(dense, g));
  const int64_t n = g.indices.numel(), inner = n == 0 ? 0 : g.rows.numel() / n;
  if (n == 0) return;
  dispatch(dense.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      const T* rows = static_cast<const T*>(g.rows.raw_data());
      T* d = static_cast<T*>(dense.raw_data());
      if (g.indices.dtype() == DType::i64)
        cpu::index_accumulate_rows<T, int64_t>(rows, g.indices.data_ptr<int64_t>(), d, n, inner, g.skip);
      else
        cpu::index_accumulate_rows<T, int32_t>(rows, g.indices.data_ptr<int32_t>(), d, n, inner, g.skip);
    }
  });
  dense.bump_version();
}

Tensor materialize_rows(Tensor dense, const std::vector<RowSparseGrad>& parts, const Shape& sizes, DType dtype) {
  const bool work_in_place = dtype == DType::f32 || dtype == DType::f64;
  const DType work = work_in_place ? dtype : DType::f32;  // half tables: sum in f32, round once
  Tensor acc;
  if (dense.defined() && work_in_place && exclusively_owned(dense)) acc = std::move(dense);
  else if (dense.defined()) {
    acc = empty(sizes, TensorOptions(work));
    copy_into(acc, dense);
  } else {
    acc = zeros(sizes, TensorOptions(work));
  }
  for (const RowSparseGrad& p : parts) {
    if (p.rows.dtype() == work && p.rows.is_contiguous()) {
      add_rows_into(acc, p);
    } else {
      RowSparseGrad c = p;
      c.rows = empty(p.rows.sizes(), TensorOptions(work).with_tag(MemTag::workspace));
      copy_into(c.rows, p.rows);
      add_rows_into(acc, c);
    }
  }
  if (acc.dtype() == dtype) return acc;
  Tensor out = empty(sizes, TensorOptions(dtype));
  copy_into(out, acc);
  return out;
}

}  // namespace athanor
