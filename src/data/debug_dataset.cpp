// Deliberately faulty datasets for testing the doctor, and prefix subsets (data/debug_dataset.h).
#include "athanor/data/debug_dataset.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include "athanor/core/convert.h"
#include "athanor/core/error.h"
#include "athanor/data/dataloader.h"

namespace athanor::data {
namespace {

constexpr const char* kOp = "debug_dataset";

class DebugDataset final : public Dataset {
 public:
  DebugDataset(std::shared_ptr<Dataset> base, DebugDataOptions o)
      : base_(std::move(base)), o_(std::move(o)), corrupt_(o_.corrupt_ids.begin(), o_.corrupt_ids.end()) {
    ATH_CHECK(base_ != nullptr, kOp, "the dataset is null");
    const int64_t n = base_->size();
    if (o_.shuffle_labels) perm_ = random_sampler(n, o_.seed ^ 0x9e3779b97f4a7c15ULL)->indices(0);
    for (int64_t id : o_.corrupt_ids)
      ATH_CHECK(id >= 0 && id < n, kOp, "debug.corrupt_samples: sample id ", id, " is out of range for ", base_->describe(),
                Hint{"ids are dataset indices 0 .. " + std::to_string(n - 1)});
    ATH_CHECK(o_.sample_delay_ms >= 0, kOp, "debug.sample_delay_ms must be >= 0, got ", o_.sample_delay_ms);
    if ((!corrupt_.empty() || o_.input_scale != 1.0) && n > 0) {
      const Sample s = base_->get(0);
      ATH_CHECK(s.input.defined() && is_floating(s.input.dtype()), kOp, "debug.corrupt_samples and debug.input_scale need floating "
                "inputs, but ", base_->describe(), " has ", s.input.defined() ? dtype_name(s.input.dtype()) : "no", " inputs",
                Hint{"use them with data.type fashion_mnist (token inputs cannot hold NaN or be scaled)"});
    }
  }

  int64_t size() const override { return base_->size(); }

  Sample get(int64_t index) const override {
    delay(1);
    Sample s = base_->get(index);
    if (o_.shuffle_labels) s.target = base_->get(perm_[static_cast<size_t>(index)]).target;
    if (!corrupt_.empty() || o_.input_scale != 1.0) {
      Tensor x = empty(s.input.sizes(), TensorOptions(s.input.dtype()));
      copy_into(x, s.input);
      damage(x, 0, x.numel(), index);
      s.input = x;
    }
    return s;
  }

  std::optional<Batch> get_batch(const std::vector<int64_t>& ids) const override {
    std::optional<Batch> b = base_->get_batch(ids);
    if (!b) return std::nullopt;  // the loader calls get() per sample
    delay(static_cast<int64_t>(ids.size()));
    if (o_.shuffle_labels) {
      std::vector<int64_t> other;
      for (int64_t id : ids) other.push_back(perm_[static_cast<size_t>(id)]);
      const std::optional<Batch> t = base_->get_batch(other);
      ATH_CHECK(t.has_value(), kOp, "internal: get_batch answered for some ids but not others");
      b->target = t->target;
      b->num_targets = t->num_targets;
    }
    if (!corrupt_.empty() || o_.input_scale != 1.0) {
      const int64_t per = ids.empty() ? 0 : b->input.numel() / static_cast<int64_t>(ids.size());
      for (size_t r = 0; r < ids.size(); ++r) damage(b->input, static_cast<int64_t>(r) * per, per, ids[r]);
    }
    return b;
  }

  std::string describe() const override { return base_->describe() + " [debug.* faults]"; }

 private:
  void delay(int64_t samples) const {
    if (o_.sample_delay_ms > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o_.sample_delay_ms * static_cast<double>(samples)));
  }
  // Elements [begin, begin + count) of contiguous x are sample `id`'s input.
  void damage(const Tensor& x, int64_t begin, int64_t count, int64_t id) const {
    dispatch(x.dtype(), [&]<class T>() {
      if constexpr (is_float_type_v<T>) {
        T* d = static_cast<T*>(x.raw_data()) + begin;
        if (o_.input_scale != 1.0)
          for (int64_t i = 0; i < count; ++i) d[i] = cast_value<T>(cast_value<double>(d[i]) * o_.input_scale);
        if (count > 0 && corrupt_.count(id)) d[count / 2] = cast_value<T>(o_.corrupt_value);  // one element, mid-sample
      }
    });
  }

  std::shared_ptr<Dataset> base_;
  DebugDataOptions o_;
  std::set<int64_t> corrupt_;
  std::vector<int64_t> perm_;
};

class PrefixSubset final : public Dataset {
 public:
  PrefixSubset(std::shared_ptr<Dataset> base, int64_t n) : base_(std::move(base)), n_(n) {}
  int64_t size() const override { return n_; }
  Sample get(int64_t index) const override {
    ATH_CHECK(index >= 0 && index < n_, "subset", "index ", index, " is out of range for ", describe());
    return base_->get(index);
  }
  std::optional<Batch> get_batch(const std::vector<int64_t>& ids) const override {
    for (int64_t id : ids) ATH_CHECK(id >= 0 && id < n_, "subset", "index ", id, " is out of range for ", describe());
    return base_->get_batch(ids);
  }
  std::string describe() const override { return "the first " + std::to_string(n_) + " samples of " + base_->describe(); }

 private:
  std::shared_ptr<Dataset> base_;
  int64_t n_;
};

}  // namespace

std::shared_ptr<Dataset> debug_dataset(std::shared_ptr<Dataset> base, DebugDataOptions o) {
  return std::make_shared<DebugDataset>(std::move(base), std::move(o));
}

std::shared_ptr<Dataset> prefix_subset(std::shared_ptr<Dataset> base, int64_t n) {
  ATH_CHECK(base != nullptr, "subset", "the dataset is null");
  ATH_CHECK(n >= 1 && n <= base->size(), "subset", "data.train_samples must be between 1 and the dataset's size (",
            base->size(), " for ", base->describe(), "), got ", n, Hint{"0 uses the whole set"});
  return std::make_shared<PrefixSubset>(std::move(base), n);
}

}  // namespace athanor::data
