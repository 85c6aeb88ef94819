// The training batches on the trainer's device: see batch_feed.h.
#include "train/batch_feed.h"

#include <chrono>

#include "athanor/core/error.h"
#include "athanor/observe/profiler.h"

namespace athanor::train {
namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

data::Batch batch_to_device(const data::Batch& b, Device device) {
  data::Batch out = b;
  if (b.input.defined()) out.input = b.input.to(device);  // the tensor itself when it is there
  if (b.target.defined()) out.target = b.target.to(device);
  return out;
}

BatchFeed::BatchFeed(data::DataLoader& loader, Device device, bool prefetch)
    : loader_(loader), device_(device), prefetch_(prefetch) {}

FedStep BatchFeed::fetch(int64_t accum) {
  observe::ProfileSpan span("data_wait");
  const double t0 = now_seconds();
  FedStep s;
  for (int64_t k = 0; k < accum; ++k) {
    s.host.push_back(loader_.next());
    s.device.push_back(batch_to_device(s.host.back(), device_));  // on the copy stream (cuda)
  }
  s.wait_seconds = now_seconds() - t0;
  return s;
}

FedStep BatchFeed::take(int64_t accum) {
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
  if (ahead_) {
    ATH_CHECK(static_cast<int64_t>(ahead_->host.size()) == accum, "trainer", "prefetched ", ahead_->host.size(),
              " micro-batches for a step of ", accum, Hint{"this is a bug: report it with the config"});
    FedStep s = std::move(*ahead_);
    ahead_.reset();
    return s;
  }
  return fetch(accum);
}

void BatchFeed::prefetch(int64_t accum) {
  if (!prefetch_ || has_prefetched()) return;
  ahead_from_ = loader_.position();
  try {
    ahead_ = fetch(accum);
  } catch (...) {  // the step that would train on the bad sample reports it (take)
    error_ = std::current_exception();
  }
}

data::LoaderPosition BatchFeed::position() const { return has_prefetched() ? ahead_from_ : loader_.position(); }

void BatchFeed::set_position(data::LoaderPosition p) {
  ahead_.reset();
  error_ = nullptr;
  loader_.set_position(p);
}

}  // namespace athanor::train
