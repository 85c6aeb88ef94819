// collate: stacks samples along a new leading dim. All inputs must agree in
// shape and dtype, and so must all targets (or every target is undefined).
// num_targets counts integer target elements != ignore_index (tokens that count
// for a language model, samples for a classifier); for floating targets it is
// the number of target elements.
#include <cstring>

#include "athanor/core/error.h"
#include "athanor/data/dataset.h"

namespace athanor::data {
namespace {

constexpr const char* kOp = "collate";

// Copies `src` into row `row` of the contiguous tensor `dst` ([N, ...src.shape]).
void copy_row(const Tensor& dst, int64_t row, const Tensor& src) {
  const int64_t n = src.numel();
  if (src.is_contiguous() && src.dtype() == dst.dtype()) {
    std::memcpy(static_cast<char*>(dst.raw_data()) + row * n * dst.element_size(), src.raw_data(),
                static_cast<size_t>(n) * dst.element_size());
    return;
  }
  Shape strides = contiguous_strides(src.sizes());
  copy_into(make_view(dst, src.sizes(), strides, dst.storage_offset() + row * n), src);
}

Tensor stack(const std::vector<Sample>& samples, const std::vector<int64_t>& ids, bool target) {
  const Tensor& first = target ? samples[0].target : samples[0].input;
  const char* what = target ? "target" : "input";
  for (size_t i = 0; i < samples.size(); ++i) {
    const Tensor& t = target ? samples[i].target : samples[i].input;
    ATH_CHECK(t.defined() == first.defined(), kOp, "sample ", ids[i], " has ", t.defined() ? "a" : "no", " ", what,
              " but sample ", ids[0], " has ", first.defined() ? "one" : "none",
              Hint{"a dataset must return the same kind of sample for every index"});
    if (!t.defined()) continue;
    ATH_CHECK(t.sizes() == first.sizes() && t.dtype() == first.dtype(), kOp, "cannot stack the ", what, " of sample ", ids[i],
              " (", t.describe(), ") with that of sample ", ids[0], " (", first.describe(), ")",
              Hint{"every sample in a batch must have the same shape and dtype; pad or crop in the dataset"});
    ATH_CHECK(t.device().is_cpu(), kOp, "the ", what, " of sample ", ids[i], " is not on the CPU",
              Hint{"datasets return CPU tensors; move batches to the device after collate"});
  }
  if (!first.defined()) return Tensor();
  Shape shape = first.sizes();
  shape.insert(shape.begin(), static_cast<int64_t>(samples.size()));
  Tensor out = empty(shape, first.dtype());
  for (size_t i = 0; i < samples.size(); ++i) copy_row(out, static_cast<int64_t>(i), target ? samples[i].target : samples[i].input);
  return out;
}

int64_t count_targets(const Tensor& t, int64_t ignore_index) {
  if (!t.defined()) return 0;
  const int64_t n = t.numel();
  int64_t count = 0;
  switch (t.dtype()) {
    case DType::i64: { const int64_t* p = t.data_ptr<int64_t>(); for (int64_t i = 0; i < n; ++i) count += p[i] != ignore_index; break; }
    case DType::i32: { const int32_t* p = t.data_ptr<int32_t>(); for (int64_t i = 0; i < n; ++i) count += p[i] != ignore_index; break; }
    case DType::u8: { const uint8_t* p = t.data_ptr<uint8_t>(); for (int64_t i = 0; i < n; ++i) count += p[i] != ignore_index; break; }
    default: count = n;
  }
  return count;
}

}  // namespace

Batch collate(const std::vector<Sample>& samples, const std::vector<int64_t>& ids, int64_t ignore_index) {
  ATH_CHECK(!samples.empty(), kOp, "no samples to collate", Hint{"a batch needs at least one sample"});
  ATH_CHECK(ids.size() == samples.size(), kOp, "got ", samples.size(), " samples but ", ids.size(), " sample ids",
            Hint{"pass one dataset index per sample"});
  ATH_CHECK(samples[0].input.defined(), kOp, "sample ", ids[0], " has no input tensor",
            Hint{"Dataset::get must set Sample::input"});
  Batch b;
  b.input = stack(samples, ids, false);
  b.target = stack(samples, ids, true);
  b.sample_ids = ids;
  b.num_targets = count_targets(b.target, ignore_index);
  return b;
}

}  // namespace athanor::data
