// The next batch's upload overlaps the step on the device (issue 30; device_hooks.cpp):
//  - Tensor::to(cuda) from the host, issued while the compute stream is busy (a 400 ms host
//    function holds it, as a long kernel would), finishes on the copy stream before the
//    compute stream is free again (CUDA events), and a kernel queued after it reads its bytes;
//  - a copy_ into an existing tensor (compute-stream memory, maybe freed by queued work)
//    still waits for the compute stream: it finishes after the busy stretch;
//  - an upload's block, freed while the compute stream is still busy, is not handed to the
//    next upload before the compute stream passes the free (record_stream);
//  - every upload and download is counted by the host-sync counter only where it waits.
#include <chrono>
#include <thread>

#include "athanor/core/device_hooks.h"
#include "athanor/ops.h"
#include "gpu_test.h"

using namespace athanor;

namespace {

void CUDART_CB sleep_400ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(400)); }

struct Events {
  cudaEvent_t a = nullptr, b = nullptr;
  Events() {
    ATH_CUDA(cudaEventCreate(&a));
    ATH_CUDA(cudaEventCreate(&b));
  }
  ~Events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  float ms() const {  // b - a
    float t = 0;
    ATH_CUDA(cudaEventElapsedTime(&t, a, b));
    return t;
  }
};

std::vector<float> ramp(std::size_t n, float k) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = k + static_cast<float>(i % 1000);
  return v;
}

}  // namespace

TEST(GpuUpload, OverlapsTheBusyComputeStreamAndIsSeenByTheNextKernel) {
  ATH_REQUIRE_GPU();
  const cudaStream_t cs = cuda::compute_stream(0), xs = cuda::copy_stream(0);
  // Warm up with the same size: the context, a pinned buffer and a copy-stream block to reuse,
  // so the upload below calls neither cudaMallocHost nor cudaMalloc (either may wait).
  (void)from_vector(ramp(1 << 16, 0.0f), {1 << 16}).to(Device::cuda(0)).cpu();
  const std::vector<float> host = ramp(1 << 16, 3.0f);  // 256 KiB: a batch's size
  const Tensor h = from_vector(host, {1 << 16});
  const std::uint64_t syncs0 = device_hooks(DeviceType::cuda)->host_syncs(0);

  Events busy, up;
  ATH_CUDA(cudaEventRecord(busy.a, cs));
  ATH_CUDA(cudaLaunchHostFunc(cs, sleep_400ms, nullptr));  // the step still running
  ATH_CUDA(cudaEventRecord(busy.b, cs));
  ATH_CUDA(cudaEventRecord(up.a, xs));
  const Tensor d = h.to(Device::cuda(0));
  ATH_CUDA(cudaEventRecord(up.b, xs));
  EXPECT_EQ(device_hooks(DeviceType::cuda)->host_syncs(0), syncs0) << "an upload returns without waiting";
  // The upload's completion, seen from the host while the compute stream is still asleep.
  const auto t0 = std::chrono::steady_clock::now();
  while (cudaEventQuery(up.b) == cudaErrorNotReady) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300))
        << "the upload did not finish within 300 ms of a 400 ms busy compute stream: it waits for compute";
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  cudaGetLastError();
  EXPECT_EQ(cudaEventQuery(busy.b), cudaErrorNotReady) << "the compute stream was still busy when the upload finished";
  cudaGetLastError();
  // A kernel queued after to(cuda) reads the uploaded bytes (it runs after the busy stretch).
  const std::vector<double> back = mul(d, 2.0).cpu().to_vector();
  ASSERT_EQ(back.size(), host.size());
  for (std::size_t i = 0; i < host.size(); i += 997) ASSERT_EQ(back[i], 2.0 * host[i]) << "element " << i;
  float ahead = 0;  // from the upload's end to the busy stretch's end
  ATH_CUDA(cudaEventElapsedTime(&ahead, up.b, busy.b));
  EXPECT_GT(ahead, 50.0f) << "the upload ended only " << ahead << " ms before the compute stream was free";
}

TEST(GpuUpload, CopyIntoAnExistingTensorStillWaitsForCompute) {
  ATH_REQUIRE_GPU();
  const cudaStream_t cs = cuda::compute_stream(0), xs = cuda::copy_stream(0);
  Tensor d = zeros({1 << 14}, TensorOptions().with_device(Device::cuda(0)));
  const Tensor h = from_vector(ramp(1 << 14, 1.0f), {1 << 14});
  Events busy, up;
  ATH_CUDA(cudaEventRecord(busy.a, cs));
  ATH_CUDA(cudaLaunchHostFunc(cs, sleep_400ms, nullptr));
  ATH_CUDA(cudaEventRecord(busy.b, cs));
  ATH_CUDA(cudaEventRecord(up.a, xs));
  copy_into(d, h);  // d's block is the compute stream's
  ATH_CUDA(cudaEventRecord(up.b, xs));
  ATH_CUDA(cudaEventSynchronize(up.b));
  ATH_CUDA(cudaEventSynchronize(busy.b));
  float after_end = 0;
  ATH_CUDA(cudaEventElapsedTime(&after_end, busy.b, up.b));
  EXPECT_GE(after_end, 0.0f) << "a copy into compute-stream memory must wait for the compute queued before it";
  EXPECT_EQ(d.cpu().to_vector(), h.to_vector());
}

TEST(GpuUpload, AFreedUploadBlockIsNotReusedBeforeTheComputeStreamPassesTheFree) {
  ATH_REQUIRE_GPU();
  const cudaStream_t cs = cuda::compute_stream(0);
  const Tensor h1 = from_vector(ramp(1 << 14, 5.0f), {1 << 14});
  const Tensor h2 = from_vector(ramp(1 << 14, 9.0f), {1 << 14});
  Tensor out;
  void* first = nullptr;
  {
    const Tensor d1 = h1.to(Device::cuda(0));
    first = d1.device_data();
    ATH_CUDA(cudaLaunchHostFunc(cs, sleep_400ms, nullptr));
    out = mul(d1, 3.0);  // queued behind the sleep: reads d1 after the host has dropped it
  }
  const Tensor d2 = h2.to(Device::cuda(0));  // while the compute stream still sleeps
  EXPECT_NE(d2.device_data(), first) << "the block the queued kernel still reads was handed out again";
  EXPECT_EQ(out.cpu().to_vector(), mul(h1, 3.0).to_vector()) << "the queued kernel read overwritten bytes";
  EXPECT_EQ(d2.cpu().to_vector(), h2.to_vector());
  // Once the compute stream has passed the free, the next upload of that size may reuse it.
  const Tensor d3 = h2.to(Device::cuda(0));
  EXPECT_EQ(d3.cpu().to_vector(), h2.to_vector());
}
