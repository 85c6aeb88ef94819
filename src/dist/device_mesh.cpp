// DeviceMesh: dp × tp × pp process groups in Megatron's rank order (contract in
// include/athanor/dist/device_mesh.h).
#include "athanor/dist/device_mesh.h"

#include "athanor/core/error.h"

namespace athanor::dist {

DeviceMesh DeviceMesh::from_sizes(int tp, int pp, std::shared_ptr<ProcessGroup> w) {
  if (!w) w = dist::world();
  const int n = w->size();
  ATH_CHECK(tp >= 1 && pp >= 1, "DeviceMesh", "dist.tp and dist.pp must be >= 1, got tp ", tp, " and pp ", pp);
  ATH_CHECK(n % (tp * pp) == 0, "DeviceMesh", "the world size ", n, " is not divisible by tp x pp = ", tp, " x ", pp,
            " = ", tp * pp, " (dp = world / (tp x pp) must be a whole number)",
            Hint{"start a multiple of " + std::to_string(tp * pp) + " processes (mpirun -np " + std::to_string(tp * pp) +
                 ", " + std::to_string(2 * tp * pp) + ", ...), or change dist.tp / dist.pp"});
  return DeviceMesh(n / (tp * pp), tp, pp, std::move(w));
}

DeviceMesh::DeviceMesh(int dp, int tp, int pp, std::shared_ptr<ProcessGroup> w) : dp_n_(dp), tp_n_(tp), pp_n_(pp) {
  if (!w) w = dist::world();
  ATH_CHECK(dp >= 1 && tp >= 1 && pp >= 1 && static_cast<int64_t>(dp) * tp * pp == w->size(), "DeviceMesh",
            "dp x tp x pp = ", dp, " x ", tp, " x ", pp, " = ", static_cast<int64_t>(dp) * tp * pp, " does not match the ",
            w->size(), " ranks of group ", w->name(),
            Hint{"choose sizes whose product is the number of processes (mpirun -np)"});
  world_ = w;
  const int r = w->rank();
  tp_i_ = r % tp;
  dp_i_ = (r / tp) % dp;
  pp_i_ = r / (tp * dp);
  // Each group holds the ranks that differ only in that dimension's index, ordered by it.
  dp_ = w->split(pp_i_ * tp + tp_i_, dp_i_, "dp");
  tp_ = w->split(pp_i_ * dp + dp_i_, tp_i_, "tp");
  pp_ = w->split(dp_i_ * tp + tp_i_, pp_i_, "pp");
  dp_->set_dimension("dp");
  tp_->set_dimension("tp");
  pp_->set_dimension("pp");
}

int DeviceMesh::slot(const std::string& dim) const {
  if (dim == "dp") return 0;
  if (dim == "tp") return 1;
  if (dim == "pp") return 2;
  ATH_FAIL("DeviceMesh", "no dimension named '", dim, "'", Hint{"the dimensions are dp, tp and pp"});
}

const std::shared_ptr<ProcessGroup>& DeviceMesh::group(const std::string& dim) const {
  switch (slot(dim)) {
    case 0: return dp_;
    case 1: return tp_;
    default: return pp_;
  }
}
int DeviceMesh::size(const std::string& dim) const {
  const int s = slot(dim);
  return s == 0 ? dp_n_ : s == 1 ? tp_n_ : pp_n_;
}
int DeviceMesh::index(const std::string& dim) const {
  const int s = slot(dim);
  return s == 0 ? dp_i_ : s == 1 ? tp_i_ : pp_i_;
}

int DeviceMesh::world_rank(int dp_i, int tp_i, int pp_i) const {
  ATH_CHECK(dp_i >= 0 && dp_i < dp_n_ && tp_i >= 0 && tp_i < tp_n_ && pp_i >= 0 && pp_i < pp_n_, "DeviceMesh",
            "coordinates (dp ", dp_i, ", tp ", tp_i, ", pp ", pp_i, ") are outside the mesh ", describe());
  return (pp_i * dp_n_ + dp_i) * tp_n_ + tp_i;
}

std::vector<int> DeviceMesh::ranks(const std::string& dim) const {
  std::vector<int> out;
  const int s = slot(dim);
  for (int i = 0; i < size(dim); ++i)
    out.push_back(s == 0 ? world_rank(i, tp_i_, pp_i_) : s == 1 ? world_rank(dp_i_, i, pp_i_) : world_rank(dp_i_, tp_i_, i));
  return out;
}

std::string DeviceMesh::describe() const {
  return "dp " + std::to_string(dp_n_) + " x tp " + std::to_string(tp_n_) + " x pp " + std::to_string(pp_n_) + " (world " +
         std::to_string(dp_n_ * tp_n_ * pp_n_) + ")";
}

}  // namespace athanor::dist
