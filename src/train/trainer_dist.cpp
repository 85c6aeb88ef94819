// Data- and tensor-parallel training in the Trainer (config section dist.*): one process per
// rank, started by mpirun/srun, each running the same Trainer. With dist.tp > 1 the ranks form
// a dp x tp DeviceMesh: "the ranks" below are the dp group's, and each tp group trains one
// TensorParallelGPT (trainer_parallel.cpp converts its shards to and from logical tensors).
//
//  - the process group is initialised once per process (MPI_Finalize at exit);
//  - the model is wrapped in dist::DataParallel (DDP at zero_stage 0, ZeRO 1/2/3 above),
//    which owns the optimizer (over the parameters this rank owns); at stage 3 the sharding
//    units are the model's own (GPT: its blocks transformer.h.<i>; MLP: its Linear layers;
//    a caller's Task: its FullyShardedBlocks), named by path, so parameter names and
//    checkpoints stay those of 1 process. Weights are then read only through the
//    DataParallel: checkpoints via local_state_dict()/local_optimizer_state() (each rank
//    writes its own shard, ckpt/sharded_checkpoint.h), evaluation and samples inside a
//    full_parameters() scope (every rank; the unit gathers are collectives);
//  - the training data goes through a DistributedSampler over the 1-process order, so
//    micro-batch k of the global step is the same set of samples for any world size
//    (rank r takes every world-th sample of it);
//  - losses and metrics are reduced across ranks; only rank 0 writes run files and prints;
//  - every rank evaluates a slice of the validation batches and the sums are reduced.
//
// Test hook (documented in the tests): ATHANOR_TEST_KILL_RANK=r ATHANOR_TEST_KILL_STEP=s
// make rank r send itself SIGKILL in step s, after its backward and before the gradient
// wait, so the other ranks are left inside a collective.
#include <unistd.h>

#include <bit>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <string>

#include "athanor/dist/device_mesh.h"
#include "athanor/dist/process_group.h"
#include "athanor/dist/tensor_parallel_gpt.h"
#include "athanor/dist/sampler.h"
#include "athanor/dist/zero.h"
#include "athanor/nn/convnet.h"
#include "athanor/nn/gpt.h"
#include "athanor/nn/mlp.h"
#include "athanor/train/trainer.h"

namespace athanor::train {
namespace {
// The number of processes the launcher started (0 when not launched by one).
int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_NTASKS"})
    if (const char* v = std::getenv(var); v && *v) return std::atoi(v);
  return 0;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}
}  // namespace

void Trainer::check_parallel_config() const {
  const Config& c = config_;
  const int64_t tp = c.get_int("dist.tp"), pp = c.get_int("dist.pp");
  ATH_CHECK(tp >= 1, "config", "dist.tp must be >= 1, got ", tp, Hint{"1 = no tensor parallelism"});
  ATH_CHECK(pp == 1, "config", "dist.pp is ", pp, ": pipeline parallelism is not available yet",
            Hint{"set dist.pp: 1; tensor parallelism (dist.tp) and data parallelism (the number of processes) are"});
  ATH_CHECK(c.get_int("dist.vocab_pad_multiple") >= 1, "config", "dist.vocab_pad_multiple must be >= 1, got ",
            c.get_int("dist.vocab_pad_multiple"), Hint{"128 pads the vocabulary to a multiple of 128 x tp; 1 = no padding"});
  if (tp == 1) return;
  const std::string& type = c.get_string("model.type");
  ATH_CHECK(type == "gpt", "config", "dist.tp ", tp, " is not supported for model.type ", type,
            ": tensor parallelism splits a GPT's attention heads, MLP and vocabulary across ranks, and the ", type,
            " is not built from such layers",
            Hint{"set dist.tp: 1 and train the " + type + " data-parallel (mpirun -np N, dist.zero_stage 0-" +
                 std::string(type == "convnet" ? "2" : "3") + ")"});
  const std::string& opt = c.get_string("optimizer.type");
  ATH_CHECK(opt != "lamb" && opt != "lars", "config", "optimizer.type ", opt, " with dist.tp ", tp,
            ": its trust ratio is the norm of each whole weight over the norm of its update, and tensor parallelism "
            "splits the weights across ranks (each rank would use its shard's norms)",
            Hint{"use adamw, adam, sgd or rmsprop with dist.tp > 1, or train with dist.tp: 1"});
  const int64_t H = c.get_int("model.n_head");
  ATH_CHECK(H % tp == 0, "config", "model.n_head (", H, ") is not divisible by dist.tp (", tp,
            "): the attention heads are split across the tensor-parallel ranks",
            Hint{"choose dist.tp dividing n_head, or n_head a multiple of dist.tp"});
  if (c.get_bool("dist.sequence_parallel"))
    ATH_CHECK(c.get_int("model.block_size") % tp == 0, "config", "dist.sequence_parallel splits the sequence across tp: model.block_size (",
              c.get_int("model.block_size"), ") is not divisible by dist.tp (", tp, ")",
              Hint{"choose block_size a multiple of dist.tp, or set dist.sequence_parallel: false"});
  const int64_t V = c.get_int("model.vocab_size");
  if (V > 0 && c.get_int("dist.vocab_pad_multiple") == 1)
    ATH_CHECK(V % tp == 0, "config", "model.vocab_size (", V, ") is not divisible by dist.tp (", tp,
              ") and dist.vocab_pad_multiple is 1 (no padding): the vocabulary is split across the tensor-parallel ranks",
              Hint{"set dist.vocab_pad_multiple: 128 (padding rows are never used), or choose dist.tp dividing the vocabulary"});
}

