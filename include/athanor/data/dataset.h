#pragma once
// Datasets yield samples by index; get() must be safe to call from several
// loader threads at once.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor::data {

struct Sample {
  Tensor input;   // e.g. [1, 28, 28] f32 image, or [T] i64 tokens
  Tensor target;  // e.g. [] i64 label, or [T] i64 next tokens
};

struct Batch {
  Tensor input, target;              // samples stacked along a new dim 0
  std::vector<int64_t> sample_ids;   // dataset indices, for diagnosis ("sample 1234 has a NaN")
  int64_t num_targets = 0;           // targets that count (tokens for language models, samples for classifiers)
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Sample get(int64_t index) const = 0;
  virtual std::string describe() const = 0;  // for logs: "fashion-mnist train (60000 images)"
  // Optional fast path for the loader: the batch of `ids`, equal to collate() of
  // get(id) for each id, built straight into the batch tensors. Datasets whose
  // samples are rows of one in-memory array override it: two allocations per
  // batch instead of two per sample (each allocation takes the process-wide
  // allocator lock that the training thread also takes for every op). The
  // default, std::nullopt, makes the loader call get() per sample and collate.
  virtual std::optional<Batch> get_batch(const std::vector<int64_t>& ids) const {
    (void)ids;
    return std::nullopt;
  }
};

// Stacks samples into a batch (inputs and targets must agree in shape and dtype).
Batch collate(const std::vector<Sample>& samples, const std::vector<int64_t>& ids, int64_t ignore_index = -100);

// Fashion-MNIST from the gzipped IDX files of Debian's dataset-fashion-mnist
// (default dir /usr/share/datasets/fashion-mnist). Images become [1, 28, 28] f32
// scaled to [0, 1] then normalized with mean 0.2860, std 0.3530 (normalize = false: the
// raw pixel values 0..255); labels i64.
// A missing directory or file is an Error naming the path and the package to install.
std::shared_ptr<Dataset> fashion_mnist(const std::string& dir, bool train, bool normalize = true);
std::string default_fashion_mnist_dir();

}  // namespace athanor::data
