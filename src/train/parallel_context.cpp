// The Trainer's parallel context (contract in include/athanor/train/parallel_context.h): the
// checks of dist.*, MPI and the mesh, metric reductions, and this rank's tensors <-> the
// logical ones.
#include "athanor/train/parallel_context.h"

#include <unistd.h>

#include <bit>
#include <chrono>
#include <csignal>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "athanor/dist/device_mesh.h"
#include "athanor/dist/pipeline_lm.h"
#include "athanor/dist/pipeline_schedule.h"
#include "athanor/dist/process_group.h"
#include "athanor/dist/sampler.h"
#include "athanor/dist/tensor_parallel_lm.h"
#include "athanor/ops.h"
#if ATHANOR_HAS_CUDA
#include "backend/cuda/runtime.h"
#endif

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
bool one_process(const Config& c) {
  const std::string& backend = c.get_string("dist.backend");
  return backend == "none" || (backend == "auto" && launcher_world_size() <= 1);
}
}  // namespace

void ParallelContext::check_config(const Config& c) {
  const int64_t tp = c.get_int("dist.tp"), pp = c.get_int("dist.pp");
  if (c.get_string("dist.backend") == "nccl") {
    ATH_CHECK(c.get_string("trainer.device") != "cpu", "config", "dist.backend is nccl but trainer.device is cpu: NCCL moves "
              "CUDA tensors", Hint{"use dist.backend mpi (or auto) to train on the CPU, or trainer.device cuda"});
    ATH_CHECK(dist::nccl_built(), "config", "dist.backend is nccl but this build has no NCCL",
              Hint{"build with CUDA and NCCL (nccl.h and libnccl beside the CUDA toolkit), or use dist.backend mpi: CUDA "
                   "tensors then go through MPI with host staging"});
  }
  ATH_CHECK(tp >= 1, "config", "dist.tp must be >= 1, got ", tp, Hint{"1 = no tensor parallelism"});
  ATH_CHECK(pp >= 1, "config", "dist.pp must be >= 1, got ", pp, Hint{"1 = no pipeline parallelism"});
  ATH_CHECK(c.get_int("dist.vocab_pad_multiple") >= 1, "config", "dist.vocab_pad_multiple must be >= 1, got ",
            c.get_int("dist.vocab_pad_multiple"), Hint{"128 pads the vocabulary to a multiple of 128 x tp; 1 = no padding"});
  const std::string& type = c.get_string("model.type");
  const bool lm = type == "gpt" || type == "llama";
  if (pp > 1) {
    ATH_CHECK(lm, "config", "dist.pp ", pp, " is not supported for model.type ", type,
              ": pipeline parallelism splits a language model's (gpt, llama) decoder blocks across stages",
              Hint{"set dist.pp: 1 and train the " + type + " data-parallel (mpirun -np N)"});
    const int64_t stage = c.get_int("dist.zero_stage");
    ATH_CHECK(stage <= 1, "config", "dist.zero_stage ", stage, " with dist.pp ", pp,
              ": a pipeline stage accumulates every micro-batch's gradient in full before the step's one reduction, so "
              "ZeRO-2's gradient partitioning would save no memory, and ZeRO-3 would all-gather each stage's parameters for "
              "every micro-batch's forward and again for its backward (DeepSpeed allows only ZeRO-1 with pipelines too)",
              Hint{"use dist.zero_stage 1 (optimizer state sharded over dp) or 0 with dist.pp > 1"});
    ATH_CHECK(!c.get_bool("observe.layer_norms"), "config", "observe.layer_norms cannot be used with dist.pp ", pp,
              ": each pipeline stage holds only its own layers", Hint{"turn observe.layer_norms off, or use dist.pp: 1"});
    const auto kind = dist::parse_schedule(c.get_string("dist.pp_schedule"));
    const int64_t v = c.get_int("dist.virtual_stages"), m = c.get_int("trainer.accum_steps");
    dist::check_schedule(kind, static_cast<int>(pp), static_cast<int>(m), static_cast<int>(v));
    // The layout: every stage gets a block (balanced, or as dist.pp_layers says).
    dist::PipelineLayout(c.get_int("model.n_layer"), static_cast<int>(pp), static_cast<int>(v), c.get_int_list("dist.pp_layers"));
  } else {
    ATH_CHECK(c.get_int("dist.virtual_stages") == 1, "config", "dist.virtual_stages is ", c.get_int("dist.virtual_stages"),
              " but dist.pp is 1: virtual stages are model chunks of a pipeline", Hint{"set dist.pp > 1, or dist.virtual_stages: 1"});
    ATH_CHECK(c.get_int_list("dist.pp_layers").empty(), "config", "dist.pp_layers is given but dist.pp is 1",
              Hint{"set dist.pp > 1, or remove dist.pp_layers"});
  }
  if (tp == 1) return;
  ATH_CHECK(lm, "config", "dist.tp ", tp, " is not supported for model.type ", type,
            ": tensor parallelism splits a language model's (gpt, llama) attention heads, MLP and vocabulary across ranks, and the " +
                type + " is not built from such layers",
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
  if (type == "llama") {
    // The Llama's kv heads and MLP are split too (dist::check_tensor_parallel_llama says the same
    // when the model is built; here the keys are named before any process starts work).
    const int64_t Hkv = c.get_int("model.n_kv_head") == 0 ? H : c.get_int("model.n_kv_head");
    ATH_CHECK(Hkv > 0 && (Hkv % tp == 0 || tp % Hkv == 0), "config", "model.n_kv_head (", Hkv, ") and dist.tp (", tp,
              ") do not divide one another: each tensor-parallel rank holds n_kv_head / tp key/value heads and the query heads "
              "of their groups; with fewer kv heads than ranks (multi-query attention: n_kv_head 1) each rank holds a replica of "
              "the one kv head its query heads read, which needs dist.tp a multiple of n_kv_head",
              Hint{"choose dist.tp dividing n_kv_head or a multiple of it that divides n_head"});
    int64_t I = c.get_int("model.intermediate_size");
    if (I == 0) I = (8 * c.get_int("model.n_embd") / 3 + 63) / 64 * 64;  // train::llama_config's default
    ATH_CHECK(I % tp == 0, "config", "model.intermediate_size (", I, ") is not divisible by dist.tp (", tp,
              "): the MLP's gate_proj / up_proj rows and down_proj columns are split across the tensor-parallel ranks",
              Hint{"choose intermediate_size a multiple of dist.tp (0 picks a multiple of 64), or another dist.tp"});
  }
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

ParallelContext::ParallelContext(const Config& c) {
  check_config(c);  // before any work, on every rank alike
  const int64_t tp = c.get_int("dist.tp"), pp = c.get_int("dist.pp");
  if (one_process(c)) {
    for (auto [n, key] : {std::pair{tp, "dist.tp"}, std::pair{pp, "dist.pp"}})
      ATH_CHECK(n == 1, "config", key, " is ", n, " but this run is one process (",
                c.get_string("dist.backend") == "none" ? "dist.backend none" : "not started by mpirun/srun with more than one process",
                std::string("): ") + (std::string(key) == "dist.tp" ? "tensor parallelism splits each layer across dist.tp processes"
                                                                     : "pipeline parallelism puts each stage in a process of its own"),
                Hint{"start it with mpirun -np " + std::to_string(tp * pp) + " (or a multiple of it) athanor train …, or set " + key +
                     ": 1"});
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
  world_group_ = dist::init_from_mpi();
  if (first) std::atexit([] { dist::finalize(); });  // mpirun treats an exit without MPI_Finalize as a failure
  // ATHANOR_DIST_TIMEOUT_S, when set, wins over the config (an operator's override for one launch).
  if (!std::getenv("ATHANOR_DIST_TIMEOUT_S"))
    world_group_->set_timeout(std::chrono::milliseconds(static_cast<int64_t>(c.get_float("dist.timeout_s") * 1000.0)));
  rank_ = world_group_->rank();
  world_ = world_group_->size();
  zero_stage_ = static_cast<int>(stage);
  dp_group_ = world_group_;
  world_group_->set_dimension("dp");  // without a mesh the world is the data-parallel dimension (the ledger's label)
  if (tp > 1 || pp > 1) {
    world_group_->set_dimension("world");
    // dp = world / (tp x pp): an Error naming the numbers when that is not whole (every rank).
    mesh_ = std::make_unique<dist::DeviceMesh>(
        dist::DeviceMesh::from_sizes(static_cast<int>(tp), static_cast<int>(pp), world_group_));
    for (const char* dim : dist::DeviceMesh::kDims) mesh_->group(dim)->set_timeout(world_group_->timeout());
    dp_group_ = mesh_->dp();
    tp_group_ = mesh_->tp();
    pp_group_ = mesh_->pp();
    tp_ = static_cast<int>(tp);
    pp_ = static_cast<int>(pp);
    pp_rank_ = mesh_->pp_index();
  }
  dp_rank_ = dp_group_->rank();
  dp_size_ = dp_group_->size();
}

ParallelContext::~ParallelContext() {
  // The NCCL communicators go with the run, not at exit (by then the CUDA runtime may be gone).
  if (backend_ != dist::Backend::nccl) return;
  try {
    if (mesh_)
      for (const char* dim : dist::DeviceMesh::kDims) mesh_->group(dim)->release_nccl();
    if (world_group_) world_group_->release_nccl();
  } catch (...) {
  }
}

Device ParallelContext::bind_device(Device requested, const Config& c) {
  if (!distributed() || requested.is_cpu()) return requested;
  Device d = requested;
#if ATHANOR_HAS_CUDA
  // trainer.device 'cuda' (no index) in a launch of several processes: each process its own
  // GPU of the host, by local rank (several processes share one when there are fewer GPUs).
  if (c.get_string("trainer.device") == "cuda")
    if (const int gpus = cuda::device_count(); gpus > 0) d = Device::cuda(dist::local_rank() % gpus);
#endif
  const std::string& name = c.get_string("dist.backend");
  const dist::Backend asked = name == "nccl" ? dist::Backend::nccl : name == "mpi" ? dist::Backend::mpi : dist::Backend::automatic;
  backend_ = dist::resolve_backend(asked, d);  // the same on every rank (it compares every rank's GPU)
  if (backend_ == dist::Backend::nccl) {
    // One communicator per group, in the same order on every rank (each a collective).
    world_group_->init_nccl(d.index);
    if (mesh_)
      for (const char* dim : dist::DeviceMesh::kDims) mesh_->group(dim)->init_nccl(d.index);
  }
  return d;
}

std::string ParallelContext::describe() const { return mesh_ ? mesh_->describe() : distributed() ? "dp " + std::to_string(world_) : "1 process"; }

// Doubles are summed exactly and in rank order on every rank (the collectives reduce f32 or
// i64): all-gather the bit patterns, then add locally, so every rank gets the same value.
// Over the dp group: the tp and pp ranks of a dp group hold the same (replicated) value.
double ParallelContext::sum_over_dp(double v) const {
  if (!distributed()) return v;
  Tensor in = full({1}, 0.0, {DType::i64});
  in.data_ptr<int64_t>()[0] = std::bit_cast<int64_t>(v);
  Tensor out = full({dp_size_}, 0.0, {DType::i64});
  dp_group_->all_gather(out, in);
  double sum = 0;
  for (int r = 0; r < dp_size_; ++r) sum += std::bit_cast<double>(out.data_ptr<int64_t>()[r]);
  return sum;
}

double ParallelContext::from_last_stage(double v) const {
  if (pp_ == 1) return v;
  Tensor t = from_vector(std::vector<double>{v}, {1}, TensorOptions(DType::f64));
  pp_group_->broadcast(t, pp_ - 1);
  return t.item();
}

bool ParallelContext::any_rank(bool v) const {
  if (!distributed()) return v;
  Tensor t = full({1}, v ? 1.0 : 0.0, {DType::i64});
  world_group_->all_reduce(t, dist::ReduceOp::max);
  return t.data_ptr<int64_t>()[0] != 0;
}

void ParallelContext::barrier() const {
  if (distributed()) world_group_->barrier();
}

std::shared_ptr<data::Sampler> ParallelContext::train_sampler(int64_t n, uint64_t seed) const {
  if (!distributed()) return nullptr;  // the loader's own random sampler (the same order as world 1 below)
  // Per dp rank: the tp and pp ranks of a dp group train on the same samples.
  return std::make_shared<dist::DistributedSampler>(data::random_sampler(n, seed), dp_rank_, dp_size_, /*drop_last=*/false);
}

void ParallelContext::bind_model(nn::Module& model) {
  bound_ = true;
  held_.clear();
  for (auto& [n, t] : model.state_dict()) held_.insert(n);
  if (auto* t = dynamic_cast<dist::TensorParallelLM*>(&model)) specs_ = t->shard_specs();
  if (auto* p = dynamic_cast<dist::PipelineLM*>(&model)) {
    specs_ = p->shard_specs();
    for (auto& n : p->duplicate_parameters()) duplicates_.insert(n);
  }
}

namespace {
std::string param_of(const std::string& key, bool optimizer_keys) {
  if (!optimizer_keys) return key;
  const auto dot = key.find('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}
}  // namespace

nn::StateDict ParallelContext::local(const nn::StateDict& logical, bool optimizer_keys) const {
  if (tp_ == 1 && pp_ == 1) return logical;
  ATH_ASSERT(bound_);
  nn::StateDict out;
  for (const auto& [name, t] : logical) {
    const std::string param = param_of(name, optimizer_keys);
    if (pp_ > 1 && !held_.count(param)) continue;  // another stage's
    out.emplace_back(name, tp_ > 1 ? dist::shard_of(t, dist::spec_of(specs_, param), name) : t);
  }
  return out;
}

nn::StateDict ParallelContext::logical(const nn::StateDict& local) const {
  if (tp_ == 1) return local;
  nn::StateDict out;
  for (const auto& [name, t] : local) out.emplace_back(name, dist::gather_shards(t, dist::spec_of(specs_, name), *tp_group_));
  return out;
}

nn::StateDict ParallelContext::gather_stages(const nn::StateDict& logical) const {
  if (pp_ == 1) return logical;
  // Only the pp group of dp rank 0 and tp rank 0 takes part (a pp group shares its dp and tp indices).
  if (dp_rank_ != 0 || (tp_group_ && tp_group_->rank() != 0)) return {};
  nn::StateDict mine;
  std::string desc;
  for (const auto& [n, t] : logical) {
    if (duplicates_.count(n)) continue;
    mine.emplace_back(n, t.contiguous());
    desc += n + "\t" + dtype_name(t.dtype()) + "\t";
    for (int64_t s : t.sizes()) desc += std::to_string(s) + ",";
    desc += "\n";
  }
  const auto all = dist::all_gather_strings(*pp_group_, desc);
  constexpr int kTag = 29001;  // one stream per sender: MPI keeps its order
  if (pp_rank_ != 0) {
    std::vector<dist::WorkPtr> sends;
    for (auto& [n, t] : mine) sends.push_back(pp_group_->send_async(t, 0, kTag));
    for (auto& w : sends) w->wait();
    return {};
  }
  nn::StateDict out = mine;
  for (int s = 1; s < pp_; ++s) {
    std::vector<dist::WorkPtr> recvs;
    std::size_t pos = 0;
    const std::string& d = all[static_cast<std::size_t>(s)];
    while (pos < d.size()) {
      const auto eol = d.find('\n', pos);
      const std::string line = d.substr(pos, eol - pos);
      pos = eol + 1;
      const auto t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
      Shape shape;
      std::string dims = line.substr(t2 + 1);
      for (std::size_t a = 0, b; (b = dims.find(',', a)) != std::string::npos; a = b + 1) shape.push_back(std::stoll(dims.substr(a, b - a)));
      Tensor t = empty(shape, TensorOptions(dtype_from_name(line.substr(t1 + 1, t2 - t1 - 1))));
      recvs.push_back(pp_group_->recv_async(t, s, kTag));
      out.emplace_back(line.substr(0, t1), t);
    }
    for (auto& w : recvs) w->wait();
  }
  return out;
}

ckpt::TensorFile ParallelContext::checkpoint_part(const std::string& prefix, const nn::StateDict& local, bool optimizer_keys,
                                                 const std::map<std::string, std::string>& meta) const {
  ckpt::TensorFile f{prefix, {}, meta};
  for (const auto& [name, t] : local) {
    const std::string param = param_of(name, optimizer_keys);
    if (duplicates_.count(param)) continue;  // the first stage writes the tied embedding (and its state)
    if (tp_ == 1) {
      f.tensors.emplace_back(name, t);
      continue;
    }
    // Replicated tensors: tp rank 0's copy. Shards: each tp rank its slice's real rows, which the
    // index maps onto the logical tensor (sharded_checkpoint.h); a slice of padding only is not written.
    const dist::ShardSpec s = dist::spec_of(specs_, param);
    if (!s.sharded()) {
      if (tp_group_->rank() == 0) f.tensors.emplace_back(name, t);
      continue;
    }
    if (s.real_rows(s.index) == 0) continue;
    f.tensors.emplace_back(name, dist::real_part(t, s));
    f.slices[name] = s;
  }
  return f;
}

std::map<std::string, double> ParallelContext::merge_over_stages(const std::map<std::string, double>& mine) const {
  if (pp_ == 1) return mine;
  std::map<std::string, double> out;
  for (const std::string& s : dist::all_gather_strings(*pp_group_, nlohmann::json(mine).dump()))
    for (auto& [k, v] : nlohmann::json::parse(s).get<std::map<std::string, double>>()) out.emplace(k, v);
  return out;
}

void ParallelContext::maybe_kill_for_test(int64_t step) const {
  static const int kill_rank = env_int("ATHANOR_TEST_KILL_RANK", -1), kill_step = env_int("ATHANOR_TEST_KILL_STEP", -1);
  if (kill_rank == rank_ && kill_step == step) {
    std::fprintf(stderr, "rank %d: ATHANOR_TEST_KILL_RANK/STEP: killing myself in step %d\n", rank_, kill_step);
    std::fflush(stderr);
    ::raise(SIGKILL);
  }
}

}  // namespace athanor::train
