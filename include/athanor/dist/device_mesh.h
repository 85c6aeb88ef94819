#pragma once
// DeviceMesh: the ranks of a run as a dp × tp × pp grid, with one process group per
// dimension (each rank's "slice" of the grid along that dimension).
//
//   auto mesh = dist::DeviceMesh::from_sizes(/*tp=*/2, /*pp=*/1);   // dp = world / (tp · pp)
//   mesh.group("tp")->all_reduce(t);        // the ranks that differ only in their tp index
//   mesh.dp(), mesh.tp(), mesh.pp()         // the same groups by name
//
// Layout (Megatron-LM's order): tp varies fastest, then dp, then pp,
//   world_rank = (pp_i · dp + dp_i) · tp + tp_i,
// so a tensor-parallel group is a set of consecutive ranks, which a launcher places on
// one node (its collectives are the most frequent and the largest per step).
//
// Invariants:
//  - dp · tp · pp == the world group's size, every size >= 1; otherwise an Error naming
//    the numbers, raised before any group is created (every rank raises it);
//  - the groups are named and dimensioned "dp", "tp", "pp" (the communication ledger sums
//    traffic by dimension); a dimension of size 1 still has its (one-rank) group, so code
//    written for the mesh runs unchanged when a dimension is not used;
//  - constructing a mesh is a collective over the world group (MPI_Comm_split, 3 times).
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "athanor/dist/process_group.h"

namespace athanor::dist {

class DeviceMesh {
 public:
  // The dimensions, fastest-varying first.
  static constexpr std::array<const char*, 3> kDims = {"tp", "dp", "pp"};

  DeviceMesh(int dp, int tp = 1, int pp = 1, std::shared_ptr<ProcessGroup> world = nullptr);
  // dp = world size / (tp · pp); an Error naming the numbers when that does not divide.
  static DeviceMesh from_sizes(int tp, int pp = 1, std::shared_ptr<ProcessGroup> world = nullptr);

  const std::shared_ptr<ProcessGroup>& dp() const { return dp_; }
  const std::shared_ptr<ProcessGroup>& tp() const { return tp_; }
  const std::shared_ptr<ProcessGroup>& pp() const { return pp_; }
  const std::shared_ptr<ProcessGroup>& world() const { return world_; }
  int dp_size() const { return dp_n_; }
  int tp_size() const { return tp_n_; }
  int pp_size() const { return pp_n_; }
  int dp_index() const { return dp_i_; }
  int tp_index() const { return tp_i_; }
  int pp_index() const { return pp_i_; }

  // By name ("dp", "tp", "pp"; another name is an Error listing these).
  const std::shared_ptr<ProcessGroup>& group(const std::string& dim) const;
  int size(const std::string& dim) const;
  int index(const std::string& dim) const;
  // The world rank at grid coordinates (dp_i, tp_i, pp_i).
  int world_rank(int dp_i, int tp_i, int pp_i) const;
  // The world ranks of this rank's group along `dim`, in group-rank order.
  std::vector<int> ranks(const std::string& dim) const;
  std::string describe() const;  // "dp 2 x tp 2 x pp 1 (world 4)"

 private:
  int slot(const std::string& dim) const;
  int dp_n_, tp_n_, pp_n_, dp_i_ = 0, tp_i_ = 0, pp_i_ = 0;
  std::shared_ptr<ProcessGroup> world_, dp_, tp_, pp_;
};

}  // namespace athanor::dist
