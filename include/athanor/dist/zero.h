#pragma once
// dist::DataParallel: one facade over DDP and ZeRO stages 1, 2 and 3, owning the
// (sharded) optimizer, so a training step reads the same at every stage:
//
//   auto dp = dist::DataParallel(model, mesh.dp(), [](const optim::NamedTensors& owned) {
//     return optim::make_adamw(optim::default_param_groups(owned, 3e-4, 0.1));
//   }, {.zero_stage = 2, .bucket_mb = 25});
//   for (…) {
//     { auto ns = dp.no_sync(); loss(mb0).backward(); }   // local accumulation only
//     loss(mb1).backward();                                // buckets reduced during backward
//     dp.finish_backward();                                // grads averaged (full, or owned shard)
//     if (dp.found_nonfinite()) { dp.zero_grad(); continue; }   // agreed by every rank
//     dp.clip_grad_norm(1.0);                              // global norm, all shards
//     dp.step(); dp.zero_grad();                           // every rank ends with the full weights
//   }
//   // checkpoint (any stage, any world size; every rank must call the full_* functions):
//   auto opt_state = dp.full_optimizer_state();   // logical names "exp_avg.<param>", as 1 process
//   auto scalars = dp.full_optimizer_scalars();   // "steps", "step.<param>", "lr.<group>"
//   dp.load_full_optimizer_state(opt_state, scalars);   // on M ranks, any stage
//   auto weights = dp.full_state_dict();  dp.load_full_state_dict(weights);
// A Trainer needs only this: build the model, construct DataParallel with its
// optimizer factory (for stage 3 naming the sharding units, below), set lrs on
// dp.optimizer().param_groups(), and call the step functions above in order.
//
// Stage-3 sharding units (FSDP's "units"), two ways, both keeping every name:
//  - DataParallelOptions::shard_modules: module paths, e.g. GPT::shard_units()
//    {"transformer.h.0", …} or MLP::shard_units() {"layers.0", "layers.2"}.
//    DataParallel installs a forward interceptor (nn::Module::run_forward) on each,
//    so the model's container must call the unit through run_forward (GPT's block
//    loop and MLP's layer loop do); the interceptor is removed by ~DataParallel.
//    A unit whose parameters get gradients without its forward having gone through
//    the interceptor is an error (its parameters were never gathered).
//  - FullyShardedBlock (below): a wrapper that does the same for its one child;
//    its parameters are named "<wrapper>.block.<…>".
// Parameter names, state dicts and checkpoints are those of the unsharded model.
//
// Stages:
//   0  DDP (DistributedDataParallel buckets) + one full optimizer per rank;
//   1  DDP all-reduce, but each rank's optimizer holds only the parameters it
//      owns (its state is ~1/N); after step() the updated parameters are
//      all-gathered per bucket;
//   2  as 1, but each bucket's gradients are reduce-scattered (avg) so that a
//      rank receives only the reduced gradients of the parameters it owns, into
//      a persistent per-rank shard buffer (~1/N of the gradients); the full .grad
//      of every parameter in a bucket is dropped as soon as the bucket is packed,
//      so beyond the shard at most two buckets are in flight (launching a third
//      waits for the oldest) plus the .grads of the bucket being filled. Inside
//      no_sync() gradients accumulate locally in full .grad (as FSDP's no_sync).
//   3  as 2, plus the parameters of every sharding unit (shard_modules and
//      FullyShardedBlocks) are sharded: each rank keeps only the parameters it owns; the others hold
//      no memory except while their block runs. A block's forward all-gathers
//      its parameters, runs under checkpoint() (autograd/checkpoint.h: nothing
//      of the block is saved, so nothing keeps the gathered parameters alive)
//      and releases them; the checkpoint node's backward re-gathers them,
//      recomputes the block and backpropagates through it, and when the last
//      of the block's gradients has arrived the parameters are released again
//      and the block's gradients reduce-scattered (as a stage-2 bucket).
//      Parameters outside any unit are treated as at stage 2. When the model's
//      forward itself already checkpoints the unit (GPT's gradient_checkpointing),
//      the interceptor takes its place: a block is never checkpointed twice.
//      Per rank: the owned parameters (~1/N) + the block(s) being computed.
//      Cost: one extra forward per block (the recompute), as FSDP with
//      activation checkpointing. While DataParallel lives, read the model's
//      weights only through full_state_dict(), or inside a full_parameters()
//      scope: a non-owned unit parameter has no data outside its unit's
//      forward/backward. Forwards that not every rank runs alike (evaluation
//      slices of different lengths, generation on rank 0 only) must run inside
//      full_parameters(), since a unit's gather is a collective. Destroying the
//      DataParallel re-gathers every unit (a collective: all ranks).
//      A parameter shared by a unit and anything outside it (tied weights, e.g.
//      GPT's wte and lm_head) must live outside every unit: a unit only gathers
//      its own parameters. A tie registered under two names is refused when
//      DataParallel is built, naming both; one it cannot see (a weight another
//      layer reads directly, as GPT's lm_head reads wte's) fails in the backward,
//      when the parameter's second gradient arrives.
//      The FullyShardedBlock / shard_modules mechanism: each unit gets a forward
//      interceptor (nn::Module::run_forward) that gathers, runs the unit under
//      checkpoint() and releases; ~DataParallel removes it.
//
// Sharding scheme: parameter-granular ownership (ZeroRedundancyOptimizer style).
// Why: the optimizer then runs on whole, real parameter tensors, so its state
// keeps the exact logical names a 1-process optimizer uses (checkpoints need no
// name mapping, resharding N -> M is "owner broadcasts"), and every optimizer
// (including the norm-based LAMB/LARS, which need whole tensors) works
// unchanged and bit-for-bit like the unsharded one. Ownership is balanced
// greedily: buckets in launch order, inside a bucket parameters by size
// (largest first), each to the rank owning the fewest elements so far.
// Collective layout of a bucket: N segments of S elements (S = the largest
// number of elements any one rank owns in that bucket); rank r's parameters lie
// packed in segment r, the rest is zero padding. reduce_scatter over that
// layout hands each rank exactly its parameters' reduced gradients; all_gather
// over it returns every owner's updated parameters. The padding is the price
// (comm volume ≈ N·S instead of the bucket size, equal when balanced; a bucket
// or block whose parameters cannot split evenly over N ranks pays more, e.g. a
// block of 4 unequal matrices on 4 ranks).
//
// Devices: on CUDA parameters every buffer above (flat buckets, packed and received
// segments, shards, gathered blocks, the all-gather staging) lives on the parameters'
// device, and the owned shards update there through the device optimizer step; a bucket's
// collective is ordered after the copies that fill it (DistributedDataParallel's rule), and
// full_optimizer_state() returns host tensors (a checkpoint's).
//
// Memory tags: shard gradient buffers and the transient packed buckets are
// MemTag::gradient; the all-gather staging buffers of stages 1/2
// MemTag::workspace; a stage-3 block's gathered parameters MemTag::parameter;
// the optimizer's state MemTag::optimizer_state (created by the optimizer).
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "athanor/dist/ddp.h"
#include "athanor/dist/process_group.h"
#include "athanor/dist/shard_spec.h"
#include "athanor/nn/layers.h"
#include "athanor/nn/module.h"
#include "athanor/optim/optimizer.h"

