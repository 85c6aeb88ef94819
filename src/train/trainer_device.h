#pragma once
// trainer.device (cpu | cuda | cuda:N): parsed and checked before any work.
#include <string>

#include "athanor/core/device.h"
#include "athanor/train/config.h"

namespace athanor {

// The device trainer.device names; an Error for a malformed value ("gpu", "cuda:x").
Device parse_trainer_device(const std::string& value);
// Errors before any work: a CUDA device that this build or this machine lacks (no GPU,
// cuda:7 on a one-GPU machine), and "not yet supported on cuda: <what>" for the parts of
// training that do not run on CUDA yet (the model's ops without a CUDA kernel, the
// optimizer step, clipping by value, several processes), so a run never starts and crashes later.
void check_trainer_device(const train::Config& config);
// What of this config's training does not run on CUDA yet, as the comma-separated list the
// "not yet supported on cuda" error names ("" when everything does): the model's ops without
// a CUDA kernel in this build (read from the registry, so it follows the kernels as they
// land), an optimizer without a device step (rmsprop, lamb, lars), optimizer.clip_value, and
// more than one process (no NCCL).
std::string cuda_training_gaps(const train::Config& config);

}  // namespace athanor
