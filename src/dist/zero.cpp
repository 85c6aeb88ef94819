// dist::DataParallel: DDP and ZeRO stages 1/2 (stage 3 in zero3.cpp) with parameter-granular ownership
// (contract and the reasons for the scheme in include/athanor/dist/zero.h).
#include "athanor/dist/zero.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>
#include <sstream>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/convert.h"
#include "athanor/core/error.h"
#include "dist/unused_parameters.h"
#include "athanor/ops/shape.h"
#include "athanor/optim/clip.h"
#include "optim/device_update.h"

namespace athanor::dist {

namespace {

Tensor view_of(const Tensor& flat, const Tensor& like, int64_t offset) {
  return make_view(flat, like.sizes(), contiguous_strides(like.sizes()), offset);
}

// Multiplies every element of `g` by `coef` in place, exactly as optim::clip_grad_norm does
// (on a CUDA gradient: its device pass, queued on the compute stream).
void scale_in_place(Tensor g, double coef) {
  if (!g.device().is_cpu()) {
    ATH_CHECK(g.dtype() == DType::f32 && g.is_contiguous(), "DataParallel.clip_grad_norm",
              "not yet supported on cuda: clipping the gradient ", g.describe(), " (the device pass scales contiguous f32)",
              Hint{"keep the master weights in f32 (trainer.precision bf16 autocasts, the parameters stay f32)"});
    optim::detail::scale_on_device(g.device().index, {static_cast<float*>(g.device_data())}, {g.numel()}, coef);
    g.bump_version();
    return;
  }
  dispatch(g.dtype(), [&]<class T>() {
    if constexpr (is_float_type_v<T>) {
      T* d = static_cast<T*>(g.raw_data());
      const int64_t n = g.numel();
      for (int64_t i = 0; i < n; ++i) d[i] = cast_value<T>(cast_value<double>(d[i]) * coef);
    }
  });
  g.bump_version();
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> group,
                           OptimizerFactory make_optimizer, DataParallelOptions opts)
    : module_(std::move(module)), group_(std::move(group)), opts_(opts) {
  ATH_CHECK(module_ != nullptr, "DataParallel", "got no module");
  ATH_CHECK(group_ != nullptr, "DataParallel", "got no process group",
            Hint{"pass dist::init_from_mpi() or a DeviceMesh's dp() group"});
  ATH_CHECK(make_optimizer != nullptr, "DataParallel", "got no optimizer factory");
  ATH_CHECK(opts_.bucket_mb > 0, "DataParallel", "bucket_mb must be positive, got ", opts_.bucket_mb);
  ATH_CHECK(opts_.zero_stage >= 0 && opts_.zero_stage <= 3, "DataParallel", "zero_stage ", opts_.zero_stage,
            " is not supported", Hint{"use zero_stage 0 (DDP), 1 (sharded optimizer state), 2 (plus sharded "
                                      "gradients) or 3 (plus sharded parameters of the shard_modules / FullyShardedBlocks)"});
  ATH_CHECK(opts_.shard_modules.empty() || opts_.zero_stage == 3, "DataParallel", "shard_modules names ",
            opts_.shard_modules.size(), " module(s) (first '", opts_.shard_modules.empty() ? "" : opts_.shard_modules[0],
            "') but zero_stage is ", opts_.zero_stage, ": only stage 3 shards parameters",
            Hint{"set zero_stage 3, or leave shard_modules empty"});
  const int n = group_->size(), me = group_->rank();

  // Before anything touches the parameters: a unit already sharded elsewhere has no data to broadcast.
  if (opts_.zero_stage == 3) setup_units();
  if (opts_.zero_stage <= 1) {
    // DDP broadcasts rank 0's parameters and reduces the full gradients.
    ddp_ = std::make_unique<DistributedDataParallel>(module_, group_, DDPOptions{.bucket_cap_mb = opts_.bucket_mb});
  } else {
    NoGradGuard ng;
    for (auto& [name, p] : module_->named_parameters()) group_->broadcast(p, 0);
    for (auto& [name, b] : module_->named_buffers()) group_->broadcast(b, 0);
  }

  for (auto& [name, p] : module_->named_parameters())
    if (p.requires_grad()) {
      index_[name] = static_cast<int>(params_.size());
      params_.push_back(Param{name, p});
    }

  // Buckets in reverse registration order, one dtype each, capped in bytes (as DDP).
  const double cap = opts_.bucket_mb * 1024.0 * 1024.0;
  // Stage 3: the parameters of one sharding unit form a bucket of their own.
  std::vector<int64_t> bucket_bytes;
  std::vector<int> bucket_block;  // block index per bucket, -1 for ordinary buckets
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
    Param& p = params_[i];
    const DType dt = p.tensor.dtype();
    const double bytes = static_cast<double>(p.tensor.nbytes());
    const int blk = opts_.zero_stage == 3 ? block_of(p.name) : -1;
    const bool fits = !buckets_.empty() && bucket_block.back() == blk && buckets_.back().dtype == dt &&
                      buckets_.back().device == p.tensor.device() &&
                      (blk >= 0 || static_cast<double>(bucket_bytes.back()) + bytes <= cap);
    if (!fits) {
      buckets_.emplace_back();
      buckets_.back().dtype = dt;
      buckets_.back().device = p.tensor.device();
      buckets_.back().block = blk >= 0;
      bucket_bytes.push_back(0);
      bucket_block.push_back(blk);
      if (blk >= 0) {
        ATH_CHECK(units_[blk].bucket < 0, "DataParallel", "the parameters of sharding unit '", units_[blk].path,
                  "' are not contiguous in registration order",
                  Hint{"choose units whose parameters are registered together (one module subtree each)"});
        units_[blk].bucket = static_cast<int>(buckets_.size()) - 1;
      }
    }
    p.bucket = static_cast<int>(buckets_.size()) - 1;
    bucket_bytes.back() += static_cast<int64_t>(p.tensor.nbytes());
    buckets_.back().params.push_back(i);
  }