namespace athanor::dist {

class DataParallel;

// A unit of parameter sharding for zero_stage 3 (an FSDP "unit"): wraps a
// block of the model (its parameters are named "<wrapper>.block.<…>"). Its forward
// runs the block through run_forward, so a stage-3 DataParallel shards it like a
// shard_modules entry; without one it is transparent (forward = block->forward).
class FullyShardedBlock : public nn::UnaryModule {
 public:
  explicit FullyShardedBlock(std::shared_ptr<nn::UnaryModule> block);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::UnaryModule> block;
};

// Builds the optimizer over the parameters this rank owns (all of them at stage 0),
// in registration order. Must create the same group names on every rank.
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(const optim::NamedTensors& owned)>;

struct DataParallelOptions {
  int zero_stage = 0;      // 0, 1, 2, 3
  double bucket_mb = 25.0; // MiB per gradient bucket
  // zero_stage 3 only: paths (as named_modules() spells them) of the sharding units, in
  // addition to the model's FullyShardedBlocks. Units must not nest nor share a parameter
  // with anything outside them; each must hold a trainable parameter.
  std::vector<std::string> shard_modules = {};  // "= {}": designated initializers may omit it without a warning
  // Tensor parallelism on another dimension of the mesh (tensor_parallel_gpt.h): the tp group
  // and how each parameter is sharded over it (absent names are replicated). With them the
  // gradient norm counts every shard once and every replicated parameter once (a sum over
  // tp and, at stages >= 2, over dp), and finish_backward sums over tp the gradients of the
  // parameters marked sum_grad_over_tp (sequence parallelism), once per step. The data-
  // parallel group is then the mesh's dp group: every tp rank runs its own DataParallel over
  // its shards, and they all shard the same way (the shards have equal shapes).
  std::shared_ptr<ProcessGroup> tp_group = nullptr;
  ShardSpecs tp_specs = {};
  // Pipeline parallelism on another dimension (pipeline_gpt.h): the pp group. The gradient
  // norm then sums every stage's part; norm_excluded names parameters whose gradient another
  // stage counts (the last stage's copy of the tied embedding).
  std::shared_ptr<ProcessGroup> pp_group = nullptr;
  std::set<std::string> norm_excluded = {};
};

class DataParallel {
 public:
  DataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> group, OptimizerFactory make_optimizer,
               DataParallelOptions opts = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  nn::Module& module() { return *module_; }
  ProcessGroup& group() { return *group_; }
  int zero_stage() const { return opts_.zero_stage; }
  // This rank's optimizer (over the owned parameters at stages >= 1): set lrs here.
  optim::Optimizer& optimizer() { return *optimizer_; }

