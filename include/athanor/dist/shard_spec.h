#pragma once
// How a tensor-parallel rank's local tensor maps onto the logical (1-process) tensor of the
// same name, and the conversions between the two that checkpoints and exports need.
//
// A sharded tensor splits one dimension `dim` across the `count` ranks of a tp group. The
// logical dimension may hold `parts` equal blocks that are split separately (GPT's c_attn
// holds q | k | v: rank r keeps heads r·H/t .. of each, so its local rows are q_r | k_r | v_r),
// and may be padded (a vocabulary padded to a multiple of 128·tp): per part the logical
// size P = logical / parts is padded to Pp = padded / parts and each rank holds
// L = Pp / count rows; rank k's rows are the logical rows [k·L, min((k+1)·L, P)) of every
// part, followed by zero padding up to L. A rank may hold only padding (real rows 0).
//
// Replicated tensors have dim = -1. Under sequence parallelism some replicated parameters
// (LayerNorms, the position embedding, row-parallel biases) see only a slice of the
// sequence on each rank, so their gradient must be summed over the tp group
// (sum_grad_over_tp).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "athanor/core/tensor.h"
#include "athanor/dist/process_group.h"

namespace athanor::dist {

struct ShardSpec {
  int dim = -1;             // the split dimension; -1: replicated
  int parts = 1;            // equal blocks of the logical dimension, each split across the ranks
  int64_t logical = 0;      // logical size of `dim` (all parts)
  int64_t padded = 0;       // padded size of `dim` (all parts): local size = padded / count
  int index = 0;            // this rank's shard (its tp index)
  int count = 1;            // shards (the tp size)
  bool sum_grad_over_tp = false;  // replicated, but each rank computes part of its gradient

  bool sharded() const { return dim >= 0; }
  int64_t part_logical() const { return logical / parts; }
  int64_t part_local() const { return padded / parts / count; }
  // Real (not padding) rows of shard k in each part.
  int64_t real_rows(int k) const;
  // The local tensor's shape, and the shape of shard k's real rows, for a logical shape.
  Shape local_shape(const Shape& logical_shape) const;
  Shape real_shape(const Shape& logical_shape, int k) const;
  std::string describe() const;  // "dim 0 of 3 parts, 65 -> 256 rows, shard 1 of 2" / "replicated"
};

using ShardSpecs = std::map<std::string, ShardSpec>;  // parameter name -> spec (absent: replicated)

// The spec of `name` in `specs`, or a replicated one.
ShardSpec spec_of(const ShardSpecs& specs, const std::string& name);

// This rank's local tensor cut from the logical one (contiguous copy, padding rows zero,
// dtype of `full`). An Error naming `name` when `full`'s shape is not the logical one.
Tensor shard_of(const Tensor& full, const ShardSpec& spec, const std::string& name = "");
// The local tensor without its padding rows (a contiguous copy; may have 0 rows).
Tensor real_part(const Tensor& local, const ShardSpec& spec);
// The logical tensor from every shard's real rows (real_parts[k] is shard k's).
Tensor assemble_shards(const std::vector<Tensor>& real_parts, const ShardSpec& spec, const Shape& logical_shape,
                       const std::string& name = "");
// The logical tensor on every rank of the tp group, from each rank's local tensor (one
// all_gather over `tp`; a collective: every rank of the group calls it in the same order).
Tensor gather_shards(const Tensor& local, const ShardSpec& spec, ProcessGroup& tp);
// The logical shape of a sharded tensor from its local shape.
Shape logical_shape(const Shape& local_shape, const ShardSpec& spec);

}  // namespace athanor::dist
