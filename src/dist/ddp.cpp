// DistributedDataParallel: gradient buckets all-reduced from post-accumulate
// hooks, overlapping backward (contract in include/athanor/dist/ddp.h).
#include "athanor/dist/ddp.h"

#include <sstream>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"
#include "dist/unused_parameters.h"

namespace athanor::dist {

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> group,
                                                 DDPOptions opts)
    : module_(std::move(module)), group_(std::move(group)), opts_(opts) {
  ATH_CHECK(module_ != nullptr, "DistributedDataParallel", "got no module");
  ATH_CHECK(group_ != nullptr, "DistributedDataParallel", "got no process group",
            Hint{"pass dist::init_from_mpi() or a DeviceMesh's dp() group"});
  ATH_CHECK(opts_.bucket_cap_mb > 0, "DistributedDataParallel", "bucket_cap_mb must be positive, got ", opts_.bucket_cap_mb);

  // Same starting point everywhere: rank 0's parameters and buffers.
  {
    NoGradGuard ng;
    for (auto& [name, p] : module_->named_parameters()) group_->broadcast(p, 0);
    if (opts_.broadcast_buffers)
      for (auto& [name, b] : module_->named_buffers()) group_->broadcast(b, 0);
  }

  for (auto& [name, p] : module_->named_parameters())
    if (p.requires_grad()) params_.push_back(Param{name, p});

  // Buckets in reverse registration order, one dtype and one device each, capped in bytes. A
  // bucket's flat buffer lives on its parameters' device (CUDA gradients never leave it).
  const double cap = opts_.bucket_cap_mb * 1024.0 * 1024.0;
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
    Param& p = params_[i];
    const DType dt = p.tensor.dtype();
    const double bytes = static_cast<double>(p.tensor.nbytes());
    bool fits = !buckets_.empty() && buckets_.back().dtype == dt && buckets_.back().device == p.tensor.device() &&
                static_cast<double>(buckets_.back().numel * dtype_size(dt)) + bytes <= cap;
    if (!fits) {
      buckets_.emplace_back();
      buckets_.back().dtype = dt;
      buckets_.back().device = p.tensor.device();
    }
    Bucket& b = buckets_.back();
    p.bucket = static_cast<int>(buckets_.size()) - 1;
    p.offset = b.numel;
    b.numel += p.tensor.numel();
    b.params.push_back(i);
  }
  for (auto& b : buckets_) {
    b.flat = empty({b.numel}, TensorOptions(b.dtype).with_device(b.device).with_tag(MemTag::gradient));
    b.pending = static_cast<int>(b.params.size());
  }
  for (int i = 0; i < static_cast<int>(params_.size()); ++i)
    params_[i].hook = params_[i].tensor.register_post_accumulate_grad_hook([this, i](Tensor&) { on_grad_ready(i); });
}

DistributedDataParallel::~DistributedDataParallel() {
  for (auto& p : params_)
    if (p.hook >= 0) p.tensor.remove_hook(p.hook);
  // Launched buckets must complete before their buffers go away.
  for (auto& b : buckets_)
    if (b.work) {
      try { b.work->wait(); } catch (...) {}
    }
}

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (auto& b : buckets_) {
    out.emplace_back();
    for (int i : b.params) out.back().push_back(params_[i].name);
  }
  return out;
}

void DistributedDataParallel::on_grad_ready(int index) {
  if (!sync_) return;
  Param& p = params_[index];
  ATH_CHECK(!p.ready, "DistributedDataParallel", "parameter '", p.name,
            "' received a gradient twice in one synchronised step",
            Hint{"call finish() after each backward, or run the non-final micro-batches inside no_sync()"});
  p.ready = true;
  step_active_ = true;
  if (--buckets_[p.bucket].pending == 0) launch_ready_buckets();
  // Give MPI a chance to progress the buckets already in flight.
  for (auto& b : buckets_)
    if (b.work) b.work->test();
}

void DistributedDataParallel::launch_ready_buckets() {
  while (next_launch_ < static_cast<int>(buckets_.size()) && buckets_[next_launch_].pending == 0) launch(next_launch_++);
}

void DistributedDataParallel::launch(int bi) {
  Bucket& b = buckets_[bi];
  for (int i : b.params) {
    Param& p = params_[i];
    Tensor g = p.tensor.grad();
    ATH_ASSERT(g.defined());
    Tensor view = make_view(b.flat, g.sizes(), contiguous_strides(g.sizes()), p.offset);
    copy_into(view, g);
  }
  b.work = group_->all_reduce_async(b.flat, ReduceOp::avg);
}

void DistributedDataParallel::reset_step() {
  for (auto& p : params_) p.ready = false;
  for (auto& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.work.reset();
  }
  next_launch_ = 0;
  step_active_ = false;
}

void DistributedDataParallel::finish() {
  if (!step_active_) {
    // No synchronised backward since the last finish(): nothing to reduce.
    reset_step();
    return;
  }
  // Unused parameters: every rank must contribute to every bucket.
  fail_if_unused("DistributedDataParallel", params_, buckets_, [this] { reset_step(); });
  launch_ready_buckets();
  ATH_ASSERT(next_launch_ == static_cast<int>(buckets_.size()));
  NoGradGuard ng;
  for (auto& b : buckets_) {
    b.work->wait();
    for (int i : b.params) {
      Param& p = params_[i];
      Tensor g = p.tensor.grad();
      Tensor view = make_view(b.flat, g.sizes(), contiguous_strides(g.sizes()), p.offset);
      copy_into(g, view);
      g.bump_version();
    }
  }
  reset_step();
}

}  // namespace athanor::dist
