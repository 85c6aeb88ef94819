// The observer's statistics of CUDA tensors computed on the device (athanor/ops/value_stats.h,
// src/backend/cuda/stats.cu) against the same functions on the CPU copy (their CPU loops are
// checked against plain loops in tests/ops/test_value_stats.cpp and tests/train):
//  - value_stats in f32, bf16 and f16, contiguous, transposed and large (many blocks of the
//    grid-stride loop), with NaN, ±inf, zeros and saturated values; an empty and a 0-d tensor;
//  - squared distances, the fired units (last dim, NCHW, OR-ed over calls), histograms;
//  - the step observer's l2_norm, activation_stats (relu, sigmoid, tanh, NCHW) and
//    before_update / after_update (norms, update ratio, histograms) on cuda against the CPU,
//    reading back a few bytes per tensor, never the tensors;
//  - a logged step of a tiny GPT on cuda: the layer statistics match the CPU run's, and
//    they add fewer device-to-host bytes than 1% of the activations + weights + gradients
//    they describe (cuda::host_read_bytes).
#include <cmath>
#include <iostream>
#include <limits>

#include "athanor/ops.h"
#include "athanor/ops/value_stats.h"
#include "athanor/train/trainer.h"
#include "backend/cuda/host_reads.h"
#include "gpu_test.h"
#include "test_util.h"
#include "train/step_observer.h"

using namespace athanor;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN(), kInf = std::numeric_limits<double>::infinity();

// [rows, cols] f32 on the CPU: uniform in [-1.5, 1.5] with zeros, NaN, ±inf and values near
// the sigmoid/tanh bounds sprinkled in.
Tensor sample(int64_t rows, int64_t cols, unsigned seed) {
  std::vector<float> v = gpu_test::random_vector(static_cast<size_t>(rows * cols), seed, -1.5f, 1.5f);
  for (size_t i = 0; i < v.size(); i += 97) v[i] = 0.0f;
  for (size_t i = 5; i < v.size(); i += 211) v[i] = 0.995f;
  for (size_t i = 7; i < v.size(); i += 223) v[i] = 0.004f;
  for (size_t i = 11; i < v.size(); i += 401) v[i] = std::numeric_limits<float>::quiet_NaN();
  for (size_t i = 13; i < v.size(); i += 503) v[i] = (i / 503) % 2 ? std::numeric_limits<float>::infinity()
                                                                   : -std::numeric_limits<float>::infinity();
  return from_vector(v, {rows, cols});
}

// accumulate_fired_units into `rec` (a new record when undefined), returned.
Tensor fired_of(const Tensor& x, Tensor rec) {
  accumulate_fired_units(x, rec);
  return rec;
}

void expect_same(const TensorStats& got, const TensorStats& want, const std::string& what) {
  EXPECT_EQ(got.numel, want.numel) << what;
  EXPECT_EQ(got.finite, want.finite) << what;
  EXPECT_NEAR(got.sum, want.sum, 1e-12 * std::max(1.0, want.sum_squares)) << what;  // only the order of the sum differs
  EXPECT_NEAR(got.sum_squares, want.sum_squares, 1e-12 * std::max(1.0, want.sum_squares)) << what;
  EXPECT_EQ(got.absmax, want.absmax) << what;
  EXPECT_EQ(got.min, want.min) << what;
  EXPECT_EQ(got.max, want.max) << what;
  EXPECT_EQ(got.zeros, want.zeros) << what;
  EXPECT_EQ(got.saturated, want.saturated) << what;
  EXPECT_EQ(got.nans, want.nans) << what;
  EXPECT_EQ(got.infs, want.infs) << what;
}

void expect_near(double got, double want, double rtol, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what << ": " << got;
    return;
  }
  EXPECT_NEAR(got, want, rtol * std::max(1e-30, std::fabs(want)) + 1e-15) << what;
}

}  // namespace

