// DataLoader: worker threads build batches ahead into a bounded reorder buffer;
// next() hands them out in order.
//
// Invariants:
//  - batches are numbered globally, g = epoch * batches_per_epoch + batch, and
//    batch g is always built from positions [k*B, (k+1)*B) (k = g mod bpe) of
//    the sampler's order for epoch g / bpe, so the stream of batches does not
//    depend on num_workers or on thread timing (0 workers = built in next());
//  - a worker claims the lowest unclaimed g, and only while fewer than
//    `capacity` = max(prefetch, num_workers, 1) batches are claimed but not yet
//    returned, so memory stays bounded and no worker runs far ahead;
//  - workers only use CPU time the training threads leave idle: they run at the
//    lowest priority (nice 19 on Linux), because a loader thread that wakes up
//    and preempts one OpenMP thread stalls the whole team at its next barrier
//    (perf sched_switch on the MLP bench, 2 OpenMP threads on 2 cores: 26-173
//    such preemptions per 3 s at normal priority, 3-4 at nice 19);
//  - when batch g is not ready, next() builds it itself if no worker has claimed
//    it yet (as with 0 workers), and otherwise waits for the worker building it:
//    while the training thread waits its OpenMP threads are idle, so the nice-19
//    worker gets a core at once. Building a claimed batch a second time instead
//    would hold two buffers for it, and a warm step would then occasionally need
//    memory the allocator's cache does not have (a system allocation);
//  - a failure while building batch g (a throwing Dataset::get, a sampler index
//    out of range, samples that do not stack) is stored as batch g's result and
//    re-thrown by the next() that reaches g, as an Error naming the sample; the
//    loader then moves on to g+1 (like PyTorch's DataLoader);
//  - datasets with a Dataset::get_batch fast path fill the batch tensors
//    directly (2 allocations per batch instead of 2 per sample, each of which
//    takes the allocator lock the training thread also takes for every op);
//  - stop() sets a flag under the lock and wakes every worker; workers check it
//    whenever they wait and after each sample, so the destructor and
//    set_position() join promptly even when the buffer is full.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>

#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "athanor/core/allocator.h"
#include "athanor/core/error.h"
#include "athanor/data/dataloader.h"

namespace athanor::data {

namespace {
constexpr const char* kOp = "DataLoader";

struct Result {
  Batch batch;
  std::exception_ptr error;
};

struct Stopped {};  // thrown inside a worker to abandon a batch when the loader stops
}  // namespace

struct DataLoader::State {
  std::mutex mu;
  std::condition_variable cv_work;   // workers: a slot is free, or stop
  std::condition_variable cv_ready;  // next(): the claimed batch it waits for is ready
  std::atomic<bool> stopping{false};  // written under mu (so waiters see it), read without it between samples
  int64_t epoch_len = 0;  // indices per epoch
  int64_t bpe = 0;        // batches per epoch
  int64_t capacity = 1;
  int64_t consume = 0;  // global number of the batch next() returns
  int64_t claim = 0;    // next global number a worker builds
  std::map<int64_t, Result> ready;
  std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> orders;  // epoch -> sampler order
  std::vector<std::thread> workers;

  // The sampler's order for `epoch`, computed once and shared (caller holds mu).
  std::shared_ptr<const std::vector<int64_t>> order_locked(const Sampler& sampler, int64_t epoch) {
    auto it = orders.find(epoch);
    if (it != orders.end()) return it->second;
    auto order = std::make_shared<const std::vector<int64_t>>(sampler.indices(epoch));
    ATH_CHECK(static_cast<int64_t>(order->size()) == epoch_len, kOp, "the sampler gave ", order->size(), " indices for epoch ",
              epoch, " but ", epoch_len, " for epoch 0", Hint{"a sampler must return the same number of indices every epoch"});
    orders.emplace(epoch, order);
    return order;
  }
};

namespace {

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.op() + ": " + err.message();
  } catch (const std::exception& err) {
    return err.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

std::string hint_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    if (!err.hint().empty()) return err.hint();
  } catch (...) {
  }
  return "fix the dataset's get() for that index (or leave it out with a custom sampler)";
}