  // Ownership: greedy, largest first inside each bucket, to the least-loaded rank overall.
  std::vector<int64_t> load(n, 0);
  for (auto& b : buckets_) {
    std::vector<int> order = b.params;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int c) { return params_[a].tensor.numel() > params_[c].tensor.numel(); });
    std::vector<int64_t> seg_fill(n, 0);
    for (int i : order) {
      const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      Param& p = params_[i];
      p.owner = opts_.zero_stage == 0 ? me : r;
      p.writer = r;  // at stage 0 every rank holds everything: the balanced owner still writes it
      p.seg_offset = seg_fill[r];
      seg_fill[r] += p.tensor.numel();
      load[r] += p.tensor.numel();
    }
    b.seg = *std::max_element(seg_fill.begin(), seg_fill.end());
    b.owned = seg_fill[me];
    b.pending = static_cast<int>(b.params.size());
  }

  optim::NamedTensors owned;
  for (auto& p : params_)
    if (p.owner == me) owned.emplace_back(p.name, p.tensor);
  optimizer_ = make_optimizer(owned);
  ATH_CHECK(optimizer_ != nullptr, "DataParallel", "the optimizer factory returned no optimizer");

  if (opts_.zero_stage >= 2) {
    // Only the owned elements are kept: the padding of the segment lives while a bucket is in flight.
    for (auto& b : buckets_) b.shard = zeros({b.owned}, TensorOptions(b.dtype).with_device(b.device).with_tag(MemTag::gradient));
    for (int i = 0; i < static_cast<int>(params_.size()); ++i)
      params_[i].hook = params_[i].tensor.register_post_accumulate_grad_hook([this, i](Tensor&) { on_grad_ready(i); });
  }
  if (opts_.zero_stage == 3) {
    // On the parameters' device: a released parameter still reads as a tensor of its device.
    const Device dev = params_.empty() ? Device::cpu() : params_.front().tensor.device();
    for (const Param& p : params_)
      ATH_CHECK(p.tensor.device() == dev, "DataParallel", "zero_stage 3 needs every parameter on one device; '",
                params_.front().name, "' is on ", dev.str(), " and '", p.name, "' on ", p.tensor.device().str(),
                Hint{"move the whole model to one device (module.to(device)) before wrapping it"});
    released_ = zeros({1}, TensorOptions().with_device(dev).with_tag(MemTag::parameter));
    for (int bi = 0; bi < static_cast<int>(buckets_.size()); ++bi)
      if (buckets_[bi].block) {
        buckets_[bi].bwd_pending = static_cast<int>(buckets_[bi].params.size());
        release_block(bi);  // from here on each rank holds only its own block parameters
      }
    install_interceptors();
  }
}

