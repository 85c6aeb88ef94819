// DataLoader and samplers: determinism across worker counts, coverage,
// reshuffling, resumption, worker errors and shutdown.
#include <atomic>
#include <chrono>
#include <set>
#include <optional>
#include <stdexcept>
#include <thread>

#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "athanor/data/dataloader.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
using namespace athanor::data;

namespace {

// Sample i: input [2] f32 = {i, -i}, target [] i64 = i. Optionally throws for
// one index, or sleeps in get() to keep workers busy.
class RangeDataset : public Dataset {
 public:
  explicit RangeDataset(int64_t n, int64_t bad = -1, int sleep_ms = 0) : n_(n), bad_(bad), sleep_ms_(sleep_ms) {}
  int64_t size() const override { return n_; }
  Sample get(int64_t i) const override {
    ++calls;
    if (sleep_ms_) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
    if (i == bad_) throw std::runtime_error("corrupt record");
    return {from_vector(std::vector<float>{float(i), float(-i)}, {2}), scalar_tensor(double(i), DType::i64)};
  }
  std::string describe() const override { return "range(" + std::to_string(n_) + ")"; }
  mutable std::atomic<int64_t> calls{0};

 private:
  int64_t n_, bad_;
  int sleep_ms_;
};

std::vector<int64_t> ids_of(const Batch& b) {
  // The sample ids, checked against the batch's contents.
  const auto in = b.input.to_vector(), tg = b.target.to_vector();
  EXPECT_EQ(in.size(), 2 * b.sample_ids.size());
  for (size_t k = 0; k < b.sample_ids.size(); ++k) {
    EXPECT_EQ(in[2 * k], double(b.sample_ids[k]));
    EXPECT_EQ(in[2 * k + 1], -double(b.sample_ids[k]));
    EXPECT_EQ(tg[k], double(b.sample_ids[k]));
  }
  return b.sample_ids;
}

std::vector<std::vector<int64_t>> run(DataLoader& dl, int batches) {
  std::vector<std::vector<int64_t>> out;
  for (int i = 0; i < batches; ++i) out.push_back(ids_of(dl.next()));
  return out;
}

LoaderOptions opts(int64_t bs, int workers, bool shuffle = true, bool drop_last = true, uint64_t seed = 7) {
  LoaderOptions o;
  o.batch_size = bs;
  o.num_workers = workers;
  o.shuffle = shuffle;
  o.drop_last = drop_last;
  o.seed = seed;
  o.prefetch = 3;
  return o;
}

}  // namespace

TEST(Samplers, SequentialAndRandomArePermutations) {
  EXPECT_EQ(sequential_sampler(4)->indices(3), (std::vector<int64_t>{0, 1, 2, 3}));
  auto s = random_sampler(1000, 42);
  auto e0 = s->indices(0), e1 = s->indices(1);
  EXPECT_EQ(e0, random_sampler(1000, 42)->indices(0));  // a pure function of (seed, epoch)
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, random_sampler(1000, 43)->indices(0));
  for (const auto& e : {e0, e1}) {
    std::vector<int64_t> sorted = e;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  }
  EXPECT_TRUE(random_sampler(0, 1)->indices(0).empty());
  EXPECT_EQ(random_sampler(1, 1)->indices(5), std::vector<int64_t>{0});
}

TEST(DataLoader, SameBatchesForAnyNumberOfWorkers) {
  auto ds = std::make_shared<RangeDataset>(103);
  for (bool drop_last : {true, false}) {
    DataLoader ref(ds, opts(8, 0, true, drop_last));
    const int total = 3 * static_cast<int>(ref.batches_per_epoch()) + 2;  // crosses two epoch boundaries
    const auto expected = run(ref, total);
    for (int workers : {1, 3}) {
      DataLoader dl(ds, opts(8, workers, true, drop_last));
      EXPECT_EQ(run(dl, total), expected) << workers << " workers, drop_last " << drop_last;
    }
  }
}

