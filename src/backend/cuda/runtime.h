#pragma once
// The CUDA device runtime: errors, devices, streams. Every CUDA or cuBLAS call in the
// backend goes through ATH_CUDA / ATH_CUBLAS, which turn a failure into an athanor::Error
// naming the call, the file:line, the runtime's own words and what to do.
//
// Invariants:
//  - device_count() never throws: no driver, no device or a broken install all read as 0,
//    and no_device_reason() says which (for the gpu tests' skip messages);
//  - require_device(i) is the check given before any work: "no CUDA device" and
//    "cuda:7 on a one-GPU machine" are errors there, not failures of a later kernel;
//  - each device has one compute stream and one copy stream (non-blocking, created on
//    first use, never destroyed: they live as long as the process).
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace athanor::cuda {

[[noreturn]] void fail_cuda(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void fail_cublas(cublasStatus_t st, const char* call, const char* file, int line);

int device_count();
std::string no_device_reason();  // "" when a device is present
// Throws (op `op`) unless cuda:index exists; leaves the current device as it is.
void check_device(int index, const char* op = "cuda");
// check_device, then makes cuda:index the current device.
void require_device(int index, const char* op = "cuda");

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  std::size_t total_memory = 0;
  std::size_t l2_bytes = 0;
  std::size_t smem_per_block_optin = 0;
  int driver_version = 0, runtime_version = 0;  // as 13000 = 13.0
};
DeviceInfo device_info(int index);
std::string describe(const DeviceInfo& d);  // one line: name, cc, SMs, memory, driver, runtime

struct MemInfo {
  std::size_t free = 0, total = 0;
};
MemInfo mem_info(int index);

cudaStream_t compute_stream(int index);
cudaStream_t copy_stream(int index);

// The host synchronisations with cuda:index so far: every device-to-host copy and every
// stream, event or device synchronize the backend makes counts one (note_host_sync at each).
// A training step that logs nothing makes none (tests/gpu/test_gpu_train_sync.cpp).
void note_host_sync(int index);
std::uint64_t host_sync_count(int index);

// Makes `index` the current device for the scope (restores the previous one).
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
 private:
  int prev_ = 0;
};

// One checked launch: after <<<>>>, the launch error (bad configuration) is an Error.
void check_launch(const char* kernel, const char* file, int line);

}  // namespace athanor::cuda

#define ATH_CUDA(call)                                                                  \
  do {                                                                                  \
    const cudaError_t ath_err_ = (call);                                                \
    if (ath_err_ != cudaSuccess) ::athanor::cuda::fail_cuda(ath_err_, #call, __FILE__, __LINE__); \
  } while (0)
#define ATH_CUBLAS(call)                                                                \
  do {                                                                                  \
    const cublasStatus_t ath_st_ = (call);                                              \
    if (ath_st_ != CUBLAS_STATUS_SUCCESS) ::athanor::cuda::fail_cublas(ath_st_, #call, __FILE__, __LINE__); \
  } while (0)
#define ATH_CUDA_LAUNCHED(kernel) ::athanor::cuda::check_launch(kernel, __FILE__, __LINE__)