DataParallel::~DataParallel() {
  for (auto& p : params_)
    if (p.hook >= 0) p.tensor.remove_hook(p.hook);
  for (auto& b : buckets_)
    if (b.work) {
      try { b.work->wait(); } catch (...) {}
    }
  if (opts_.zero_stage == 3) {
    // Leave the model whole, as it was handed in.
    for (auto& u : units_) u.module->set_forward_interceptor(nullptr);
    full_depth_ = 0;
    try {
      MemTagScope tag(MemTag::parameter);
      for (int bi = 0; bi < static_cast<int>(buckets_.size()); ++bi) {
        if (!buckets_[bi].block) continue;
        gather_block(bi);
        // Each parameter gets storage of its own again, so the gathered buffer goes.
        for (int i : buckets_[bi].params) {
          if (params_[i].owner == group_->rank()) continue;
          Tensor own = params_[i].tensor.detach().clone();
          TensorImpl* impl = params_[i].tensor.impl();
          impl->storage = own.impl()->storage;
          impl->offset = own.impl()->offset;
          impl->strides = own.impl()->strides;
        }
      }
    } catch (...) {}
  }
}

DataParallel::NoSync::NoSync(DataParallel& d) : d_(&d), prev_(d.sync_) {
  d.sync_ = false;
  if (d.ddp_) ddp_ = std::make_unique<DistributedDataParallel::NoSync>(d.ddp_->no_sync());
}
DataParallel::NoSync::~NoSync() {
  if (d_) d_->sync_ = prev_;
}
DataParallel::NoSync::NoSync(NoSync&& o) noexcept : d_(o.d_), prev_(o.prev_), ddp_(std::move(o.ddp_)) { o.d_ = nullptr; }

int DataParallel::owner_of(const std::string& param) const {
  auto it = index_.find(param);
  ATH_CHECK(it != index_.end(), "DataParallel.owner_of", "no trainable parameter named '", param, "'");
  return params_[it->second].owner;
}

std::vector<std::string> DataParallel::owned_parameters() const {
  std::vector<std::string> out;
  for (auto& p : params_)
    if (p.owner == group_->rank()) out.push_back(p.name);
  return out;
}

// ---- stage 2: reduce-scatter of packed buckets from the post-accumulate hooks

void DataParallel::on_grad_ready(int index) {
  Param& p = params_[index];
  const bool block = buckets_[p.bucket].block;
  // A stage-3 unit parameter used outside its unit too (a tie the unit cannot see, e.g. a weight
  // read directly by another layer) gets one gradient from each use.
  ATH_CHECK(!(sync_ && p.ready && block), "DataParallel", "parameter '", p.name,
            "' of a sharding unit received a gradient twice in one synchronised step: is it also used outside its "
            "unit (tied weights)?",
            Hint{"leave modules whose parameters are used elsewhere out of shard_modules (GPT's wte is tied to the "
                 "lm_head); otherwise call finish_backward() after each backward"});
  if (block) on_block_grad(p.bucket);  // also inside no_sync(): the block is done
  if (!sync_) return;
  ATH_CHECK(!p.ready, "DataParallel", "parameter '", p.name, "' received a gradient twice in one synchronised step",
            Hint{"call finish_backward() after each backward, or run the non-final micro-batches inside no_sync()"});
  p.ready = true;
  step_active_ = true;
  if (--buckets_[p.bucket].pending == 0) launch_ready_buckets();
  // Progress the buckets in flight (MPI advances a nonblocking collective only inside its calls).
  // Their packed inputs are freed in drain(), not here as soon as a test() succeeds: when a peer
  // finishes is a matter of timing, and freeing then made the rank's peak memory differ from run
  // to run (dp2 ZeRO-3 bf16: 3.63 or 3.85 MiB). The peak is the same either way in the worst
  // case, which is the one a device must hold; now it is also the one every run reaches.
  for (auto& b : buckets_)
    if (b.work) (void)b.work->test();
}

