// Issue 7: after warm-up, a training step reuses its memory. It makes no calls to
// the system allocator (Allocator::cpu() counters) and takes (almost) no page
// faults (getrusage minor faults; a first touch of a fresh 4 KiB page costs
// ~10 µs here, so a step that re-faults its buffers loses most of its time).
//
// Allowance: the training thread <= 1 minor fault per step; the whole process
// (OpenMP workers and data-loader threads included) <= 5 per step. Measured with
// glibc kept from returning memory: 0.0-0.2 per step for both. The slack covers
// the trainer's history vector doubling and a loader thread touching a new stack
// page, not buffers re-faulted every step (those cost hundreds of faults/step).
//
// Why it holds: the tagged allocator caches its blocks; the GEMMs run on oneDNN
// matmul primitives with a per-thread scratchpad (src/backend/cpu/gemm.cpp); glibc is
// kept from handing freed memory back to the kernel, and its heap's top pad is made
// resident when the heap grows (src/core/allocator.cpp), for what still mallocs per
// call. Before that a small GPT step re-faulted ~1,600 times (1 thread), an MLP step
// 30-130 times. Page faults are a process-wide count, so these tests live in
// tests/slow/ (run serially): another test's threads do not share the process, but
// a loaded machine shifts which thread frees what, and the figure is only
// meaningful measured alone.
#include <omp.h>
#include <sys/resource.h>

#include <cstdio>
#include <filesystem>

#include "athanor/core/allocator.h"
#include "athanor/data/dataset.h"
#include "athanor/train/trainer.h"
#include "test_util.h"

