#pragma once
// The training batches on the trainer's device (trainer.device; DESIGN.md "GPUs"):
//
//   BatchFeed feed(loader, device, prefetch);
//   FedStep s = feed.take(accum);   // the step's micro-batches: s.host (for statistics), s.device
//   ... queue the step's forward, backward and update ...
//   feed.prefetch(accum);           // the next step's batches fetched and uploaded now
//
// An upload (Tensor::to(cuda)) stages the bytes in pinned memory and copies them on the
// device's copy stream, ordered before the compute stream's later work; the host returns as
// soon as the bytes are staged. So a prefetch issued after the step's update is queued runs
// its copies while the device still computes that step: the next step finds its batches on
// the device. On the cpu the "upload" is the batch itself (no copy), through the same calls.
//
// Invariants:
//  - position() is that of the next batch a step will train on, prefetched ones not
//    counted: a checkpoint saved between steps resumes exactly where the uninterrupted run
//    would continue, with or without a prefetch in hand;
//  - set_position() (resume, rollback) drops what was prefetched;
//  - a loader error met while prefetching (a sample that fails to load) is thrown by the
//    take() of the step that would have trained on it, as without prefetching.
#include <cstdint>
#include <exception>
#include <optional>
#include <vector>

#include "athanor/core/device.h"
#include "athanor/data/dataloader.h"

namespace athanor::train {

// b with its input and target on `device` (b itself when they are there already).
data::Batch batch_to_device(const data::Batch& b, Device device);

struct FedStep {
  std::vector<data::Batch> host;    // as the loader made them
  std::vector<data::Batch> device;  // the same on the trainer's device (the same tensors on cpu)
  double wait_seconds = 0;          // time spent fetching and uploading them (the step's data time)
};

class BatchFeed {
 public:
  BatchFeed(data::DataLoader& loader, Device device, bool prefetch);
  // The next `accum` micro-batches: the prefetched ones, or fetched and uploaded now.
  FedStep take(int64_t accum);
  // With prefetching on (else nothing): fetches and uploads the next step's `accum` batches.
  void prefetch(int64_t accum);
  data::LoaderPosition position() const;
  void set_position(data::LoaderPosition p);
  Device device() const { return device_; }
  bool prefetching() const { return prefetch_; }
  bool has_prefetched() const { return ahead_.has_value() || error_ != nullptr; }

 private:
  FedStep fetch(int64_t accum);
  data::DataLoader& loader_;
  Device device_;
  bool prefetch_;
  std::optional<FedStep> ahead_;
  std::exception_ptr error_;       // from a prefetch that failed, thrown by the next take()
  data::LoaderPosition ahead_from_;  // the loader's position before the prefetch
};

}  // namespace athanor::train
