// ZeRO stage 3: FullyShardedBlock and the gather/release of a block's parameters
// (contract in include/athanor/dist/zero.h).
#include <string>

#include "athanor/autograd/checkpoint.h"
#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"
#include "athanor/dist/zero.h"

namespace athanor::dist {

FullyShardedBlock::FullyShardedBlock(std::shared_ptr<nn::UnaryModule> b) : block(std::move(b)) {
  ATH_CHECK(block != nullptr, "FullyShardedBlock", "got no block");
  register_module("block", block);
}

Tensor FullyShardedBlock::forward(const Tensor& x) {
  auto scope = enter();
  if (sharder_ == nullptr) return block->forward(x);
  DataParallel* dp = sharder_;
  const int b = bucket_;
  auto run = [dp, b, blk = block](const Tensor& in) {
    dp->gather_block(b);  // in the forward, and again in the checkpoint's recompute during backward
    return blk->forward(in);
  };
  // Under checkpoint() nothing of the block is saved for backward, so releasing the
  // gathered parameters right after the forward really frees them.
  Tensor y = grad_enabled() ? checkpoint(run, x) : run(x);
  dp->release_block(b);
  return y;
}

void DataParallel::setup_blocks() {
  for (auto& [name, m] : module_->named_modules()) {
    auto blk = std::dynamic_pointer_cast<FullyShardedBlock>(m);
    if (!blk) continue;
    ATH_CHECK(blk->sharder_ == nullptr, "DataParallel", "FullyShardedBlock '", name,
              "' is already sharded by another DataParallel");
    for (auto& [outer, other] : blocks_)
      ATH_CHECK(name.rfind(outer, 0) != 0, "DataParallel", "FullyShardedBlock '", name, "' is nested in '", outer,
                "'", Hint{"wrap either the outer block or the inner ones, not both"});
    blk->bucket_ = -1;
    blocks_.emplace_back(name + ".", blk);
  }
  ATH_CHECK(!blocks_.empty(), "DataParallel", "zero_stage 3 found no FullyShardedBlock in the model",
            Hint{"wrap the model's repeated blocks: std::make_shared<dist::FullyShardedBlock>(block)"});
}

int DataParallel::block_of(const std::string& param) const {
  for (int k = 0; k < static_cast<int>(blocks_.size()); ++k)
    if (param.rfind(blocks_[k].first, 0) == 0) return k;
  return -1;
}

void DataParallel::gather_block(int bi) {
  Bucket& b = buckets_[bi];
  if (!b.block || b.gathered) return;
  NoGradGuard ng;
  const int n = group_->size(), me = group_->rank();
  // Gathered parameters are parameters: tag them so (per rank: owned + blocks in use).
  Tensor in = zeros({b.seg}, TensorOptions(b.dtype).with_tag(MemTag::parameter));
  Tensor out = empty({b.seg * n}, TensorOptions(b.dtype).with_tag(MemTag::parameter));
  for (int i : b.params)
    if (params_[i].owner == me)
      copy_into(make_view(in, params_[i].tensor.sizes(), contiguous_strides(params_[i].tensor.sizes()),
                          params_[i].seg_offset),
                params_[i].tensor);
  group_->all_gather(out, in);
  // The non-owned parameters now view the gathered buffer (no copy); every handle
  // on them (the model's, the optimizer's) shares the TensorImpl and sees it.
  for (int i : b.params) {
    Param& p = params_[i];
    if (p.owner == me) continue;
    TensorImpl* impl = p.tensor.impl();
    impl->storage = out.impl()->storage;
    impl->offset = out.impl()->offset + p.owner * b.seg + p.seg_offset;
    impl->strides = contiguous_strides(impl->sizes);
  }
  b.gathered = true;
}

void DataParallel::release_block(int bi) {
  Bucket& b = buckets_[bi];
  if (!b.block || !b.gathered) return;
  for (int i : b.params) {
    Param& p = params_[i];
    if (p.owner == group_->rank()) continue;
    // Point at a 1-element placeholder: the gathered buffer goes once nothing else holds it.
    TensorImpl* impl = p.tensor.impl();
    impl->storage = released_.impl()->storage;
    impl->offset = 0;
    impl->strides = Shape(impl->sizes.size(), 0);
  }
  b.gathered = false;
}

void DataParallel::on_block_grad(int bi) {
  Bucket& b = buckets_[bi];
  if (--b.bwd_pending > 0) return;
  b.bwd_pending = static_cast<int>(b.params.size());
  release_block(bi);  // the block's backward is done (its recompute graph keeps what it still needs)
}

}  // namespace athanor::dist