TEST(DataLoader, EveryIndexOncePerEpoch) {
  auto ds = std::make_shared<RangeDataset>(103);
  DataLoader dl(ds, opts(10, 2, true, /*drop_last=*/false));
  EXPECT_EQ(dl.batches_per_epoch(), 11);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::multiset<int64_t> seen;
    for (int k = 0; k < 11; ++k) {
      EXPECT_EQ(dl.position(), (LoaderPosition{epoch, k}));
      Batch b = dl.next();
      EXPECT_EQ(b.input.size(0), k < 10 ? 10 : 3);
      EXPECT_EQ(b.num_targets, k < 10 ? 10 : 3);
      for (auto id : ids_of(b)) seen.insert(id);
    }
    ASSERT_EQ(seen.size(), 103u);
    for (int64_t i = 0; i < 103; ++i) EXPECT_EQ(seen.count(i), 1u) << "index " << i << " epoch " << epoch;
  }
  EXPECT_EQ(dl.position(), (LoaderPosition{2, 0}));

  DataLoader dropped(ds, opts(10, 2, true, /*drop_last=*/true));
  EXPECT_EQ(dropped.batches_per_epoch(), 10);
  DataLoader seq(ds, opts(10, 0, /*shuffle=*/false));
  EXPECT_EQ(ids_of(seq.next()), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(DataLoader, ReshufflesEachEpochReproducibly) {
  auto ds = std::make_shared<RangeDataset>(64);
  DataLoader a(ds, opts(64, 2, true, true, /*seed=*/5)), b(ds, opts(64, 1, true, true, /*seed=*/5)),
      c(ds, opts(64, 2, true, true, /*seed=*/6));
  auto a0 = ids_of(a.next()), a1 = ids_of(a.next());
  EXPECT_NE(a0, a1);  // a new order each epoch
  EXPECT_EQ(ids_of(b.next()), a0);
  EXPECT_EQ(ids_of(b.next()), a1);
  EXPECT_NE(ids_of(c.next()), a0);  // another seed, another order
  EXPECT_EQ(a0, random_sampler(64, 5)->indices(0));
  EXPECT_EQ(a1, random_sampler(64, 5)->indices(1));
}

TEST(DataLoader, SetPositionResumesExactly) {
  auto ds = std::make_shared<RangeDataset>(50);
  for (int workers : {0, 2}) {
    DataLoader full(ds, opts(4, workers));
    const auto expected = run(full, 30);  // 12 batches per epoch: crosses epochs
    DataLoader a(ds, opts(4, workers));
    run(a, 17);
    const LoaderPosition pos = a.position();
    EXPECT_EQ(pos, (LoaderPosition{1, 5}));
    DataLoader b(ds, opts(4, 3 - workers));
    run(b, 3);  // running workers are restarted at the new position
    b.set_position(pos);
    EXPECT_EQ(b.position(), pos);
    for (int k = 17; k < 30; ++k) EXPECT_EQ(ids_of(b.next()), expected[k]) << "batch " << k;
    b.set_position({0, 12});  // the end of epoch 0 is the start of epoch 1
    EXPECT_EQ(b.position(), (LoaderPosition{1, 0}));
    EXPECT_EQ(ids_of(b.next()), expected[12]);
    auto msg = error_message([&] { b.set_position({0, 13}); });
    EXPECT_NE(msg.find("an epoch has 12 batches"), std::string::npos) << msg;
  }
}

TEST(DataLoader, WorkerErrorsNameTheSample) {
  for (int workers : {0, 1, 3}) {
    SCOPED_TRACE(workers);
    auto ds = std::make_shared<RangeDataset>(40, /*bad=*/21);
    DataLoader dl(ds, opts(8, workers, /*shuffle=*/false));
    run(dl, 2);
    auto msg = error_message([&] { dl.next(); });  // batch 2 holds 16..23
    EXPECT_NE(msg.find("sample 21 of range(40) (epoch 0, batch 2) failed: corrupt record"), std::string::npos) << msg;
    EXPECT_EQ(dl.position(), (LoaderPosition{0, 3}));  // the loader moves on
    EXPECT_EQ(ids_of(dl.next()).front(), 24);
  }
}

namespace {
// RangeDataset with the get_batch fast path: the batch built directly (no get()).
class RangeBatchDataset : public RangeDataset {
 public:
  using RangeDataset::RangeDataset;
  std::optional<Batch> get_batch(const std::vector<int64_t>& ids) const override {
    ++batch_calls;
    const auto n = static_cast<int64_t>(ids.size());
    std::vector<float> in;
    std::vector<int64_t> tg;
    for (int64_t i : ids) {
      if (i == bad_index) throw std::runtime_error("corrupt record");
      in.insert(in.end(), {float(i), float(-i)});
      tg.push_back(i);
    }
    return Batch{from_vector(in, {n, 2}), from_vector(tg, {n}), ids, n};
  }
  mutable std::atomic<int64_t> batch_calls{0};
  int64_t bad_index = -1;
};
}  // namespace

TEST(DataLoader, GetBatchFastPathGivesTheSameBatchesAndNamesFailures) {
  auto per_sample = std::make_shared<RangeDataset>(103);
  DataLoader ref(per_sample, opts(8, 0));
  const auto expected = run(ref, 30);
  for (int workers : {0, 2}) {
    SCOPED_TRACE(workers);
    auto fast = std::make_shared<RangeBatchDataset>(103);
    DataLoader dl(fast, opts(8, workers));
    EXPECT_EQ(run(dl, 30), expected);  // ids_of also checks the contents
    EXPECT_EQ(fast->calls.load(), 0);  // get() never called
    EXPECT_GE(fast->batch_calls.load(), 30);
    auto bad = std::make_shared<RangeBatchDataset>(40);
    bad->bad_index = 21;
    DataLoader dl2(bad, opts(8, workers, /*shuffle=*/false));
    run(dl2, 2);
    auto msg = error_message([&] { dl2.next(); });  // batch 2 holds 16..23
    EXPECT_NE(msg.find("batch 2 of epoch 0 of range(40) failed: corrupt record"), std::string::npos) << msg;
    EXPECT_EQ(ids_of(dl2.next()).front(), 24);
  }
}

#ifdef __linux__
// Loader threads yield to the training threads (see dataloader.cpp): nice 19.
TEST(DataLoader, WorkersRunAtTheLowestPriority) {
  class RecordsPriority : public RangeDataset {
   public:
    RecordsPriority() : RangeDataset(64), caller_(std::this_thread::get_id()) {}
    Sample get(int64_t i) const override {
      if (std::this_thread::get_id() != caller_)
        worker_nice = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
      return RangeDataset::get(i);
    }
    mutable std::atomic<int> worker_nice{-100};

   private:
    std::thread::id caller_;
  };
  const int caller_nice = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  auto ds = std::make_shared<RecordsPriority>();
  DataLoader dl(ds, opts(4, 1));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (ds->worker_nice == -100 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(ds->worker_nice.load(), 19);
  EXPECT_EQ(getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid))), caller_nice) << "the caller's priority is untouched";
}
#endif