void DataParallel::launch_ready_buckets() {
  while (next_launch_ < static_cast<int>(buckets_.size()) && buckets_[next_launch_].pending == 0) launch(next_launch_++);
}

// Waits for bucket bi's reduce-scatter, keeps the owned part, frees the transient buffers.
void DataParallel::drain(int bi) {
  Bucket& b = buckets_[bi];
  if (!b.work) return;
  b.work->wait();
  b.work.reset();
  b.packed = Tensor();
  if (b.owned > 0) copy_into(b.shard, narrow(b.received, 0, 0, b.owned));
  b.received = Tensor();
  for (int i : b.params) {
    Param& p = params_[i];
    if (p.owner == group_->rank()) p.tensor.set_grad(view_of(b.shard, p.tensor, p.seg_offset));
  }
}

void DataParallel::launch(int bi) {
  // Bound the transient gradient memory: at most kMaxInFlight buckets reduce at once.
  if (bi >= kMaxInFlight) drain(bi - kMaxInFlight);
  Bucket& b = buckets_[bi];
  const int n = group_->size();
  b.packed = zeros({b.seg * n}, TensorOptions(b.dtype).with_device(b.device).with_tag(MemTag::gradient));
  for (int i : b.params) {
    Param& p = params_[i];
    Tensor g = p.tensor.grad();
    ATH_ASSERT(g.defined());
    copy_into(view_of(b.packed, g, p.owner * b.seg + p.seg_offset), g);
    p.tensor.set_grad(Tensor());  // the full gradient is not kept: the owner gets the reduced one
  }
  b.received = empty({b.seg}, TensorOptions(b.dtype).with_device(b.device).with_tag(MemTag::gradient));
  b.work = group_->reduce_scatter_async(b.received, b.packed, ReduceOp::avg);
}

void DataParallel::reset_step() {
  for (auto& p : params_) p.ready = false;
  for (auto& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.work.reset();
    b.packed = Tensor();
    b.received = Tensor();
  }
  next_launch_ = 0;
  step_active_ = false;
}

void DataParallel::finish_backward() {
  if (ddp_) {
    ddp_->finish();
    sum_sequence_parallel_grads();
    return;
  }
  if (!step_active_) {
    reset_step();
    return;
  }
  fail_if_unused("DataParallel", params_, buckets_, [this] { reset_step(); });
  launch_ready_buckets();
  for (int bi = 0; bi < static_cast<int>(buckets_.size()); ++bi) drain(bi);
  reset_step();
  sum_sequence_parallel_grads();
}

void DataParallel::sum_sequence_parallel_grads() {
  if (!tensor_parallel()) return;
  // Every tp rank holds the same parameters in the same order (equal shard shapes give equal
  // ownership), so the ranks post the same all-reduces. One per dtype, over a flat buffer.
  std::map<DType, std::vector<Tensor>> by_dtype;
  for (auto& p : params_)
    if (spec_of(opts_.tp_specs, p.name).sum_grad_over_tp && holds_grad(p) && p.tensor.grad().defined())
      by_dtype[p.tensor.grad().dtype()].push_back(p.tensor.grad());
  NoGradGuard ng;
  for (auto& [dt, grads] : by_dtype) {
    int64_t n = 0;
    for (auto& g : grads) n += g.numel();
    Tensor flat = empty({n}, TensorOptions(dt).with_device(grads.front().device()).with_tag(MemTag::gradient));
    int64_t off = 0;
    for (auto& g : grads) {
      copy_into(view_of(flat, g, off), g);
      off += g.numel();
    }
    opts_.tp_group->all_reduce(flat, ReduceOp::sum);
    off = 0;
    for (auto& g : grads) {
      copy_into(g, view_of(flat, g, off));
      g.bump_version();
      off += g.numel();
    }
  }
}

