// Samplers: the order of dataset indices for an epoch, a pure function of
// (n, seed, epoch) so any worker can compute it and a resumed run sees the
// same order.
//
// random_sampler is a Fisher-Yates shuffle: for i = n-1 down to 1, swap
// order[i] with order[j], j uniform in [0, i]. Step s (= n-1-i) draws a 64-bit
// value from words 2*(s%2), 2*(s%2)+1 of Philox block s/2 keyed by the seed, on
// stream = epoch; j = value mod (i+1) (bias < n / 2^64, i.e. none measurable).
#include "athanor/core/error.h"
#include "athanor/core/rng.h"
#include "athanor/data/dataloader.h"

namespace athanor::data {
namespace {

class SequentialSampler final : public Sampler {
 public:
  explicit SequentialSampler(int64_t n) : n_(n) {}
  std::vector<int64_t> indices(int64_t) const override {
    std::vector<int64_t> order(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) order[i] = i;
    return order;
  }
 private:
  int64_t n_;
};

class RandomSampler final : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  std::vector<int64_t> indices(int64_t epoch) const override {
    std::vector<int64_t> order(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) order[i] = i;
    std::array<uint32_t, 4> block{};
    for (int64_t i = n_ - 1, s = 0; i >= 1; --i, ++s) {
      if (s % 2 == 0) block = philox4x32(seed_, static_cast<uint64_t>(s / 2), static_cast<uint64_t>(epoch));
      const int w = 2 * static_cast<int>(s % 2);
      const uint64_t r = (static_cast<uint64_t>(block[w]) << 32) | block[w + 1];
      const auto j = static_cast<int64_t>(r % static_cast<uint64_t>(i + 1));
      std::swap(order[i], order[j]);
    }
    return order;
  }
 private:
  int64_t n_;
  uint64_t seed_;
};

}  // namespace

std::shared_ptr<Sampler> sequential_sampler(int64_t n) {
  ATH_CHECK(n >= 0, "sequential_sampler", "n must be >= 0, got ", n, Hint{"pass the dataset's size()"});
  return std::make_shared<SequentialSampler>(n);
}

std::shared_ptr<Sampler> random_sampler(int64_t n, uint64_t seed) {
  ATH_CHECK(n >= 0, "random_sampler", "n must be >= 0, got ", n, Hint{"pass the dataset's size()"});
  return std::make_shared<RandomSampler>(n, seed);
}

}  // namespace athanor::data