  class NoSync {
   public:
    explicit NoSync(DataParallel& d);
    ~NoSync();
    NoSync(NoSync&& o) noexcept;
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;
   private:
    DataParallel* d_;
    bool prev_;
    std::unique_ptr<DistributedDataParallel::NoSync> ddp_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // Waits for every reduction. Afterwards .grad holds the averaged gradient of
  // every parameter (stages 0/1) or of the owned parameters only (stage 2).
  void finish_backward();
  // Global L2 norm of the averaged gradients (all shards), the same on every rank.
  double grad_norm();
  bool found_nonfinite() { return !std::isfinite(grad_norm()); }
  // As optim::clip_grad_norm over the full gradient: returns the norm before clipping.
  double clip_grad_norm(double max_norm);
  // Optimizer step on the owned parameters, then (stages 1/2) all-gather them.
  void step();
  void zero_grad();

  // Which rank owns (keeps optimizer state for) each trainable parameter.
  int owner_of(const std::string& param) const;
  std::vector<std::string> owned_parameters() const;

  // Optimizer state under logical unsharded names, gathered onto every rank.
  optim::NamedTensors full_optimizer_state();
  std::map<std::string, double> full_optimizer_scalars();
  // Loads a full state (e.g. saved by another world size / stage): each rank keeps its own part.
  void load_full_optimizer_state(const optim::NamedTensors& tensors, const std::map<std::string, double>& scalars);
  // The model's full state dict, as copies (stage 3 gathers every block for the
  // call: a collective). load_full_state_dict loads one (any world size/stage).
  nn::StateDict full_state_dict();
  // Stage 3: checks every name and shape but copies only what this rank holds (no
  // collective, reads only those tensors of `state`); stages 0-2: every tensor.
  void load_full_state_dict(const nn::StateDict& state);
  // What this rank saves in a sharded checkpoint (ckpt/sharded_checkpoint.h), no copies,
  // under the logical names: the trainable parameters it writes (the ones it owns at
  // stages >= 1; a balanced share at stage 0, where every rank holds all of them) and, on
  // rank 0, the rest of the state dict (buffers, frozen parameters); and the optimizer
  // state of those parameters. The ranks' parts are disjoint and together make the full
  // state. No collective.
  nn::StateDict local_state_dict();
  optim::NamedTensors local_optimizer_state();

