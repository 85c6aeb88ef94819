#pragma once
// C = A B (f32, row-major, no transposes) with the rows of A and C cut into one block
// per thread: each thread runs a single-threaded sgemm (gemm_tile) on its rows, then
// epilogue(r0, rows) on them while they are still in its cache. For the backward's
// dx = g W of a linear layer: each thread's g and dx rows never leave its core. Against
// one GEMM over all rows on both threads (a matmul primitive) followed by an elementwise
// pass, that measured faster at batch-sized M (the MLP's fc2; bench/RESULTS.md has the
// figures).
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <exception>

#include "backend/cpu/gemm.h"

namespace athanor::cpu {

// threads: how many blocks (1 runs on the calling thread). Exceptions thrown by the
// sgemm or the epilogue are rethrown after the parallel region. `packed`: B also in its
// packed layout (weight_packing.h; `packed_b`), then each block runs a single-threaded
// matmul primitive on it (gemm_packed) instead of an sgemm that packs B itself.
template <class Epilogue>
void gemm_row_blocks(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                     int64_t ldc, int64_t threads, const Epilogue& epilogue, const PackedLayout* packed = nullptr,
                     const float* packed_b = nullptr) {
  if (M == 0) return;
  const int64_t rows = (M + threads - 1) / threads, nblocks = (M + rows - 1) / rows;
  std::exception_ptr error;  // exceptions must not cross the OpenMP region
#pragma omp parallel for schedule(static) if (nblocks > 1)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t r0 = blk * rows, n = std::min(rows, M - r0);
    try {
      if (!packed || !gemm_packed<float>(n, A + r0 * lda, lda, *packed, packed_b, nullptr, C + r0 * ldc, ldc))
        gemm_tile(false, false, n, N, K, 1.0f, A + r0 * lda, lda, B, ldb, 0.0f, C + r0 * ldc, ldc);
      epilogue(r0, n);
    } catch (...) {
#pragma omp critical(athanor_gemm_row_blocks_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace athanor::cpu
