// DistributedSampler: see include/athanor/dist/sampler.h.
#include "athanor/dist/sampler.h"

#include "athanor/core/error.h"

namespace athanor::dist {

DistributedSampler::DistributedSampler(std::shared_ptr<data::Sampler> base, int rank, int world, bool drop_last)
    : base_(std::move(base)), rank_(rank), world_(world), drop_last_(drop_last) {
  ATH_CHECK(base_ != nullptr, "DistributedSampler", "got no base sampler", Hint{"pass data::random_sampler(n, seed)"});
  ATH_CHECK(world >= 1 && rank >= 0 && rank < world, "DistributedSampler", "rank ", rank, " is not in [0, ", world, ")",
            Hint{"pass the data-parallel group's rank() and size()"});
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order = base_->indices(epoch);
  const auto n = static_cast<int64_t>(order.size());
  const int64_t per_rank = drop_last_ ? n / world_ : (n + world_ - 1) / world_;
  const int64_t total = per_rank * world_;
  if (total > n) {
    ATH_CHECK(n > 0, "DistributedSampler", "the base sampler gave no indices to pad from");
    for (int64_t i = n; i < total; ++i) order.push_back(order[(i - n) % n]);
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank));
  for (int64_t i = rank_; i < total; i += world_) mine.push_back(order[i]);
  return mine;
}

}  // namespace athanor::dist
