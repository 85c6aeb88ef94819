#pragma once
// DataLoader: batches from a sampler, filled by worker threads into a bounded
// prefetch queue. For a given seed the batches and their order are the same
// whatever the number of workers (batch k is always built from the sampler's
// k-th slice; workers only change who builds it). Shuffling is a pure function
// of (seed, epoch). The position (epoch, batch index) is resumable.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "athanor/data/dataset.h"

namespace athanor::data {

struct LoaderPosition {
  int64_t epoch = 0;
  int64_t batch = 0;  // next batch index within the epoch
  bool operator==(const LoaderPosition&) const = default;
};

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The order of dataset indices for an epoch.
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
};
std::shared_ptr<Sampler> sequential_sampler(int64_t n);
std::shared_ptr<Sampler> random_sampler(int64_t n, uint64_t seed);  // Philox-keyed shuffle per (seed, epoch)

struct LoaderOptions {
  int64_t batch_size = 32;
  bool shuffle = true;
  bool drop_last = true;
  int num_workers = 2;
  int prefetch = 4;   // batches buffered ahead
  uint64_t seed = 0;
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<Dataset> dataset, LoaderOptions options, std::shared_ptr<Sampler> sampler = nullptr);
  ~DataLoader();  // stops and joins workers
  // The next batch; at the end of an epoch it moves on to the next epoch (and
  // reshuffles), so training can count steps rather than epochs. A failure while
  // building the batch (e.g. a Dataset::get that throws, in a worker or not) is
  // thrown here as an Error naming the sample; the position then moves past it.
  Batch next();
  int64_t batches_per_epoch() const;
  LoaderPosition position() const;      // of the next batch next() returns
  void set_position(LoaderPosition p);  // resume
  const Dataset& dataset() const { return *dataset_; }

 private:
  void start();
  void stop();
  std::shared_ptr<Dataset> dataset_;
  LoaderOptions opt_;
  std::shared_ptr<Sampler> sampler_;
  // Implementation state (workers, queue) is private to dataloader.cpp.
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace athanor::data