TEST(DataLoader, InvalidOptions) {
  auto ds = std::make_shared<RangeDataset>(5);
  auto msg = error_message([&] { DataLoader(ds, opts(0, 0)); });
  EXPECT_NE(msg.find("batch_size must be positive"), std::string::npos) << msg;
  msg = error_message([&] { DataLoader(ds, opts(8, 0)); });
  EXPECT_NE(msg.find("an epoch of 5 samples gives no full batch of 8"), std::string::npos) << msg;
  DataLoader partial(ds, opts(8, 0, true, /*drop_last=*/false));
  EXPECT_EQ(partial.next().input.size(0), 5);
  DataLoader wrong(ds, opts(2, 0), sequential_sampler(9));  // a sampler for a larger dataset
  wrong.next();
  wrong.next();
  msg = error_message([&] { wrong.next(); });
  EXPECT_NE(msg.find("the sampler gave index"), std::string::npos) << msg;
  msg = error_message([&] { DataLoader(nullptr, opts(2, 0)); });
  EXPECT_NE(msg.find("dataset is null"), std::string::npos) << msg;
}

TEST(DataLoader, DestructorDoesNotHang) {
  using clock = std::chrono::steady_clock;
  {
    // Full queue: workers are blocked waiting for a free slot.
    auto ds = std::make_shared<RangeDataset>(1000);
    auto t0 = clock::now();
    {
      DataLoader dl(ds, opts(4, 3));
      dl.next();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_LT(clock::now() - t0, std::chrono::milliseconds(1000));
    EXPECT_LE(ds->calls.load(), 4 * (1 + 3 + 3));  // bounded prefetch: at most capacity batches ahead
  }
  {
    // Slow samples: workers are inside get(); they stop after the current sample.
    auto ds = std::make_shared<RangeDataset>(1000, -1, /*sleep_ms=*/20);
    auto t0 = clock::now();
    { DataLoader dl(ds, opts(50, 3)); }
    EXPECT_LT(clock::now() - t0, std::chrono::milliseconds(1000));
  }
  {
    // Never consumed, and a worker error pending.
    auto ds = std::make_shared<RangeDataset>(100, /*bad=*/0);
    DataLoader dl(ds, opts(4, 2, false));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace athanor