// Loader threads yield to the training threads: see the header.
void lower_own_priority() {
#ifdef __linux__
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);  // per thread on Linux; failure is harmless
#endif
}

}  // namespace

// Builds batch g. `stopping`, when given, is polled between samples.
static Batch build_batch(const Dataset& dataset, const std::vector<int64_t>& order, int64_t g, int64_t bpe, int64_t B,
                         const std::function<bool()>& stopping) {
  MemTagScope tag(MemTag::other);
  const int64_t epoch = g / bpe, k = g % bpe;
  const int64_t begin = k * B, end = std::min<int64_t>(begin + B, static_cast<int64_t>(order.size()));
  const int64_t n = dataset.size();
  std::vector<int64_t> ids(order.begin() + begin, order.begin() + end);
  for (int64_t p = begin; p < end; ++p) {
    const int64_t id = order[p];
    ATH_CHECK(id >= 0 && id < n, kOp, "the sampler gave index ", id, " (epoch ", epoch, ", position ", p, ") but ", dataset.describe(),
              " has ", n, " samples", Hint{"the sampler was made for a different dataset size"});
  }
  std::optional<Batch> direct;
  try {
    direct = dataset.get_batch(ids);
  } catch (...) {
    const auto e = std::current_exception();
    ATH_FAIL(kOp, "batch ", k, " of epoch ", epoch, " of ", dataset.describe(), " failed: ", what_of(e), Hint{hint_of(e)});
  }
  if (direct) return std::move(*direct);
  std::vector<Sample> samples;
  samples.reserve(ids.size());
  for (int64_t id : ids) {
    if (stopping && stopping()) throw Stopped{};
    try {
      samples.push_back(dataset.get(id));
    } catch (...) {
      const auto e = std::current_exception();
      ATH_FAIL(kOp, "sample ", id, " of ", dataset.describe(), " (epoch ", epoch, ", batch ", k, ") failed: ", what_of(e),
               Hint{hint_of(e)});
    }
  }
  try {
    return collate(samples, ids);
  } catch (const Error& e) {
    ATH_FAIL(kOp, "batch ", k, " of epoch ", epoch, " of ", dataset.describe(), ": ", e.message(), Hint{e.hint()});
  }
}

DataLoader::DataLoader(std::shared_ptr<Dataset> dataset, LoaderOptions options, std::shared_ptr<Sampler> sampler)
    : dataset_(std::move(dataset)), opt_(options), sampler_(std::move(sampler)), state_(std::make_unique<State>()) {
  ATH_CHECK(dataset_ != nullptr, kOp, "the dataset is null", Hint{"pass a dataset, e.g. fashion_mnist(default_fashion_mnist_dir(), true)"});
  ATH_CHECK(opt_.batch_size > 0, kOp, "batch_size must be positive, got ", opt_.batch_size, Hint{"e.g. batch_size = 32"});
  ATH_CHECK(opt_.num_workers >= 0, kOp, "num_workers must be >= 0, got ", opt_.num_workers,
            Hint{"0 builds batches in the calling thread; 2-4 workers usually keep up with training"});
  ATH_CHECK(opt_.prefetch >= 0, kOp, "prefetch must be >= 0, got ", opt_.prefetch, Hint{"e.g. prefetch = 4 batches"});
  if (!sampler_) sampler_ = opt_.shuffle ? random_sampler(dataset_->size(), opt_.seed) : sequential_sampler(dataset_->size());
  State& s = *state_;
  auto first = std::make_shared<const std::vector<int64_t>>(sampler_->indices(0));
  s.epoch_len = static_cast<int64_t>(first->size());
  s.orders.emplace(0, first);
  const int64_t B = opt_.batch_size;
  s.bpe = opt_.drop_last ? s.epoch_len / B : (s.epoch_len + B - 1) / B;
  ATH_CHECK(s.bpe > 0, kOp, dataset_->describe(), ": an epoch of ", s.epoch_len, " samples gives no ",
            opt_.drop_last ? "full " : "", "batch of ", B, Hint{"use a smaller batch_size, or drop_last = false"});
  s.capacity = std::max<int64_t>({opt_.prefetch, opt_.num_workers, 1});
  start();
}