  // Stage 3: while the guard lives every unit's parameters are materialised on every rank
  // (creating it is a collective: all ranks; at stages 0-2 it does nothing), and unit
  // forwards run directly: no collective, no checkpoint. For forwards that ranks do not all
  // run alike (evaluation slices, generation on one rank). Costs the full model's memory.
  class FullParameters {
   public:
    explicit FullParameters(DataParallel& d);
    ~FullParameters();
    FullParameters(FullParameters&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
    FullParameters(const FullParameters&) = delete;
    FullParameters& operator=(const FullParameters&) = delete;
    FullParameters& operator=(FullParameters&&) = delete;
   private:
    DataParallel* d_;
  };
  FullParameters full_parameters() { return FullParameters(*this); }
  // Stage 3: the module paths of the sharding units (shard_modules and FullyShardedBlocks), in order.
  std::vector<std::string> shard_units() const;

 private:
  struct Param {
    std::string name;
    Tensor tensor;
    int owner = 0;
    int writer = 0;          // the rank that saves it in a sharded checkpoint (= owner at stages >= 1)
    int bucket = 0;
    int64_t seg_offset = 0;  // offset inside its owner's segment of the bucket layout
    bool ready = false;
    int hook = -1;
  };
  struct Bucket {
    std::vector<int> params;  // indices into params_, in launch order
    DType dtype = DType::f32;
    Device device = Device::cpu();  // its parameters' (flat buffers and shards live there)
    int64_t seg = 0;          // S: elements per rank segment
    int pending = 0;
    int64_t owned = 0;        // elements this rank owns in the bucket (packed first in its segment)
    bool block = false;       // stage 3: the parameters of one sharding unit (sharded at rest)
    bool gathered = true;     // stage 3: block parameters currently materialised
    bool intercepted = false; // stage 3: the unit's forward went through the interceptor (since its last backward)
    int bwd_pending = 0;      // stage 3: block gradients still to arrive in this backward
    Tensor packed;            // stage 2: [N*S] transient, while reduce-scatter is in flight
    Tensor received;          // stage 2: [S] transient, this rank's segment of the reduction
    Tensor shard;             // stage 2: [owned] this rank's reduced gradients (persistent)
    WorkPtr work;
  };
  void on_grad_ready(int index);  // stage 2 hook
  void launch_ready_buckets();
  void launch(int b);
  void drain(int b);
  void reset_step();
  bool tensor_parallel() const { return opts_.tp_group && opts_.tp_group->size() > 1; }
  bool pipeline_parallel() const { return opts_.pp_group && opts_.pp_group->size() > 1; }
  bool holds_grad(const Param& p) const { return opts_.zero_stage < 2 || p.owner == group_->rank(); }
  void sum_sequence_parallel_grads();  // over tp, the parameters marked sum_grad_over_tp
  static constexpr int kMaxInFlight = 2;  // stage 2: buckets reducing at once
  void all_gather_parameters();
  // stage 3 (zero3.cpp)
  struct Unit {
    std::string path;                    // as named_modules() spells it
    std::shared_ptr<nn::Module> module;
    int bucket = -1;
  };
  void setup_units();                  // finds and checks the units, before buckets are built
  void install_interceptors();         // after the buckets exist
  int block_of(const std::string& param) const;
  void gather_block(int bucket);
  void release_block(int bucket);      // no-op inside a full_parameters() scope
  void gather_all_blocks();
  void release_all_blocks();
  void on_block_grad(int bucket);
  std::vector<Unit> units_;
  int full_depth_ = 0;                 // live full_parameters() scopes
  Tensor released_;                    // 1-element storage that released parameters point at

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DataParallelOptions opts_;
  std::unique_ptr<DistributedDataParallel> ddp_;  // stages 0/1
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::map<std::string, int> index_;  // name -> params_ index
  int next_launch_ = 0;
  bool sync_ = true;
  bool step_active_ = false;
};

}  // namespace athanor::dist
