#pragma once
// DistributedDataParallel: data-parallel training of an nn::Module over a
// ProcessGroup (usually DeviceMesh::dp()).
//
//   auto pg = dist::init_from_mpi();
//   dist::DistributedDataParallel ddp(model, pg);     // broadcasts rank 0's parameters and buffers
//   for (…) {
//     { auto ns = ddp.no_sync(); loss(micro_batch_0).backward(); }   // local accumulation only
//     loss(micro_batch_1).backward();   // buckets are all-reduced while backward runs
//     ddp.finish();                     // waits, writes the averaged gradients into .grad
//     opt->step(); opt->zero_grad();
//   }
//
// Invariants:
//  - buckets hold parameters of one dtype and one device, in reverse registration order (the
//    order in which backward usually produces their gradients), at most
//    bucket_cap_mb each (a larger parameter gets a bucket of its own);
//  - a post-accumulate hook on every parameter marks it ready; when a bucket's
//    last parameter is ready its gradients are copied into the bucket's flat
//    buffer and an asynchronous all_reduce(avg) is launched. Buckets are
//    launched strictly in bucket order, so every rank posts the same
//    collectives in the same order whatever order its hooks fire in;
//  - on CUDA parameters the flat buffers live on the device: the copy of a bucket's gradients
//    is queued on the compute stream after the kernels that accumulated them (the hook fires
//    once they are queued), and the all_reduce is ordered after that copy (NCCL: its
//    communication stream waits for the compute stream; MPI: the host staging downloads after
//    it), while the rest of backward keeps the compute stream busy;
//  - finish() launches what is left, waits, and copies the averaged gradients
//    back into .grad. A parameter that got no gradient in the step is an Error
//    naming it (raised before anything of that bucket is launched; ranks that
//    did give it a gradient then time out in that bucket's all_reduce, with
//    the timeout message);
//  - inside no_sync() hooks do nothing: gradients accumulate locally in .grad,
//    and the next synchronised backward all-reduces the accumulated sum.
#include <memory>
#include <string>
#include <vector>

#include "athanor/dist/process_group.h"
#include "athanor/nn/module.h"

namespace athanor::dist {

struct DDPOptions {
  double bucket_cap_mb = 25.0;   // MiB per bucket
  bool broadcast_buffers = true; // also broadcast buffers (running stats) at construction
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> group, DDPOptions opts = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  nn::Module& module() { return *module_; }
  ProcessGroup& group() { return *group_; }

  // Waits for every bucket and writes the averaged gradients into .grad. Call
  // after the last backward of a step, before the optimizer.
  void finish();
  void wait() { finish(); }

  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& d) : d_(&d), prev_(d.sync_) { d.sync_ = false; }
    ~NoSync() { if (d_) d_->sync_ = prev_; }
    NoSync(NoSync&& o) noexcept : d_(o.d_), prev_(o.prev_) { o.d_ = nullptr; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;
   private:
    DistributedDataParallel* d_;
    bool prev_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // Parameter names per bucket, in launch order (for tests and logs).
  std::vector<std::vector<std::string>> bucket_names() const;

 private:
  struct Param {
    std::string name;
    Tensor tensor;
    int bucket = 0;
    int64_t offset = 0;  // in the bucket's flat buffer, in elements
    bool ready = false;
    int hook = -1;
  };
  struct Bucket {
    std::vector<int> params;
    DType dtype = DType::f32;
    Device device = Device::cpu();
    int64_t numel = 0;
    int pending = 0;      // parameters not ready yet in this step
    Tensor flat;
    WorkPtr work;
  };
  void on_grad_ready(int index);
  void launch_ready_buckets();
  void launch(int b);
  void reset_step();

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DDPOptions opts_;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  int next_launch_ = 0;   // buckets are launched in order
  bool sync_ = true;
  bool step_active_ = false;  // some hook fired since the last finish()
};

}  // namespace athanor::dist