TEST(GpuStats, ValueStatsMatchTheCpuInEveryDtypeLayoutAndSize) {
  ATH_REQUIRE_GPU();
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{37, 129}, {300, 1111}}) {
      const Tensor x = sample(rows, cols, static_cast<unsigned>(rows)).to(dt), xd = x.cuda();
      for (Saturation sat : {Saturation::none, Saturation::sigmoid, Saturation::tanh}) {
        const std::string what = std::string(dtype_name(dt)) + " [" + std::to_string(rows) + ", " + std::to_string(cols) +
                                 "] saturation " + std::to_string(static_cast<int>(sat));
        const TensorStats want = value_stats(x, sat);
        ASSERT_GT(want.nans, 0) << what;
        ASSERT_GT(want.infs, 0) << what;
        ASSERT_GT(want.zeros, 0) << what;
        expect_same(value_stats(xd, sat), want, what);
        expect_same(value_stats(transpose(xd, 0, 1), sat), value_stats(transpose(x, 0, 1), sat), what + " transposed");
      }
    }
  }
  // A list: one read for all, each as alone.
  const Tensor a = sample(8, 9, 1), b = sample(64, 3, 2).to(DType::bf16), ad = a.cuda(), bd = b.cuda();
  const std::uint64_t reads = cuda::host_sync_count(0);
  const auto both = value_stats_list({ad, bd});
  ASSERT_EQ(both.size(), 2u);
  expect_same(both[0], value_stats(a), "list[0]");
  expect_same(both[1], value_stats(b), "list[1]");
  EXPECT_LE(cuda::host_sync_count(0) - reads, 1u) << "a list is read back at once";
  // Empty and 0-d.
  const TensorStats e = value_stats(empty({0, 4}, TensorOptions(DType::f32).with_device(Device::cuda(0))));
  EXPECT_EQ(e.numel, 0);
  EXPECT_EQ(e.finite, 0);
  EXPECT_EQ(e.sum, 0);
  EXPECT_EQ(e.min, kInf);
  EXPECT_EQ(e.max, -kInf);
  const TensorStats s = value_stats(full({}, -2.5, {DType::f32}).cuda());
  EXPECT_EQ(s.finite, 1);
  EXPECT_EQ(s.sum, -2.5);
  EXPECT_EQ(s.absmax, 2.5);
}

TEST(GpuStats, SquaredDistancesFiredUnitsAndHistogramsMatchTheCpu) {
  ATH_REQUIRE_GPU();
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const std::string what = dtype_name(dt);
    const Tensor a = sample(200, 301, 3).to(dt), b = sample(200, 301, 4).to(dt);
    const auto want = squared_distances({a, transpose(a, 0, 1)}, {b, transpose(b, 0, 1)});
    const auto got = squared_distances({a.cuda(), transpose(a.cuda(), 0, 1)}, {b.cuda(), transpose(b.cuda(), 0, 1)});
    ASSERT_EQ(got.size(), 2u);
    expect_near(got[0], want[0], 1e-12, what + " distance");  // NaN: the samples hold NaN at the same places
    const Tensor fa = from_vector(gpu_test::random_vector(300 * 301, 9, -1.0f, 1.0f), {300, 301}).to(dt);
    const Tensor fb = from_vector(gpu_test::random_vector(300 * 301, 10, -1.0f, 1.0f), {300, 301}).to(dt);
    expect_near(squared_distances({fa.cuda()}, {fb.cuda()})[0], squared_distances({fa}, {fb})[0], 1e-12, what + " finite distance");
    // Fired units: mostly negative, a few units fire; NCHW [3, 5, 4, 6] and [2, 7, 9] (transposed).
    std::vector<float> v = gpu_test::random_vector(3 * 5 * 4 * 6, 5, -2.0f, 0.05f);
    const Tensor nchw = from_vector(v, {3, 5, 4, 6}).to(dt);
    const Tensor rec_cpu = fired_of(nchw, Tensor());
    const Tensor rec_gpu = fired_of(nchw.cuda(), Tensor());
    EXPECT_EQ(rec_gpu.cpu().to_vector(), rec_cpu.to_vector()) << what << " NCHW";
    const Tensor t3 = transpose(from_vector(gpu_test::random_vector(2 * 9 * 7, 6, -3.0f, 0.1f), {2, 9, 7}).to(dt), 1, 2);
    Tensor rc = fired_of(t3, Tensor()), rg = fired_of(t3.cuda(), Tensor());
    EXPECT_EQ(rg.cpu().to_vector(), rc.to_vector()) << what << " last dim, strided";
    const Tensor t3b = from_vector(gpu_test::random_vector(2 * 7 * 9, 7, -3.0f, 0.2f), {2, 7, 9}).to(dt);
    rc = fired_of(t3b, rc), rg = fired_of(t3b.cuda(), rg);
    EXPECT_EQ(rg.cpu().to_vector(), rc.to_vector()) << what << " OR-ed over two calls";
    // Histograms (train/step_observer.cpp): the same buckets, counted exactly.
    for (const Tensor& h : {a, transpose(a, 0, 1), fa}) {
      const observe::Histogram hc = train::histogram("t", h), hg = train::histogram("t", h.cuda());
      EXPECT_EQ(hg.num, hc.num) << what;
      EXPECT_EQ(hg.min, hc.min) << what;
      EXPECT_EQ(hg.max, hc.max) << what;
      EXPECT_EQ(hg.bucket_limit, hc.bucket_limit) << what;
      EXPECT_EQ(hg.bucket, hc.bucket) << what;
      expect_near(hg.sum_squares, hc.sum_squares, 1e-12, what + " histogram sum of squares");
    }
  }
}

