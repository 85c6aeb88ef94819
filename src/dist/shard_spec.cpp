// Local <-> logical tensors of tensor parallelism (contract in include/athanor/dist/shard_spec.h).
#include "athanor/dist/shard_spec.h"

#include <algorithm>
#include <sstream>

#include "athanor/autograd/grad_mode.h"
#include "athanor/core/error.h"

namespace athanor::dist {

namespace {
// narrow() without the autograd machinery: a view of rows [start, start + len) of `dim`.
Tensor rows(const Tensor& t, int dim, int64_t start, int64_t len) {
  Shape sizes = t.sizes();
  sizes[dim] = len;
  return make_view(t, sizes, t.strides(), t.storage_offset() + start * t.stride(dim));
}
}  // namespace

int64_t ShardSpec::real_rows(int k) const {
  if (!sharded()) return 0;
  return std::clamp<int64_t>(part_logical() - static_cast<int64_t>(k) * part_local(), 0, part_local());
}

Shape ShardSpec::local_shape(const Shape& s) const {
  Shape out = s;
  if (sharded()) out[dim] = padded / count;
  return out;
}

Shape ShardSpec::real_shape(const Shape& s, int k) const {
  Shape out = s;
  if (sharded()) out[dim] = parts * real_rows(k);
  return out;
}

Shape logical_shape(const Shape& local, const ShardSpec& spec) {
  Shape out = local;
  if (spec.sharded()) out[spec.dim] = spec.logical;
  return out;
}

std::string ShardSpec::describe() const {
  if (!sharded()) return sum_grad_over_tp ? "replicated (gradient summed over tp)" : "replicated";
  std::ostringstream o;
  o << "dim " << dim;
  if (parts > 1) o << " of " << parts << " parts";
  o << ", " << logical << " rows";
  if (padded != logical) o << " (padded to " << padded << ")";
  o << ", shard " << index << " of " << count;
  return o.str();
}

ShardSpec spec_of(const ShardSpecs& specs, const std::string& name) {
  auto it = specs.find(name);
  return it == specs.end() ? ShardSpec{} : it->second;
}

Tensor shard_of(const Tensor& full, const ShardSpec& s, const std::string& name) {
  NoGradGuard ng;
  if (!s.sharded()) return full.detach().contiguous();
  ATH_CHECK(s.dim < full.dim() && full.size(s.dim) == s.logical, "tensor parallel", "'", name, "' is ", full.describe(),
            " but its sharding (", s.describe(), ") expects ", s.logical, " rows in dim ", s.dim,
            Hint{"the tensor does not come from this model's config (model.* keys)"});
  Tensor out = zeros(s.local_shape(full.sizes()), TensorOptions(full.dtype()));
  const int64_t L = s.part_local(), P = s.part_logical(), real = s.real_rows(s.index);
  if (real > 0)
    for (int g = 0; g < s.parts; ++g) copy_into(rows(out, s.dim, g * L, real), rows(full, s.dim, g * P + s.index * L, real));
  return out;
}

Tensor real_part(const Tensor& local, const ShardSpec& s) {
  NoGradGuard ng;
  if (!s.sharded()) return local.detach();
  const int64_t L = s.part_local(), real = s.real_rows(s.index);
  Tensor out = empty(s.real_shape(logical_shape(local.sizes(), s), s.index), TensorOptions(local.dtype()));
  if (real > 0)
    for (int g = 0; g < s.parts; ++g) copy_into(rows(out, s.dim, g * real, real), rows(local, s.dim, g * L, real));
  return out;
}

Tensor assemble_shards(const std::vector<Tensor>& real_parts, const ShardSpec& s, const Shape& shape, const std::string& name) {
  NoGradGuard ng;
  ATH_CHECK(s.sharded() && static_cast<int>(real_parts.size()) == s.count, "tensor parallel", "'", name, "': ",
            real_parts.size(), " shards for a tensor split ", s.count, " ways");
  DType dt = DType::f32;
  for (const Tensor& t : real_parts)
    if (t.defined()) dt = t.dtype();
  Tensor out = empty(shape, TensorOptions(dt));
  const int64_t L = s.part_local(), P = s.part_logical();
  for (int k = 0; k < s.count; ++k) {
    const int64_t real = s.real_rows(k);
    if (real == 0) continue;
    const Tensor& part = real_parts[k];
    ATH_CHECK(part.defined() && part.sizes() == s.real_shape(shape, k), "tensor parallel", "shard ", k, " of '", name,
              "' is ", part.defined() ? part.describe() : std::string("missing"), ", expected ",
              shape_str(s.real_shape(shape, k)), " (", s.describe(), ")",
              Hint{"the checkpoint's shards do not belong together; use an earlier checkpoint"});
    for (int g = 0; g < s.parts; ++g) copy_into(rows(out, s.dim, g * P + k * L, real), rows(part, s.dim, g * real, real));
  }
  return out;
}

Tensor gather_shards(const Tensor& local, const ShardSpec& s, ProcessGroup& tp) {
  NoGradGuard ng;
  if (!s.sharded()) return local.detach().clone();
  ATH_CHECK(tp.size() == s.count, "tensor parallel", "gathering a tensor split ", s.count, " ways over a group of ",
            tp.size(), " ranks");
  const Tensor in = local.detach().contiguous();
  Shape all = in.sizes();
  all.insert(all.begin(), s.count);
  Tensor out = empty(all, TensorOptions(in.dtype()));
  tp.all_gather(out, in);
  std::vector<Tensor> parts;
  const int64_t L = s.part_local();
  const Shape logical = logical_shape(in.sizes(), s);
  for (int k = 0; k < s.count; ++k) {
    Tensor shard = make_view(out, in.sizes(), contiguous_strides(in.sizes()), k * in.numel());
    const int64_t real = s.real_rows(k);
    Tensor part = empty(s.real_shape(logical, k), TensorOptions(in.dtype()));
    if (real > 0)
      for (int g = 0; g < s.parts; ++g) copy_into(rows(part, s.dim, g * real, real), rows(shard, s.dim, g * L, real));
    parts.push_back(part);
  }
  return assemble_shards(parts, s, logical);
}

}  // namespace athanor::dist