void Trainer::setup_process_group() {
  const Config& c = config_;
  check_parallel_config();  // before any work, on every rank alike
  const std::string backend = c.get_string("dist.backend");
  const int64_t tp = c.get_int("dist.tp"), pp = c.get_int("dist.pp");
  if (backend == "none" || (backend == "auto" && launcher_world_size() <= 1)) {
    ATH_CHECK(tp == 1, "config", "dist.tp is ", tp, " but this run is one process (",
              backend == "none" ? "dist.backend none" : "not started by mpirun/srun with more than one process",
              "): tensor parallelism splits each layer across dist.tp processes",
              Hint{"start it with mpirun -np " + std::to_string(tp) + " (or a multiple of it) athanor train …, or set dist.tp: 1"});
    return;
  }
  const int64_t stage = c.get_int("dist.zero_stage");
  ATH_CHECK(stage >= 0 && stage <= 3, "config", "dist.zero_stage must be 0, 1, 2 or 3, got ", stage,
            Hint{"0 = DDP, 1 = shard optimizer state, 2 = also gradients, 3 = also the parameters of the model's blocks"});
  // observe.layer_norms reads every parameter in the step (trainer_step.cpp); at stage 3 a
  // parameter this rank does not own has no data between its block's forward and backward.
  ATH_CHECK(stage != 3 || !c.get_bool("observe.layer_norms"), "config",
            "observe.layer_norms cannot be used with dist.zero_stage 3: the parameters are sharded across the ranks",
            Hint{"turn observe.layer_norms off, or use dist.zero_stage 2"});
  ATH_CHECK(c.get_float("dist.bucket_mb") > 0, "config", "dist.bucket_mb must be > 0, got ", c.get_float("dist.bucket_mb"),
            Hint{"25 is the default"});
  ATH_CHECK(c.get_float("dist.timeout_s") > 0, "config", "dist.timeout_s must be > 0, got ", c.get_float("dist.timeout_s"),
            Hint{"300 is the default"});
  const bool first = !dist::is_initialized();
  group_ = dist::init_from_mpi();
  if (first) std::atexit([] { dist::finalize(); });  // mpirun treats an exit without MPI_Finalize as a failure
  // ATHANOR_DIST_TIMEOUT_S, when set, wins over the config (an operator's override for one launch).
  if (!std::getenv("ATHANOR_DIST_TIMEOUT_S"))
    group_->set_timeout(std::chrono::milliseconds(static_cast<int64_t>(c.get_float("dist.timeout_s") * 1000.0)));
  rank_ = group_->rank();
  world_ = group_->size();
  zero_stage_ = static_cast<int>(stage);
  dp_group_ = group_;
  group_->set_dimension("dp");  // without a mesh the world is the data-parallel dimension (the ledger's label)
  if (tp > 1 || pp > 1) {
    group_->set_dimension("world");
    // dp = world / (tp x pp): an Error naming the numbers when that is not whole (every rank).
    mesh_ = std::make_unique<dist::DeviceMesh>(dist::DeviceMesh::from_sizes(static_cast<int>(tp), static_cast<int>(pp), group_));
    for (const char* dim : dist::DeviceMesh::kDims) mesh_->group(dim)->set_timeout(group_->timeout());
    dp_group_ = mesh_->dp();
    tp_group_ = mesh_->tp();
    tp_ = static_cast<int>(tp);
  }
  dp_rank_ = dp_group_->rank();
  dp_size_ = dp_group_->size();
  write_files_ = run_files_ && rank_ == 0;
  if (rank_ != 0) out_ = [](const std::string&) {};
}