TEST(GpuStats, ObserverStatisticsOnCudaMatchTheCpuAndReadFewBytes) {
  ATH_REQUIRE_GPU();
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::string what = dtype_name(dt);
    const Tensor y = sample(64, 96, 8).to(dt), yd = y.cuda();
    EXPECT_TRUE(std::isnan(train::l2_norm(yd))) << "a NaN makes the norm NaN, as on the CPU";
    const Tensor f = from_vector(gpu_test::random_vector(64 * 96, 12, -1.0f, 1.0f), {64, 96}).to(dt);
    expect_near(train::l2_norm(f.cuda()), train::l2_norm(f), 1e-12, what + " l2_norm");
    const Tensor sig = sigmoid(f * 6.0), th = tanh(f * 4.0), rl = relu(f - 0.9);
    const Tensor conv = relu(from_vector(gpu_test::random_vector(4 * 6 * 5 * 5, 13, -1.0f, 0.1f), {4, 6, 5, 5}).to(dt));
    for (const auto& [op, t] : std::vector<std::pair<std::string, Tensor>>{
             {"relu", rl}, {"sigmoid", sig}, {"tanh", th}, {"linear", y}, {"relu", conv}}) {
      const observe::ActivationStats c = train::activation_stats("l", op, t), g = train::activation_stats("l", op, t.cuda());
      const std::string w = what + " " + op + " " + t.describe();
      expect_near(g.mean, c.mean, 1e-9, w + " mean");
      expect_near(g.std, c.std, 1e-9, w + " std");
      EXPECT_EQ(g.absmax, c.absmax) << w;
      EXPECT_EQ(g.zero_frac, c.zero_frac) << w;
      EXPECT_EQ(g.dead_frac, c.dead_frac) << w;
      EXPECT_EQ(g.saturated_frac, c.saturated_frac) << w;
      EXPECT_EQ(g.units, c.units) << w;
    }
  }
  // before_update / after_update on cuda against the CPU, with the weights kept on the device.
  const Tensor w0 = from_vector(gpu_test::random_vector(256 * 512, 20), {256, 512});
  const Tensor b0 = from_vector(gpu_test::random_vector(512, 21), {512});
  const Tensor w1 = from_vector(gpu_test::random_vector(256 * 512, 22, -1.01f, 1.01f), {256, 512});
  const Tensor b1 = from_vector(gpu_test::random_vector(512, 23), {512});
  auto run = [&](Device dev, std::uint64_t* read_bytes) {
    Tensor w = w0.to(dev).clone(), b = b0.to(dev).clone();
    w.set_grad((w0 * 0.5).to(dev));
    b.set_grad((b0 * 0.25).to(dev));
    const optim::NamedTensors named = {{"w", w}, {"b", b}};
    train::StepObserver obs(1, true, 1, 4);
    observe::StepMetrics m;
    const std::uint64_t bytes0 = dev.is_cpu() ? 0 : cuda::host_read_bytes(0);
    obs.before_update(named, m, /*keep_weights=*/true, /*histograms=*/true);
    copy_into(w, w1.to(dev));  // the "update"
    copy_into(b, b1.to(dev));
    obs.after_update(named, m);
    if (read_bytes) *read_bytes = cuda::host_read_bytes(0) - bytes0;
    return m;
  };
  std::uint64_t bytes = 0;
  const observe::StepMetrics mc = run(Device::cpu(), nullptr), mg = run(Device::cuda(0), &bytes);
  ASSERT_EQ(mg.layers.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    expect_near(mg.layers[i].grad_norm, mc.layers[i].grad_norm, 1e-12, mc.layers[i].name + " grad norm");
    expect_near(mg.layers[i].param_norm, mc.layers[i].param_norm, 1e-12, mc.layers[i].name + " param norm");
    expect_near(mg.layers[i].update_ratio, mc.layers[i].update_ratio, 1e-12, mc.layers[i].name + " update ratio");
    EXPECT_GT(mg.layers[i].update_ratio, 0) << "measured";
  }
  ASSERT_EQ(mg.histograms.size(), mc.histograms.size());
  for (size_t i = 0; i < mc.histograms.size(); ++i) EXPECT_EQ(mg.histograms[i].bucket, mc.histograms[i].bucket) << mc.histograms[i].tag;
  const std::uint64_t tensor_bytes = static_cast<std::uint64_t>((w0.numel() + b0.numel()) * 4) * 3;  // weights twice, grads
  std::cout << "[ stats    ] before/after_update of " << tensor_bytes << " tensor bytes read back " << bytes << " bytes\n";
  EXPECT_LT(bytes, tensor_bytes / 100) << "the statistics must not copy the tensors to the host";
}

