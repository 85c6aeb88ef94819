#pragma once
// DistributedSampler: this rank's share of another sampler's epoch order.
//
// For an epoch, the base sampler's order (the same on every rank: it is a pure
// function of (n, seed, epoch)) is made a multiple of `world` long — padded by
// repeating its first indices (drop_last = false), or cut (drop_last = true) —
// and rank r takes every world-th index starting at r (PyTorch's layout). So
// the ranks' shares are disjoint (apart from the padding), equally long, and
// together cover the epoch; each rank's DataLoader then batches its share.
#include <cstdint>
#include <memory>
#include <vector>

#include "athanor/data/dataloader.h"

namespace athanor::dist {

class DistributedSampler final : public data::Sampler {
 public:
  // base: e.g. data::random_sampler(n, seed) — the same on every rank.
  DistributedSampler(std::shared_ptr<data::Sampler> base, int rank, int world, bool drop_last = false);
  std::vector<int64_t> indices(int64_t epoch) const override;

 private:
  std::shared_ptr<data::Sampler> base_;
  int rank_, world_;
  bool drop_last_;
};

}  // namespace athanor::dist