namespace {
// The stage-3 sharding units of the models the trainer builds (empty: rely on FullyShardedBlocks).
std::vector<std::string> zero3_units(nn::Module& m) {
  if (auto* gpt = dynamic_cast<nn::GPT*>(&m)) return gpt->shard_units();
  if (auto* tpg = dynamic_cast<dist::TensorParallelGPT*>(&m)) return tpg->shard_units();
  if (auto* mlp = dynamic_cast<nn::MLP*>(&m)) return mlp->shard_units();
  ATH_CHECK(dynamic_cast<nn::ConvNet*>(&m) == nullptr, "config",
            "dist.zero_stage 3 is not supported for model.type convnet: its layers are not called through "
            "nn::Module::run_forward, so they cannot be sharded (and its parameters are small)",
            Hint{"use dist.zero_stage 2 (gradients and optimizer state sharded) for the convnet; stage 3 supports "
                 "model.type gpt and mlp"});
  for (auto& [path, sub] : m.named_modules())
    if (std::dynamic_pointer_cast<dist::FullyShardedBlock>(sub)) return {};
  ATH_FAIL("config", "dist.zero_stage 3: the task's model is not one the trainer builds (gpt, mlp) and has no "
           "dist::FullyShardedBlock, so there is nothing to shard",
           Hint{"wrap the model's repeated blocks in dist::FullyShardedBlock (include/athanor/dist/zero.h), "
                "or use dist.zero_stage 2"});
}
}  // namespace

std::vector<std::string> Trainer::zero3_shard_modules() { return zero3_units(task_->module()); }

int64_t Trainer::global_batch() const {
  return config_.get_int("trainer.batch_size") * config_.get_int("trainer.accum_steps") * dp_size_;
}

std::shared_ptr<data::Sampler> Trainer::train_sampler(int64_t n, uint64_t seed) const {
  if (!group_) return nullptr;  // the loader's own random sampler (the same order as world 1 below)
  // Per dp rank: the tp ranks of a dp group train on the same samples.
  return std::make_shared<dist::DistributedSampler>(data::random_sampler(n, seed), dp_rank_, dp_size_, /*drop_last=*/false);
}

// Doubles are summed exactly and in rank order on every rank (the collectives reduce f32 or
// i64): all-gather the bit patterns, then add locally, so every rank gets the same value.
// Over the dp group: the tp ranks of a dp group hold the same (replicated) value.
double Trainer::sum_across_ranks(double v) const {
  if (!group_) return v;
  Tensor in = full({1}, 0.0, {DType::i64});
  in.data_ptr<int64_t>()[0] = std::bit_cast<int64_t>(v);
  Tensor out = full({dp_size_}, 0.0, {DType::i64});
  dp_group_->all_gather(out, in);
  double sum = 0;
  for (int r = 0; r < dp_size_; ++r) sum += std::bit_cast<double>(out.data_ptr<int64_t>()[r]);
  return sum;
}

bool Trainer::any_rank(bool v) const {
  if (!group_) return v;
  Tensor t = full({1}, v ? 1.0 : 0.0, {DType::i64});
  group_->all_reduce(t, dist::ReduceOp::max);
  return t.data_ptr<int64_t>()[0] != 0;
}

void Trainer::barrier() const {
  if (group_) group_->barrier();
}

void Trainer::maybe_kill_for_test() const {
  static const int kill_rank = env_int("ATHANOR_TEST_KILL_RANK", -1), kill_step = env_int("ATHANOR_TEST_KILL_STEP", -1);
  if (kill_rank == rank_ && kill_step == step_ + 1) {
    std::fprintf(stderr, "rank %d: ATHANOR_TEST_KILL_RANK/STEP: killing myself in step %d\n", rank_, kill_step);
    std::fflush(stderr);
    ::raise(SIGKILL);
  }
}

}  // namespace athanor::train