double DataParallel::grad_norm() {
  if (tensor_parallel() || pipeline_parallel()) {
    // Each logical gradient counted once: shards are disjoint parts of their logical tensors
    // (each rank's counts); replicated parameters hold the same gradient on every tp rank
    // (counted on tp rank 0); a stage's copy of another stage's parameter not at all.
    std::vector<Tensor> sharded, replicated;
    for (auto& p : params_)
      if (holds_grad(p) && !opts_.norm_excluded.count(p.name))
        (spec_of(opts_.tp_specs, p.name).sharded() ? sharded : replicated).push_back(p.tensor);
    const bool tp_first = !tensor_parallel() || opts_.tp_group->rank() == 0;
    const double a = optim::grad_norm(sharded), b = tp_first ? optim::grad_norm(replicated) : 0.0;
    Tensor sq = from_vector(std::vector<double>{a * a + b * b}, {1}, TensorOptions(DType::f64));
    if (opts_.zero_stage >= 2) group_->all_reduce(sq, ReduceOp::sum);  // the owners' parts
    if (tensor_parallel()) opts_.tp_group->all_reduce(sq, ReduceOp::sum);
    if (pipeline_parallel()) opts_.pp_group->all_reduce(sq, ReduceOp::sum);
    return std::sqrt(sq.item());
  }
  if (opts_.zero_stage < 2) return optim::grad_norm(module_->parameters());
  std::vector<Tensor> owned;
  for (auto& p : params_)
    if (p.owner == group_->rank()) owned.push_back(p.tensor);
  const double local = optim::grad_norm(owned);
  Tensor sq = from_vector(std::vector<double>{local * local}, {1}, TensorOptions(DType::f64));
  group_->all_reduce(sq, ReduceOp::sum);
  return std::sqrt(sq.item());
}

double DataParallel::clip_grad_norm(double max_norm) {
  ATH_CHECK(max_norm > 0, "DataParallel.clip_grad_norm", "max_norm must be > 0, got ", max_norm);
  if (opts_.zero_stage < 2 && !tensor_parallel() && !pipeline_parallel()) return optim::clip_grad_norm(module_->parameters(), max_norm);
  const double norm = grad_norm();
  if (!std::isfinite(norm)) return norm;
  const double coef = max_norm / (norm + 1e-6);  // the formula of optim::clip_grad_norm
  if (coef >= 1.0) return norm;
  for (auto& p : params_)
    if (holds_grad(p) && p.tensor.grad().defined()) scale_in_place(p.tensor.grad(), coef);
  return norm;
}

void DataParallel::step() {
  optimizer_->step();
  if (opts_.zero_stage >= 1 && group_->size() > 1) all_gather_parameters();
}

void DataParallel::zero_grad() {
  module_->zero_grad();
}

