#pragma once
// The bytes copied from cuda:index to the host so far (every tensor read through the device
// hooks, src/backend/cuda/device_hooks.cpp): what a logged step reads back can be held to a
// bound (the observer's statistics read a few doubles per tensor, never the tensor;
// tests/gpu/test_gpu_stats.cpp). Beside runtime.h's host_sync_count, which counts the reads.
#include <cstdint>

namespace athanor::cuda {

void note_host_read_bytes(int index, std::uint64_t bytes);
std::uint64_t host_read_bytes(int index);

}  // namespace athanor::cuda