DataLoader::~DataLoader() { stop(); }

void DataLoader::start() {
  State& s = *state_;
  s.stopping = false;
  for (int w = 0; w < opt_.num_workers; ++w) {
    s.workers.emplace_back([this] {
      lower_own_priority();
      State& st = *state_;
      const std::function<bool()> stopping = [&st] { return st.stopping.load(std::memory_order_relaxed); };
      std::unique_lock<std::mutex> lk(st.mu);
      for (;;) {
        st.cv_work.wait(lk, [&] { return st.stopping || st.claim - st.consume < st.capacity; });
        if (st.stopping) return;
        const int64_t g = st.claim++;
        Result r;
        try {
          auto order = st.order_locked(*sampler_, g / st.bpe);
          lk.unlock();
          r.batch = build_batch(*dataset_, *order, g, st.bpe, opt_.batch_size, stopping);
        } catch (const Stopped&) {
          return;  // the lock is not held here
        } catch (...) {
          r.error = std::current_exception();
        }
        if (!lk.owns_lock()) lk.lock();
        if (st.stopping) return;
        st.ready.emplace(g, std::move(r));
        st.cv_ready.notify_all();
      }
    });
  }
}

void DataLoader::stop() {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    s.stopping = true;
  }
  s.cv_work.notify_all();
  for (auto& t : s.workers) t.join();
  s.workers.clear();
}

Batch DataLoader::next() {
  State& s = *state_;
  std::shared_ptr<const std::vector<int64_t>> order;
  int64_t g;
  Result r;
  bool prefetched = false;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    g = s.consume;
    if (g < s.claim) {  // a worker has it (ready, or being built): wait for it
      std::unique_lock<std::mutex> ul(s.mu, std::adopt_lock);
      s.cv_ready.wait(ul, [&] { return s.ready.count(g) > 0; });
      ul.release();
    }
    auto it = s.ready.find(g);
    if (it != s.ready.end()) {
      r = std::move(it->second);
      s.ready.erase(it);
      prefetched = true;
    } else {
      order = s.order_locked(*sampler_, g / s.bpe);  // built below, here (see the header)
    }
    s.consume = g + 1;
    s.claim = std::max(s.claim, s.consume);
    s.orders.erase(s.orders.begin(), s.orders.lower_bound(s.consume / s.bpe));
  }
  if (opt_.num_workers > 0) s.cv_work.notify_one();  // one slot freed: one worker is enough
  if (!prefetched) return build_batch(*dataset_, *order, g, s.bpe, opt_.batch_size, nullptr);
  if (r.error) std::rethrow_exception(r.error);
  return std::move(r.batch);
}

int64_t DataLoader::batches_per_epoch() const { return state_->bpe; }

LoaderPosition DataLoader::position() const {
  State& s = *state_;
  std::lock_guard<std::mutex> lk(s.mu);
  return {s.consume / s.bpe, s.consume % s.bpe};
}

void DataLoader::set_position(LoaderPosition p) {
  State& s = *state_;
  ATH_CHECK(p.epoch >= 0 && p.batch >= 0 && p.batch <= s.bpe, kOp, "position (epoch ", p.epoch, ", batch ", p.batch,
            ") is out of range: an epoch has ", s.bpe, " batches", Hint{"restore a position saved by position() with the same dataset and batch_size"});
  stop();
  std::lock_guard<std::mutex> lk(s.mu);
  s.ready.clear();
  s.consume = s.claim = p.epoch * s.bpe + p.batch;  // batch == bpe is the start of the next epoch
  s.orders.erase(s.orders.begin(), s.orders.lower_bound(s.consume / s.bpe));
  start();
}

}  // namespace athanor::data
