#pragma once
// Shared pieces of the CUDA micro-benchmarks (bench/cuda_*.cpp): device buffers, random fills
// and the event timing of a call on the compute stream.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "athanor/core/dtype.h"
#include "athanor/core/half.h"
#include "backend/cuda/runtime.h"

namespace athanor::bench {

inline void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  ATH_CUDA(cudaMalloc(&p, bytes));
  return p;
}

// n values uniform in [-1, 1) of dt (f32, bf16 or f16), made on the host and copied (timings of
// zeros would flatter).
inline void fill_random(void* dev, int64_t n, DType dt, unsigned seed) {
  std::vector<float> h32(static_cast<std::size_t>(n));
  uint32_t s = seed * 2654435761u + 1;
  for (auto& x : h32) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / 8388608.0f - 1.0f;
  }
  if (dt == DType::f32) {
    ATH_CUDA(cudaMemcpy(dev, h32.data(), h32.size() * 4, cudaMemcpyHostToDevice));
    return;
  }
  std::vector<uint16_t> h16(h32.size());
  for (std::size_t i = 0; i < h32.size(); ++i) h16[i] = dt == DType::bf16 ? float_to_bf16_bits(h32[i]) : float_to_f16_bits(h32[i]);
  ATH_CUDA(cudaMemcpy(dev, h16.data(), h16.size() * 2, cudaMemcpyHostToDevice));
}

// ms per call of fn on `stream`: a warm-up, then `iters` calls between two events, the median of
// 3 such batches (fewer once `max_seconds` have passed since `start`).
class EventTimer {
 public:
  EventTimer(cudaStream_t stream, int iters, double max_seconds)
      : stream_(stream), iters_(iters), max_seconds_(max_seconds), start_(std::chrono::steady_clock::now()) {
    ATH_CUDA(cudaEventCreate(&e0_));
    ATH_CUDA(cudaEventCreate(&e1_));
  }
  ~EventTimer() {
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  template <class F> double ms(F&& fn) {
    fn();
    ATH_CUDA(cudaStreamSynchronize(stream_));
    std::vector<float> batches;
    for (int rep = 0; rep < 3; ++rep) {
      const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      if (rep > 0 && spent > max_seconds_) break;
      ATH_CUDA(cudaEventRecord(e0_, stream_));
      for (int i = 0; i < iters_; ++i) fn();
      ATH_CUDA(cudaEventRecord(e1_, stream_));
      ATH_CUDA(cudaEventSynchronize(e1_));
      float ms = 0;
      ATH_CUDA(cudaEventElapsedTime(&ms, e0_, e1_));
      batches.push_back(ms / static_cast<float>(iters_));
    }
    std::sort(batches.begin(), batches.end());
    return static_cast<double>(batches[batches.size() / 2]);
  }

 private:
  cudaStream_t stream_;
  int iters_;
  double max_seconds_;
  std::chrono::steady_clock::time_point start_;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
};

}  // namespace athanor::bench
