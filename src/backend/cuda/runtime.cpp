#include "backend/cuda/runtime.h"
#include "backend/cuda/host_reads.h"

#include <array>
#include <atomic>
#include <cstdio>
#include <mutex>

#include "athanor/core/error.h"

namespace athanor::cuda {

namespace {
const char* cuda_hint(cudaError_t err) {
  switch (err) {
    case cudaErrorMemoryAllocation:
      return "the GPU is out of memory: lower the batch size, use bf16 autocast or activation checkpointing";
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return "no usable GPU: check nvidia-smi and that the driver supports this CUDA runtime, or run on cpu";
    case cudaErrorInvalidDevice:
      return "the device index is past the GPUs this process sees (CUDA_VISIBLE_DEVICES)";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
      return "a kernel read or wrote out of bounds; rerun with CUDA_LAUNCH_BLOCKING=1 (and compute-sanitizer) to find it";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return "this build has no code for this GPU: rebuild with its architecture in CMAKE_CUDA_ARCHITECTURES";
    default:
      return "rerun with CUDA_LAUNCH_BLOCKING=1 so that the failing call is the one reported";
  }
}
const char* cublas_status_name(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "an unknown cuBLAS status";
  }
}
constexpr int kMaxDevices = 64;
}  // namespace

void fail_cuda(cudaError_t err, const char* call, const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error so the next call does not report it again
  detail::throw_error("cuda", file, line,
                      {std::string(call) + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")",
                       cuda_hint(err)});
}

void fail_cublas(cublasStatus_t st, const char* call, const char* file, int line) {
  detail::throw_error("cublas", file, line,
                      {std::string(call) + " failed: " + cublas_status_name(st),
                       st == CUBLAS_STATUS_NOT_SUPPORTED
                           ? "cuBLASLt has no algorithm for this shape/dtype/layout combination; check the "
                             "dtypes and that the leading dimensions are multiples of 16 bytes"
                           : "rerun with CUBLASLT_LOG_LEVEL=5 to see cuBLASLt's own account of the failure"});
}

namespace {
struct Probe {
  int count = 0;
  std::string reason;
};
const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      cudaGetLastError();
      r.reason = std::string("cudaGetDeviceCount returned ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
    } else if (n == 0) {
      r.reason = "cudaGetDeviceCount returned 0 devices";
    }
    r.count = err == cudaSuccess ? n : 0;
    return r;
  }();
  return p;
}
}  // namespace

int device_count() { return probe().count; }
std::string no_device_reason() { return probe().count > 0 ? "" : "no CUDA device: " + probe().reason; }

void check_device(int index, const char* op) {
  const int n = device_count();
  ATH_CHECK(n > 0, op, "cuda:", index, " was asked for, but this machine has no usable CUDA device (",
            probe().reason, ")", Hint{"run on cpu (trainer.device: cpu), or check nvidia-smi and the driver"});
  ATH_CHECK(index >= 0 && index < n, op, "cuda:", index, " was asked for, but this machine has ", n,
            " CUDA device", n == 1 ? "" : "s", " (cuda:0", n > 1 ? " .. cuda:" + std::to_string(n - 1) : std::string(),
            ")", Hint{"use a device index below the device count, or check CUDA_VISIBLE_DEVICES"});
}

void require_device(int index, const char* op) {
  check_device(index, op);
  ATH_CUDA(cudaSetDevice(index));
}

DeviceInfo device_info(int index) {
  check_device(index, "cuda device_info");
  cudaDeviceProp p{};
  ATH_CUDA(cudaGetDeviceProperties(&p, index));
  DeviceInfo d;
  d.index = index;
  d.name = p.name;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.sm_count = p.multiProcessorCount;
  d.total_memory = p.totalGlobalMem;
  d.l2_bytes = static_cast<std::size_t>(p.l2CacheSize);
  d.smem_per_block_optin = p.sharedMemPerBlockOptin;
  ATH_CUDA(cudaDriverGetVersion(&d.driver_version));
  ATH_CUDA(cudaRuntimeGetVersion(&d.runtime_version));
  return d;
}

std::string describe(const DeviceInfo& d) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "cuda:%d %s (sm_%d%d, %d SMs, %.1f GiB), driver %d.%d, CUDA runtime %d.%d, cuBLASLt %zu",
                d.index, d.name.c_str(), d.cc_major, d.cc_minor, d.sm_count, d.total_memory / 1073741824.0,
                d.driver_version / 1000, d.driver_version % 1000 / 10, d.runtime_version / 1000,
                d.runtime_version % 1000 / 10, cublasLtGetVersion());
  return buf;
}

MemInfo mem_info(int index) {
  DeviceGuard g(index);
  MemInfo m;
  ATH_CUDA(cudaMemGetInfo(&m.free, &m.total));
  return m;
}

namespace {
struct Streams {
  std::once_flag once;
  cudaStream_t compute = nullptr, copy = nullptr;
};
Streams& streams(int index) {
  check_device(index, "cuda stream");
  static std::array<Streams, kMaxDevices> all;
  ATH_CHECK(index < kMaxDevices, "cuda stream", "cuda:", index, " is past the ", kMaxDevices, " devices supported",
            Hint{"restrict CUDA_VISIBLE_DEVICES to the GPUs this process uses"});
  Streams& s = all[index];
  std::call_once(s.once, [&] {
    DeviceGuard g(index);
    ATH_CUDA(cudaStreamCreateWithFlags(&s.compute, cudaStreamNonBlocking));
    ATH_CUDA(cudaStreamCreateWithFlags(&s.copy, cudaStreamNonBlocking));
  });
  return s;
}
}  // namespace

cudaStream_t compute_stream(int index) { return streams(index).compute; }
cudaStream_t copy_stream(int index) { return streams(index).copy; }

namespace {
std::atomic<std::uint64_t>& sync_counter(int index) {
  static std::array<std::atomic<std::uint64_t>, 64> all{};
  return all.at(static_cast<std::size_t>(index));
}
}  // namespace
void note_host_sync(int index) { sync_counter(index).fetch_add(1, std::memory_order_relaxed); }
std::uint64_t host_sync_count(int index) { return sync_counter(index).load(std::memory_order_relaxed); }
namespace {
std::atomic<std::uint64_t>& read_bytes_counter(int index) {
  static std::array<std::atomic<std::uint64_t>, 64> all{};
  return all.at(static_cast<std::size_t>(index));
}
}  // namespace
void note_host_read_bytes(int index, std::uint64_t bytes) {
  read_bytes_counter(index).fetch_add(bytes, std::memory_order_relaxed);
}
std::uint64_t host_read_bytes(int index) { return read_bytes_counter(index).load(std::memory_order_relaxed); }

DeviceGuard::DeviceGuard(int index) {
  ATH_CUDA(cudaGetDevice(&prev_));
  if (prev_ != index) require_device(index, "cuda");
}
DeviceGuard::~DeviceGuard() { cudaSetDevice(prev_); }

void check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) fail_cuda(err, kernel, file, line);
}

}  // namespace athanor::cuda