void DataParallel::all_gather_parameters() {
  NoGradGuard ng;
  const int n = group_->size(), me = group_->rank();
  std::vector<Tensor> ins, outs;
  std::vector<WorkPtr> works;
  for (auto& b : buckets_) {
    if (b.block) continue;  // stage 3: sharded at rest, gathered by its block's forward
    Tensor in = zeros({b.seg}, TensorOptions(b.dtype).with_device(b.device).with_tag(MemTag::workspace));
    Tensor out = empty({b.seg * n}, TensorOptions(b.dtype).with_device(b.device).with_tag(MemTag::workspace));
    for (int i : b.params)
      if (params_[i].owner == me) copy_into(view_of(in, params_[i].tensor, params_[i].seg_offset), params_[i].tensor);
    works.push_back(group_->all_gather_async(out, in));
    ins.push_back(in);
    outs.push_back(out);
  }
  for (std::size_t bi = 0, k = 0; bi < buckets_.size(); ++bi) {
    const Bucket& b = buckets_[bi];
    if (b.block) continue;
    works[k]->wait();
    const Tensor& out = outs[k++];
    for (int i : b.params) {
      Param& p = params_[i];
      if (p.owner == me) continue;
      copy_into(p.tensor, view_of(out, p.tensor, p.owner * b.seg + p.seg_offset));
      p.tensor.bump_version();
    }
  }
}

// ---- checkpoints under logical names

optim::NamedTensors DataParallel::full_optimizer_state() {
  if (opts_.zero_stage == 0 || group_->size() == 1) return optimizer_->state_tensors();
  NoGradGuard ng;
  const int me = group_->rank();
  // 1. the union of state kinds ("exp_avg", …) over the ranks
  std::set<std::string> mine;
  auto local = optimizer_->state_tensors();
  std::map<std::string, Tensor> by_key(local.begin(), local.end());
  for (auto& [key, t] : local) mine.insert(key.substr(0, key.find('.')));
  std::string joined;
  for (auto& s : mine) joined += s + ",";
  std::set<std::string> kinds;
  for (const std::string& theirs : all_gather_strings(*group_, joined)) {
    std::stringstream ss(theirs);
    for (std::string k; std::getline(ss, k, ',');)
      if (!k.empty()) kinds.insert(k);
  }
  // 2. which (kind, parameter) exist at their owner
  std::vector<std::string> kind_list(kinds.begin(), kinds.end());
  const std::size_t P = params_.size();
  std::vector<double> present(kind_list.size() * P, 0.0);
  for (std::size_t k = 0; k < kind_list.size(); ++k)
    for (std::size_t i = 0; i < P; ++i)
      if (params_[i].owner == me && by_key.count(kind_list[k] + "." + params_[i].name)) present[k * P + i] = 1;
  Tensor pres = from_vector(present, {static_cast<int64_t>(present.size())}, TensorOptions(DType::f64));
  if (!present.empty()) group_->all_reduce(pres, ReduceOp::sum);
  const auto flags = pres.to_vector();
  // 3. every owner broadcasts its state tensors, in registration order
  optim::NamedTensors out;
  for (std::size_t i = 0; i < P; ++i)
    for (std::size_t k = 0; k < kind_list.size(); ++k) {
      if (flags.empty() || flags[k * P + i] == 0) continue;
      const std::string key = kind_list[k] + "." + params_[i].name;
      Tensor t;
      // On the host whatever the optimizer's device (a checkpoint's tensors go to the host anyway,
      // and every rank of the broadcast must pass a tensor of the same kind: NCCL or MPI).
      if (params_[i].owner == me) {
        const Tensor& src = by_key.at(key);
        t = src.device().is_cpu() ? src.clone() : src.detach().to(Device::cpu());
      } else {
        const DType dt = params_[i].tensor.dtype() == DType::f64 ? DType::f64 : DType::f32;
        t = empty(params_[i].tensor.sizes(), TensorOptions(dt).with_tag(MemTag::optimizer_state));
      }
      group_->broadcast(t, params_[i].owner);
      out.emplace_back(key, t);
    }
  return out;
}