TEST(GpuStats, ALoggedStepReadsBackUnderOnePercentOfWhatItObserves) {
  ATH_REQUIRE_GPU();
  const std::string dir = athanor::testing::fresh_temp_dir("gpu_stats");
  const std::string text = athanor::testing::write_tiny_text(dir);
  auto config = [&](const std::string& name, const std::string& device, bool stats) {
    return train::Config::parse(
        "model: {type: gpt, n_layer: 2, n_head: 2, n_embd: 64, block_size: 64, dropout: 0.0}\n"
        "data: {type: text, tokenizer: byte, corpus: " + text + ", cache_dir: " + dir + "/cache, num_workers: 1}\n"
        "optimizer: {type: sgd, lr: 0.01}\n"
        "trainer: {max_steps: 3, batch_size: 8, log_every: 1, eval_every: 0, sample_every: 0}\n"
        "observe: {report: false, tensorboard: false}\n",
        "gpu_stats.yaml",
        {"out_dir=" + dir, "name=" + name, "trainer.device=" + device, std::string("observe.layer_stats=") + (stats ? "true" : "false")});
  };
  // Bytes read back in step 2 (step 1 warms up), with and without the layer statistics.
  auto step2 = [&](bool stats, std::vector<observe::StepMetrics>* hist) {
    train::Trainer t(config(stats ? "with" : "without", "cuda", stats));
    t.set_output([](const std::string&) {});
    EXPECT_TRUE(t.train_step());
    const std::uint64_t b0 = cuda::host_read_bytes(0);
    EXPECT_TRUE(t.train_step());
    const std::uint64_t b = cuda::host_read_bytes(0) - b0;
    if (hist) hist->assign(t.history().begin(), t.history().end());
    return b;
  };
  std::vector<observe::StepMetrics> gpu_hist;
  const std::uint64_t with = step2(true, &gpu_hist), without = step2(false, nullptr);
  ASSERT_FALSE(gpu_hist.empty());
  const observe::StepMetrics& g = gpu_hist.back();
  ASSERT_EQ(g.step, 2);
  ASSERT_FALSE(g.layers.empty());
  ASSERT_FALSE(g.activations.empty());
  // What the statistics describe: every weight (twice) and gradient, every observed output
  // (batch 8 x 64 tokens x its units, f32).
  double params = 0, acts = 0;
  train::Trainer probe(config("probe", "cuda", true));
  for (auto& [n, p] : probe.task().module().named_parameters()) params += static_cast<double>(p.numel());
  for (const auto& a : g.activations) acts += 8.0 * 64.0 * static_cast<double>(a.units);
  const double observed_bytes = 4.0 * (3.0 * params + acts);
  std::cout << "[ stats    ] logged step 2 read back " << with << " bytes with layer statistics, " << without
            << " without; they observe " << observed_bytes << " bytes\n";
  EXPECT_LT(static_cast<double>(with) - static_cast<double>(without), 0.01 * observed_bytes);
  // The same statistics as the CPU run of the same config (same initial weights, no dropout).
  train::Trainer cpu(config("cpu", "cpu", true));
  cpu.set_output([](const std::string&) {});
  ASSERT_TRUE(cpu.train_step());
  ASSERT_TRUE(cpu.train_step());
  const observe::StepMetrics& c = cpu.history().back();
  ASSERT_EQ(c.step, 2);
  ASSERT_EQ(c.layers.size(), g.layers.size());
  for (size_t i = 0; i < c.layers.size(); ++i) {
    EXPECT_EQ(g.layers[i].name, c.layers[i].name);
    expect_near(g.layers[i].param_norm, c.layers[i].param_norm, 1e-4, c.layers[i].name + " param norm");
    expect_near(g.layers[i].grad_norm, c.layers[i].grad_norm, 1e-2, c.layers[i].name + " grad norm");
    expect_near(g.layers[i].update_ratio, c.layers[i].update_ratio, 1e-2, c.layers[i].name + " update ratio");
  }
  ASSERT_EQ(c.activations.size(), g.activations.size());
  for (size_t i = 0; i < c.activations.size(); ++i) {
    EXPECT_EQ(g.activations[i].name, c.activations[i].name);
    expect_near(g.activations[i].std, c.activations[i].std, 1e-3, c.activations[i].name + " std");
    expect_near(g.activations[i].absmax, c.activations[i].absmax, 1e-3, c.activations[i].name + " absmax");
  }
}
