// The trainer's view of its device: see device_runtime.h.
#include "train/device_runtime.h"

#include <iomanip>
#include <sstream>

#include "athanor/core/error.h"
#if ATHANOR_HAS_CUDA
#include "backend/cuda/device_allocator.h"
#include "backend/cuda/runtime.h"
#endif

namespace athanor::train {

#if ATHANOR_HAS_CUDA
namespace {
cuda::DeviceAllocator& allocator_of(Device d) {
  cuda::check_device(d.index, "trainer.device");
  return cuda::DeviceAllocator::get(d.index);
}
double gib(std::size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); }
}  // namespace

MemoryStats device_memory_stats(Device d) { return d.is_cpu() ? Allocator::cpu().stats() : allocator_of(d).stats(); }
void reset_device_memory_peak(Device d) { d.is_cpu() ? Allocator::cpu().reset_peak() : allocator_of(d).reset_peak(); }
void empty_device_cache(Device d) { d.is_cpu() ? Allocator::cpu().empty_cache() : allocator_of(d).empty_cache(); }

std::string device_memory_note(Device d) {
  if (d.is_cpu()) return "";
  cuda::DeviceAllocator& a = allocator_of(d);
  const cuda::MemInfo m = a.mem_info();
  std::ostringstream o;
  o << std::fixed << std::setprecision(2) << d.str() << " (" << cuda::device_info(d.index).name << "): " << gib(a.cached_bytes())
    << " GiB cached by the allocator, " << gib(m.free) << " of " << gib(m.total) << " GiB free on the device";
  return o.str();
}

void synchronize_device(Device d) {
  if (d.is_cpu()) return;
  cuda::DeviceGuard g(d.index);
  cuda::note_host_sync(d.index);
  ATH_CUDA(cudaStreamSynchronize(cuda::compute_stream(d.index)));
}

DevicePeak cuda_peak_flops(Device d, DType compute) {
  if (d.is_cpu()) return {};
  const std::string name = cuda::device_info(d.index).name;
  // Dense (no sparsity) SXM figures from NVIDIA's H100/H200 datasheets; the PCIe/NVL parts are lower.
  const bool hopper_sxm = (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) &&
                          name.find("PCIe") == std::string::npos && name.find("NVL") == std::string::npos;
  if (!hopper_sxm) return {0, name + ": no peak in the table (set observe.peak_gflops for MFU)"};
  if (compute == DType::bf16 || compute == DType::f16)
    return {989.4e12, name + " dense " + dtype_name(compute) + " tensor-core peak, 989.4 TFLOP/s"};
  return {66.9e12, name + " f32 (CUDA cores, TF32 off) peak, 66.9 TFLOP/s"};
}
#else
namespace {
[[noreturn]] void no_cuda(Device d) {
  ATH_FAIL("trainer.device", d.str(), " in a build without CUDA", Hint{"this is a bug: trainer.device is checked before any work"});
}
}  // namespace
MemoryStats device_memory_stats(Device d) {
  if (!d.is_cpu()) no_cuda(d);
  return Allocator::cpu().stats();
}
void reset_device_memory_peak(Device d) {
  if (!d.is_cpu()) no_cuda(d);
  Allocator::cpu().reset_peak();
}
void empty_device_cache(Device d) {
  if (!d.is_cpu()) no_cuda(d);
  Allocator::cpu().empty_cache();
}
std::string device_memory_note(Device d) {
  if (!d.is_cpu()) no_cuda(d);
  return "";
}
void synchronize_device(Device d) {
  if (!d.is_cpu()) no_cuda(d);
}
DevicePeak cuda_peak_flops(Device d, DType) {
  if (!d.is_cpu()) no_cuda(d);
  return {};
}
#endif

}  // namespace athanor::train
