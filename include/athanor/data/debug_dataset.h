#pragma once
// Datasets that break a run on purpose, for testing the doctor (config keys debug.*,
// documented there as TEST ONLY), and a prefix subset (data.train_samples).
//
//   auto set = data::debug_dataset(base, {.shuffle_labels = true, .seed = 1});
//
// Every fault is a pure function of (options, sample id): the same with any number of
// loader workers, and resumable.
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "athanor/data/dataset.h"

namespace athanor::data {

struct DebugDataOptions {
  bool shuffle_labels = false;   // sample i gets the target of sample perm(i), perm a seeded shuffle
  uint64_t seed = 0;
  double sample_delay_ms = 0;    // sleep per sample loaded (a slow pipeline)
  std::vector<int64_t> corrupt_ids;  // these samples get corrupt_value in one element of their input
  double corrupt_value = std::numeric_limits<double>::quiet_NaN();
  double input_scale = 1.0;      // every input multiplied by this (floating inputs)
  bool any() const {
    return shuffle_labels || sample_delay_ms > 0 || !corrupt_ids.empty() || input_scale != 1.0;
  }
};

// `base` with the faults of `o` applied. Raises athanor::Error when a fault needs floating
// inputs (corrupt_ids, input_scale) and the dataset's are integers (tokens), or an id is
// out of range.
std::shared_ptr<Dataset> debug_dataset(std::shared_ptr<Dataset> base, DebugDataOptions o);
// The first n samples of base (n must be in 1 .. base->size()).
std::shared_ptr<Dataset> prefix_subset(std::shared_ptr<Dataset> base, int64_t n);

}  // namespace athanor::data
