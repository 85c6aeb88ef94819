// The pointwise passes of a GPT-2 124M step (src/backend/cuda/pointwise.h) at its sizes (B T =
// 16384 rows, d = 768, 4d = 3072), each timed with CUDA events on the compute stream with the
// generic kernel (candidate pointwise_vectorized off) and with the vectorized one (on):
//   cast f32 -> bf16 of a [B T, d] activation (layer_norm's output under autocast),
//   add f32 + bf16 -> f32 of [B T, d] (the residual add),
//   gelu_tanh bf16 and its backward over [B T, 4d] (gelu_linear's activation).
// Prints a table and one JSON line: per pass ms and GB/s (bytes read + written / time) both ways.
//
//   bench_cuda_pointwise [--rows 16384] [--d 768] [--iters 20]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <vector>

#include "athanor/core/dtype.h"
#include "athanor/core/error.h"
#include "backend/cuda/candidates.h"
#include "backend/cuda/pointwise.h"
#include "backend/cuda/runtime.h"
#include "cuda_bench.h"

using namespace athanor;

namespace {

struct Pass {
  const char* name;
  cuda::PointwiseOp op;
  DType in0, in1, out;
  int64_t n;
};

// ms per pass with the generic kernel (vectorized false) or the candidate: bench::EventTimer's
// median of 3 batches of `iters`.
double time_ms(const cuda::PointwiseArgs& a, bool vectorized, int iters, cudaStream_t s) {
  cuda::CandidateOverride o(cuda::Candidate::pointwise_vectorized, vectorized);
  bench::EventTimer timer(s, iters, 10.0);
  return timer.ms([&] { cuda::pointwise(a, s); });
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int64_t rows = 16384, d = 768;
    int iters = 20;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      ATH_CHECK(i + 1 < argc, "bench_cuda_pointwise", a, " needs a value",
                Hint{"usage: bench_cuda_pointwise [--rows 16384] [--d 768] [--iters 20]"});
      const std::string v = argv[++i];
      if (a == "--rows") rows = std::stoll(v);
      else if (a == "--d") d = std::stoll(v);
      else if (a == "--iters") iters = std::stoi(v);
      else ATH_FAIL("bench_cuda_pointwise", "unknown argument ", a,
                    Hint{"usage: bench_cuda_pointwise [--rows 16384] [--d 768] [--iters 20]"});
    }
    ATH_CHECK(rows > 0 && d > 0 && iters > 0, "bench_cuda_pointwise", "sizes and --iters must be positive");
    cuda::require_device(0, "bench_cuda_pointwise");
    const cudaStream_t s = cuda::compute_stream(0);
    const std::vector<Pass> passes = {
        {"cast_f32_bf16", cuda::PointwiseOp::copy, DType::f32, DType::f32, DType::bf16, rows * d},
        {"add_f32_bf16", cuda::PointwiseOp::add, DType::f32, DType::bf16, DType::f32, rows * d},
        {"gelu_tanh_bf16", cuda::PointwiseOp::gelu_tanh, DType::bf16, DType::bf16, DType::bf16, rows * 4 * d},
        {"gelu_tanh_backward_bf16", cuda::PointwiseOp::gelu_tanh_backward, DType::bf16, DType::bf16, DType::bf16,
         rows * 4 * d},
    };
    std::string json = "{\"bench\":\"cuda_pointwise\",\"device\":\"" + cuda::device_info(0).name + "\",\"passes\":[";
    std::printf("%-26s %12s %10s %10s %10s %10s %8s\n", "pass", "elements", "generic ms", "GB/s", "vector ms", "GB/s", "speedup");
    for (std::size_t p = 0; p < passes.size(); ++p) {
      const Pass& q = passes[p];
      cuda::PointwiseArgs a;
      a.op = q.op;
      a.ndim = 1;
      a.sizes[0] = q.n;
      a.n_in = cuda::pointwise_arity(q.op);
      std::vector<void*> bufs;
      std::size_t bytes = 0;
      for (int k = 0; k < a.n_in; ++k) {
        const DType dt = k == 0 ? q.in0 : q.in1;
        const std::size_t nb = static_cast<std::size_t>(q.n) * dtype_size(dt);
        void* b = nullptr;
        ATH_CUDA(cudaMalloc(&b, nb));
        ATH_CUDA(cudaMemset(b, 0x3c, nb));  // finite values in every dtype (0x3c3c... ~ 0.01 to 1.0)
        bufs.push_back(b);
        a.in[k].data = b, a.in[k].dtype = dt, a.in[k].strides[0] = 1, a.in[k].contiguous = true;
        bytes += nb;
      }
      const std::size_t out_bytes = static_cast<std::size_t>(q.n) * dtype_size(q.out);
      ATH_CUDA(cudaMalloc(&a.out, out_bytes));
      bufs.push_back(a.out);
      a.out_dtype = q.out;
      bytes += out_bytes;
      const double g = time_ms(a, false, iters, s), v = time_ms(a, true, iters, s);
      const double gg = bytes / g / 1e6, vg = bytes / v / 1e6;
      const char* kernel = cuda::plan_pointwise(a, true).kernel == cuda::PointwiseKernel::generic ? "generic" : "vectorized";
      std::printf("%-26s %12lld %10.3f %10.0f %10.3f %10.0f %7.2fx%s\n", q.name, static_cast<long long>(q.n), g, gg, v, vg,
                  g / v, kernel[0] == 'g' ? "  (the candidate took the generic kernel)" : "");
      char buf[400];
      std::snprintf(buf, sizeof buf,
                    "%s{\"pass\":\"%s\",\"elements\":%lld,\"bytes\":%zu,\"generic_ms\":%.4f,\"generic_gbps\":%.1f,"
                    "\"vectorized_ms\":%.4f,\"vectorized_gbps\":%.1f,\"candidate_kernel\":\"%s\"}",
                    p ? "," : "", q.name, static_cast<long long>(q.n), bytes, g, gg, v, vg, kernel);
      json += buf;
      for (void* b : bufs) ATH_CUDA(cudaFree(b));
    }
    std::printf("%s]}\n", json.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
