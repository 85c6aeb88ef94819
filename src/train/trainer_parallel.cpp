// Tensor parallelism in the Trainer: this rank's shards <-> the logical (1-process) tensors
// that checkpoints, model.safetensors and load_weights hold (contract in trainer.h).
#include "athanor/dist/process_group.h"
#include "athanor/dist/tensor_parallel_gpt.h"
#include "athanor/train/trainer.h"

namespace athanor::train {

const std::map<std::string, dist::ShardSpec>* Trainer::tp_specs() const {
  if (tp_ == 1) return nullptr;
  auto* m = dynamic_cast<const dist::TensorParallelGPT*>(&const_cast<Trainer*>(this)->task_->module());
  ATH_ASSERT(m != nullptr);
  return &m->shard_specs();
}

nn::StateDict Trainer::to_local(const nn::StateDict& logical, bool optimizer_keys) const {
  const auto* specs = tp_specs();
  if (!specs) return logical;
  nn::StateDict out;
  for (const auto& [name, t] : logical) {
    const dist::ShardSpec s = optimizer_keys ? dist::optimizer_state_spec(*specs, name) : dist::spec_of(*specs, name);
    out.emplace_back(name, dist::shard_of(t, s, name));
  }
  return out;
}

nn::StateDict Trainer::to_logical(const nn::StateDict& local) const {
  const auto* specs = tp_specs();
  if (!specs) return local;
  nn::StateDict out;
  for (const auto& [name, t] : local) out.emplace_back(name, dist::gather_shards(t, dist::spec_of(*specs, name), *tp_group_));
  return out;
}

ckpt::TensorFile Trainer::checkpoint_part(const std::string& prefix, const nn::StateDict& local, bool optimizer_keys,
                                          const std::map<std::string, std::string>& meta) const {
  ckpt::TensorFile f{prefix, {}, meta};
  const auto* specs = tp_specs();
  if (!specs) {
    f.tensors.assign(local.begin(), local.end());
    return f;
  }
  // Replicated tensors: tp rank 0's copy. Shards: each tp rank its slice's real rows, which the
  // index maps onto the logical tensor (sharded_checkpoint.h); a slice of padding only is not written.
  for (const auto& [name, t] : local) {
    const dist::ShardSpec s = optimizer_keys ? dist::optimizer_state_spec(*specs, name) : dist::spec_of(*specs, name);
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

}  // namespace athanor::train