std::map<std::string, double> DataParallel::full_optimizer_scalars() {
  auto local = optimizer_->state_scalars();
  if (opts_.zero_stage == 0 || group_->size() == 1) return local;
  // "steps" is the same everywhere, "step.<param>" lives at the owner, "lr.<group>" at every
  // rank that has the group: the union of every rank's scalars is the unsharded set.
  char buf[64];
  std::string mine;
  for (auto& [k, v] : local) {
    std::snprintf(buf, sizeof buf, "%.17g", v);
    mine += k + "=" + buf + "\n";
  }
  std::map<std::string, double> out;
  for (const std::string& theirs : all_gather_strings(*group_, mine)) {
    std::stringstream ss(theirs);
    for (std::string line; std::getline(ss, line);) {
      const auto eq = line.rfind('=');
      if (eq != std::string::npos) out[line.substr(0, eq)] = std::stod(line.substr(eq + 1));
    }
  }
  return out;
}

nn::StateDict DataParallel::local_state_dict() {
  const int me = group_->rank();
  nn::StateDict out;
  for (auto& [name, t] : module_->state_dict()) {
    auto it = index_.find(name);
    // Buffers, frozen parameters and second names of a tied parameter: rank 0.
    if (it == index_.end() ? me == 0 : params_[it->second].writer == me) out.emplace_back(name, t);
  }
  return out;
}

optim::NamedTensors DataParallel::local_optimizer_state() {
  const int me = group_->rank();
  optim::NamedTensors out;
  for (auto& [key, t] : optimizer_->state_tensors()) {
    auto it = index_.find(key.substr(key.find('.') + 1));  // "<state>.<parameter>"
    ATH_ASSERT(it != index_.end());
    if (params_[it->second].writer == me) out.emplace_back(key, t);
  }
  return out;
}

nn::StateDict DataParallel::full_state_dict() {
  gather_all_blocks();
  nn::StateDict out;
  for (auto& [name, t] : module_->state_dict()) out.emplace_back(name, t.detach().clone());
  release_all_blocks();
  return out;
}

void DataParallel::load_full_state_dict(const nn::StateDict& state) {
  if (opts_.zero_stage == 3 && full_depth_ == 0) {
    // Every name and shape is checked, but only what this rank holds is copied: its own unit
    // parameters and everything outside the units (no gather: a rank reads ~1/N of the units).
    const int me = group_->rank();
    std::set<const TensorImpl*> released;
    for (const Param& p : params_)
      if (buckets_[p.bucket].block && p.owner != me) released.insert(p.tensor.impl());
    std::map<std::string, const TensorImpl*> impl_of;
    for (auto& [name, t] : module_->state_dict()) impl_of[name] = t.impl();
    module_->load_state_dict(state, /*strict=*/true, [&](const std::string& name) {
      auto it = impl_of.find(name);
      return it != impl_of.end() && released.count(it->second) > 0;
    });
    return;
  }
  gather_all_blocks();
  // Owners keep what they loaded; the gathered copies of the others are dropped by the release.
  try {
    module_->load_state_dict(state);
  } catch (...) {
    release_all_blocks();
    throw;
  }
  release_all_blocks();
}

void DataParallel::load_full_optimizer_state(const optim::NamedTensors& tensors,
                                             const std::map<std::string, double>& scalars) {
  const int me = group_->rank();
  optim::NamedTensors mine;
  for (auto& [key, t] : tensors) {
    const auto dot = key.find('.');
    ATH_CHECK(dot != std::string::npos, "DataParallel.load_full_optimizer_state", "state key '", key,
              "' is not '<state>.<parameter>'");
    auto it = index_.find(key.substr(dot + 1));
    ATH_CHECK(it != index_.end(), "DataParallel.load_full_optimizer_state", "state '", key,
              "' names parameter '", key.substr(dot + 1), "' which the model does not have (or is frozen)",
              Hint{"the checkpoint was saved from a different model"});
    if (params_[it->second].owner == me) mine.emplace_back(key, t);
  }
  std::map<std::string, double> my_scalars;
  for (auto& [k, v] : scalars) {
    if (k.rfind("step.", 0) == 0) {
      auto it = index_.find(k.substr(5));
      if (it == index_.end() || params_[it->second].owner != me) continue;
    }
    my_scalars[k] = v;
  }
  optimizer_->load_state(mine, my_scalars);
}

}  // namespace athanor::dist