namespace athanor {
namespace fs = std::filesystem;

namespace {

constexpr double kThreadFaultsPerStep = 1.0;
constexpr double kProcessFaultsPerStep = 5.0;
constexpr int kWarmupSteps = 8;  // past the loader's prefetch depth, so its buffers are cached too
constexpr int kMeasuredSteps = 6;

long minor_faults(int who) {
  rusage u{};
  getrusage(who, &u);
  return u.ru_minflt;
}

struct SteadyState {
  double process_faults_per_step = 0, thread_faults_per_step = 0;
  uint64_t system_allocs = 0, system_frees = 0;
};

// Warm-up steps, then measured steps of the trainer (its max_steps must allow both).
SteadyState measure(train::Trainer& t, const char* what) {
  t.set_output([](const std::string&) {});
  for (int i = 0; i < kWarmupSteps; ++i) t.train_step();
  const MemoryStats a0 = Allocator::cpu().stats();
  const long p0 = minor_faults(RUSAGE_SELF), t0 = minor_faults(RUSAGE_THREAD);
  for (int i = 0; i < kMeasuredSteps; ++i) t.train_step();
  const long p1 = minor_faults(RUSAGE_SELF), t1 = minor_faults(RUSAGE_THREAD);
  const MemoryStats a1 = Allocator::cpu().stats();
  SteadyState s;
  s.process_faults_per_step = static_cast<double>(p1 - p0) / kMeasuredSteps;
  s.thread_faults_per_step = static_cast<double>(t1 - t0) / kMeasuredSteps;
  s.system_allocs = a1.system_allocs - a0.system_allocs;
  s.system_frees = a1.system_frees - a0.system_frees;
  std::printf("[%s, %d OpenMP threads] after %d warm-up steps, per step over %d steps: %.1f minor faults (process), "
              "%.1f (training thread); system allocs %llu, frees %llu in total\n",
              what, omp_get_max_threads(), kWarmupSteps, kMeasuredSteps, s.process_faults_per_step,
              s.thread_faults_per_step, (unsigned long long)s.system_allocs, (unsigned long long)s.system_frees);
  EXPECT_EQ(t.step(), kWarmupSteps + kMeasuredSteps);
  return s;
}

void expect_steady(const SteadyState& s) {
  EXPECT_EQ(s.system_allocs, 0u) << "a warm training step reached the system allocator";
  EXPECT_EQ(s.system_frees, 0u) << "a warm training step gave memory back to the system";
  EXPECT_LE(s.thread_faults_per_step, kThreadFaultsPerStep);
  EXPECT_LE(s.process_faults_per_step, kProcessFaultsPerStep);
}

train::Config gpt_config(const std::string& dir) {
  const std::string text = testing::write_tiny_text(dir);
  return train::Config::parse(
      "model: {type: gpt, n_layer: 2, n_head: 4, n_embd: 256, block_size: 256}\n"
      "data: {type: text, tokenizer: byte, corpus: " + text + ", cache_dir: " + dir + "/cache, num_workers: 2}\n"
      "optimizer: {type: adamw, lr: 1.0e-3, weight_decay: 0.1, grad_clip: 1.0}\n"
      "trainer: {batch_size: 8, max_steps: 14, eval_every: 0}\n",
      "no_page_faults_gpt.yaml", {"out_dir=" + dir});
}

bool have_fashion() { return fs::exists(data::default_fashion_mnist_dir() + "/train-images-idx3-ubyte.gz"); }

// Sets the OpenMP thread count for the scope.
class OmpThreads {
 public:
  explicit OmpThreads(int n) : prev_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~OmpThreads() { omp_set_num_threads(prev_); }
 private:
  int prev_;
};

}  // namespace

static train::Config mlp_config(const std::string& dir) {
  return train::Config::parse("model: {type: mlp, sizes: [784, 1024, 1024, 10]}\n"
                              "data: {type: fashion_mnist, num_workers: 2}\n"
                              "optimizer: {type: sgd, lr: 0.05, momentum: 0.9}\n"
                              "trainer: {batch_size: 128, max_steps: 14, eval_every: 0}\n",
                              "no_page_faults_mlp.yaml", {"out_dir=" + dir});
}

// What holds today: warm steps never reach the system allocator through athanor's
// Allocator (all tensor memory comes from its cache). The fault figures are printed.
TEST(NoPageFaults, WarmGptStepsMakeNoSystemAllocatorCalls) {
  const std::string dir = testing::fresh_temp_dir("no_page_faults_gpt_alloc");
  train::Trainer t(gpt_config(dir), /*write_run_files=*/false);
  const SteadyState s = measure(t, "GPT 2x256, T=256, B=8, AdamW");
  EXPECT_EQ(s.system_allocs, 0u) << "a warm training step reached the system allocator";
  EXPECT_EQ(s.system_frees, 0u) << "a warm training step gave memory back to the system";
}

TEST(NoPageFaults, WarmMlpStepsMakeNoSystemAllocatorCalls) {
  ATHANOR_SKIP_IF_MISSING(!have_fashion(), "dataset-fashion-mnist is not installed");
  const std::string dir = testing::fresh_temp_dir("no_page_faults_mlp_alloc");
  train::Trainer t(mlp_config(dir), /*write_run_files=*/false);
  const SteadyState s = measure(t, "MLP 784-1024-1024-10, B=128, SGD");
  EXPECT_EQ(s.system_allocs, 0u);
  EXPECT_EQ(s.system_frees, 0u);
}

// The page-fault requirement on the default 2 OpenMP threads. Until issue 7 this
// failed in some runs (0-65 faults/step, up to 33 on the training thread): perf
// (exceptions:page_fault_user) put them in oneDNN's JIT'ed sgemm code writing fresh
// pages at the top of the malloc heap. sgemm mallocs its packing buffers on every
// call from whichever thread runs it; with two threads the order of those mallocs and
// frees varies from step to step, so the heap's high-water mark kept creeping into
// the untouched top pad (no brk or mmap in steady state: strace shows none). The GEMMs
// now run on oneDNN matmul primitives with a per-thread scratchpad (gemm.cpp), inside
// parallel regions too (the attention tiles); that alone left 2-9 faults/step from
// kernels' std::vector scratch (sum_3d, index_accumulate_rows), which the populated
// top pad (allocator.cpp) absorbs. Measured after both on the loaded 2-core dev box:
// 0.0 faults/step and no system allocations in 10 runs of this test alone and 10 runs
// of the whole file (50 measurements).
TEST(NoPageFaults, GptStepsTakeNoPageFaults) {
  const std::string dir = testing::fresh_temp_dir("no_page_faults_gpt");
  train::Trainer t(gpt_config(dir), /*write_run_files=*/false);
  expect_steady(measure(t, "GPT 2x256, T=256, B=8, AdamW"));
}

TEST(NoPageFaults, GptStepsTakeNoPageFaultsOnOneThread) {
  OmpThreads one(1);
  const std::string dir = testing::fresh_temp_dir("no_page_faults_gpt1");
  train::Trainer t(gpt_config(dir), /*write_run_files=*/false);
  expect_steady(measure(t, "GPT 2x256, T=256, B=8, AdamW"));
}

TEST(NoPageFaults, MlpStepsTakeNoPageFaults) {
  ATHANOR_SKIP_IF_MISSING(!have_fashion(), "dataset-fashion-mnist is not installed");
  const std::string dir = testing::fresh_temp_dir("no_page_faults_mlp");
  train::Trainer t(mlp_config(dir), /*write_run_files=*/false);
  expect_steady(measure(t, "MLP 784-1024-1024-10, B=128, SGD"));
}

}  // namespace athanor
