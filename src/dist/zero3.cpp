// ZeRO stage 3: the sharding units (shard_modules, FullyShardedBlock), their forward
// interceptors, and the gather/release of a unit's parameters (contract in
// include/athanor/dist/zero.h).
#include <map>
#include <set>
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
  nn::UnaryModule* blk = block.get();
  // The wrapper is the unit: a stage-3 DataParallel intercepts this call (gather, checkpoint, release).
  return run_forward(x, [blk](const Tensor& in) { return blk->forward(in); });
}

namespace {
bool is_under(const std::string& path, const std::string& unit) {
  return unit.empty() || path == unit || path.rfind(unit + ".", 0) == 0;
}
}  // namespace

void DataParallel::setup_units() {
  const auto modules = module_->named_modules();
  std::map<std::string, std::shared_ptr<nn::Module>> by_path(modules.begin(), modules.end());
  std::set<std::string> seen;
  auto add = [&](const std::string& path, std::shared_ptr<nn::Module> m) {
    if (!seen.insert(path).second) return;  // a FullyShardedBlock also named in shard_modules
    ATH_CHECK(!m->has_forward_interceptor(), "DataParallel", "sharding unit '", path,
              "' already has a forward interceptor (is it sharded by another DataParallel?)",
              Hint{"one stage-3 DataParallel per model; destroy the old one first"});
    units_.push_back(Unit{path, std::move(m), -1});
  };
  for (const std::string& path : opts_.shard_modules) {
    auto it = by_path.find(path);
    if (it == by_path.end()) {
      std::string some;
      int listed = 0;
      for (auto& [p, m] : modules)
        if (!p.empty() && !m->named_parameters().empty() && listed++ < 8) some += (some.empty() ? "'" : ", '") + p + "'";
      ATH_FAIL("DataParallel", "shard_modules names '", path, "', which is not a module of the model",
               Hint{"use paths as named_modules() spells them, e.g. " + some});
    }
    ATH_CHECK(!path.empty(), "DataParallel", "shard_modules names the root module ''",
              Hint{"name the repeated blocks (e.g. GPT::shard_units()), not the whole model"});
    add(path, it->second);
  }
  for (auto& [path, m] : modules)
    if (std::dynamic_pointer_cast<FullyShardedBlock>(m)) add(path, m);
  ATH_CHECK(!units_.empty(), "DataParallel",
            "zero_stage 3 found no sharding unit: shard_modules is empty and the model has no FullyShardedBlock",
            Hint{"name the model's repeated blocks in DataParallelOptions::shard_modules (GPT::shard_units(), "
                 "MLP::shard_units()) or wrap them: std::make_shared<dist::FullyShardedBlock>(block)"});
  for (std::size_t a = 0; a < units_.size(); ++a)
    for (std::size_t b = 0; b < units_.size(); ++b)
      ATH_CHECK(a == b || !is_under(units_[b].path, units_[a].path), "DataParallel", "sharding unit '", units_[b].path,
                "' is nested in unit '", units_[a].path, "'",
                Hint{"shard either the outer module or the inner ones, not both"});
  // Every name a unit's parameter has in the model (tied weights are registered under several).
  std::map<const TensorImpl*, std::vector<std::string>> names;
  for (auto& [name, t] : module_->state_dict()) names[t.impl()].push_back(name);
  for (const Unit& u : units_) {
    bool trainable = false;
    for (auto& [local, t] : u.module->named_parameters()) {
      trainable = trainable || t.requires_grad();
      for (const std::string& name : names[t.impl()])
        ATH_CHECK(is_under(name, u.path), "DataParallel", "parameter '", u.path, ".", local, "' of sharding unit '",
                  u.path, "' is also used outside it, as '", name, "' (tied weights)",
                  Hint{"a unit only gathers its own parameters: leave modules whose parameters are shared out of "
                       "shard_modules (GPT's wte is tied to the lm_head and stays unsharded)"});
    }
    ATH_CHECK(trainable, "DataParallel", "sharding unit '", u.path, "' has no trainable parameter",
              Hint{"name only modules with parameters in shard_modules"});
  }
}

void DataParallel::install_interceptors() {
  for (const Unit& u : units_) {
    const int bi = u.bucket;
    ATH_ASSERT(bi >= 0);
    u.module->set_forward_interceptor([this, bi](const Tensor& x, const nn::Module::ForwardFn& forward) -> Tensor {
      buckets_[bi].intercepted = true;
      if (full_depth_ > 0) return forward(x);  // everything is gathered: run it as it is
      auto run = [this, bi, forward](const Tensor& in) {
        gather_block(bi);  // in the forward, and again in the checkpoint's recompute during backward
        return forward(in);
      };
      // Under checkpoint() nothing of the unit is saved for backward, so releasing the
      // gathered parameters right after the forward really frees them.
      Tensor y = grad_enabled() ? checkpoint(run, x) : run(x);
      release_block(bi);
      return y;
    });
  }
}

std::vector<std::string> DataParallel::shard_units() const {
  std::vector<std::string> out;
  for (const Unit& u : units_) out.push_back(u.path);
  return out;
}

int DataParallel::block_of(const std::string& param) const {
  for (int k = 0; k < static_cast<int>(units_.size()); ++k)
    if (is_under(param, units_[k].path)) return k;
  return -1;
}

void DataParallel::gather_block(int bi) {
  Bucket& b = buckets_[bi];
  if (!b.block || b.gathered) return;
  NoGradGuard ng;
  const int n = group_->size(), me = group_->rank();
  // Gathered parameters are parameters: tag them so (per rank: owned + blocks in use).
  Tensor in = zeros({b.seg}, TensorOptions(b.dtype).with_device(b.device).with_tag(MemTag::parameter));
  Tensor out = empty({b.seg * n}, TensorOptions(b.dtype).with_device(b.device).with_tag(MemTag::parameter));
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
  if (!b.block || !b.gathered || full_depth_ > 0) return;
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

void DataParallel::gather_all_blocks() {
  for (int bi = 0; bi < static_cast<int>(buckets_.size()); ++bi) gather_block(bi);
}

void DataParallel::release_all_blocks() {
  for (int bi = 0; bi < static_cast<int>(buckets_.size()); ++bi) release_block(bi);
}

void DataParallel::on_block_grad(int bi) {
  Bucket& b = buckets_[bi];
  if (!b.intercepted) {
    const Unit* unit = nullptr;
    for (const Unit& u : units_)
      if (u.bucket == bi) unit = &u;
    ATH_FAIL("DataParallel", "the parameters of sharding unit '", unit ? unit->path : std::string("?"),
             "' received gradients, but its forward did not run through its interceptor, so its parameters were "
             "never gathered (this rank computed with placeholders), or they are also used outside the unit",
             Hint{"the module that calls the unit must call it as unit->run_forward(x, fn) (nn::Module); "
                  "GPT's and MLP's loops do, a plain Sequential does not: name other modules or wrap the unit in "
                  "dist::FullyShardedBlock. Parameters used outside their unit (tied weights) must stay unsharded"});
  }
  if (--b.bwd_pending > 0) return;
  b.bwd_pending = static_cast<int>(b.params.size());
  b.intercepted = false;
  release_block(bi);  // the block's backward is done (its recompute graph keeps what it still needs)
}

DataParallel::FullParameters::FullParameters(DataParallel& d) : d_(&d) {
  d.gather_all_blocks();
  ++d.full_depth_;
}

DataParallel::FullParameters::~FullParameters() {
  if (!d_) return;
  if (--d_->full_depth_ == 0) d_->release_all_blocks();
}

}  // namespace athanor::dist
