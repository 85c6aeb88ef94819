// The trainer's measurements for the doctor (train/step_observer.h), against naive
// recomputations: activation statistics (dead units per feature and per NCHW channel,
// saturation), input statistics (the NaN sample and the outlier named by id), the labels'
// entropy, the update-to-weight ratio of a real SGD step (= lr·||g||/||W||), and the
// TensorBoard histograms, recounted by the independent Python decoder.
#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "athanor/data/dataset.h"
#include "athanor/observe/tensorboard.h"
#include "athanor/train/trainer.h"
#include "test_util.h"
#include "train/step_observer.h"

namespace athanor::train {
namespace fs = std::filesystem;
using athanor::testing::fresh_temp_dir;

namespace {

Tensor from_values(const std::vector<float>& v, const Shape& shape) {
  Tensor t = empty(shape, DType::f32);
  std::copy(v.begin(), v.end(), t.data_ptr<float>());
  return t;
}

class VectorDataset final : public data::Dataset {
 public:
  explicit VectorDataset(std::vector<int64_t> labels) : labels_(std::move(labels)) {}
  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  data::Sample get(int64_t i) const override {
    data::Sample s;
    s.input = full({2}, 0.0, {DType::f32});
    s.target = full({}, static_cast<double>(labels_[static_cast<size_t>(i)]), {DType::i64});
    return s;
  }
  std::string describe() const override { return "labels"; }

 private:
  std::vector<int64_t> labels_;
};

std::string python() { return fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3"; }
int run_decoder(const std::string& args) {
  const std::string cmd = python() + " " ATHANOR_SOURCE_DIR "/tests/observe/tb_decode.py " + args;
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}
bool have_fashion() { return fs::exists(data::default_fashion_mnist_dir() + "/train-images-idx3-ubyte.gz"); }

}  // namespace

TEST(StepObserver, DeadUnitsAreFeaturesOrChannelsZeroForTheWholeBatch) {
  // [3 samples, 4 features]: feature 1 is 0 everywhere (dead), feature 3 negative→0 too,
  // features 0 and 2 fire at least once.
  const Tensor y = from_values({1, 0, 0, 0, /**/ 0, 0, 2, 0, /**/ 0, 0, 0, 0}, {3, 4});
  const auto a = activation_stats("l:relu", "relu", y);
  EXPECT_DOUBLE_EQ(a.dead_frac, 0.5);
  EXPECT_DOUBLE_EQ(a.zero_frac, 10.0 / 12.0);
  EXPECT_EQ(a.units, 4);
  EXPECT_DOUBLE_EQ(a.mean, 3.0 / 12.0);
  // NCHW [2, 3, 2, 1]: channel 0 fires once, channels 1 and 2 never.
  const Tensor c = from_values({0, 5, 0, 0, 0, 0, /**/ 0, 0, 0, 0, 0, 0}, {2, 3, 2, 1});
  EXPECT_NEAR(activation_stats("c:relu", "relu", c).dead_frac, 2.0 / 3.0, 1e-12);
  // Not a ReLU: no dead fraction; sigmoid saturation counts values beyond 1% of the bounds.
  EXPECT_LT(activation_stats("l:linear", "linear", y).dead_frac, 0);
  const Tensor s = from_values({0.001f, 0.5f, 0.995f, 0.3f}, {1, 4});
  EXPECT_DOUBLE_EQ(activation_stats("s:sigmoid", "sigmoid", s).saturated_frac, 0.5);
}

TEST(StepObserver, InputStatisticsNameTheNanSampleAndTheOutlier) {
  data::Batch b;
  b.input = from_values({0.5f, -1, /**/ 1, std::nanf(""), /**/ 2, 0.25f, /**/ -1e4f, 3}, {4, 2});
  b.sample_ids = {10, 11, 12, 13};
  const observe::InputStats s = input_stats({b});
  ASSERT_TRUE(s.present);
  EXPECT_EQ(s.nonfinite_ids, std::vector<int64_t>{11});
  EXPECT_EQ(s.max_id, 13);
  EXPECT_DOUBLE_EQ(s.max_absmax, 1e4);
  EXPECT_DOUBLE_EQ(s.median_absmax, 2.0);  // samples 10, 12, 13: 1, 2, 1e4
  EXPECT_EQ(s.samples, 4);
  // The mean over the samples whose inputs are finite (11 is left out): 6 values.
  EXPECT_NEAR(s.mean, (0.5 - 1 + 2 + 0.25 - 1e4 + 3) / 6, 1e-9);
  data::Batch tokens;
  tokens.input = full({2, 3}, 1.0, {DType::i64});
  EXPECT_FALSE(input_stats({tokens}).present);
}

TEST(StepObserver, LabelEntropyOfAKnownDistribution) {
  // Three classes with frequencies 1/2, 1/4, 1/4: H = 1.5 ln 2.
  std::vector<int64_t> labels;
  for (int i = 0; i < 400; ++i) labels.push_back(i % 4 == 0 ? 1 : i % 4 == 1 ? 2 : 0);
  int64_t classes = 0;
  EXPECT_NEAR(label_entropy(VectorDataset(labels), 400, &classes), 1.5 * std::log(2.0), 1e-12);
  EXPECT_EQ(classes, 3);
}

TEST(StepObserver, UpdateRatioOfAPlainSgdStepIsLrTimesGradOverWeight) {
  ATHANOR_SKIP_IF_MISSING(!have_fashion(), "dataset-fashion-mnist is not installed");
  const std::string dir = fresh_temp_dir("step_observer_sgd");
  const double lr = 0.05;
  Trainer t(Config::parse("model: {type: mlp, sizes: [784, 16, 10]}\n"
                          "data: {type: fashion_mnist, num_workers: 0, train_samples: 256}\n"
                          "optimizer: {type: sgd, lr: 0.05, packed_weights: false}\n"
                          "trainer: {max_steps: 3, batch_size: 32, eval_every: 0, log_every: 1}\n"
                          "observe: {tensorboard: true, report: false, peak_gflops: 100, histograms_every: 1}\n",
                          "sgd.yaml", {"out_dir=" + dir, "name=run"}));
  t.set_output([](const std::string&) {});
  while (t.train_step()) {
  }
  const StepMetrics& m = t.history().back();
  ASSERT_EQ(m.layers.size(), 4u);  // two weights, two biases
  for (const auto& l : m.layers) {
    SCOPED_TRACE(l.name);
    // SGD without momentum or decay: dW = -lr·g exactly (f32 rounding aside).
    EXPECT_NEAR(l.update_ratio, lr * l.grad_norm / l.param_norm, 1e-5 * lr * l.grad_norm / l.param_norm + 1e-9);
    EXPECT_EQ(l.ndim, l.name.find("weight") != std::string::npos ? 2 : 1);
  }
  ASSERT_EQ(m.activations.size(), 2u);  // layers.0 (linear_relu) and layers.2 (linear)
  EXPECT_EQ(m.activations[0].name, "layers.0:linear_relu");
  EXPECT_GE(m.activations[0].dead_frac, 0.0);
  // The histograms reached TensorBoard and decode: structure checked by the Python decoder.
  std::string events;
  for (const auto& e : fs::directory_iterator(t.run_dir()))
    if (e.path().filename().string().rfind("events.out.tfevents", 0) == 0) events = e.path().string();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(run_decoder("--histograms '" + events + "'"), 0);
  // metrics.jsonl carries the per-layer record of every logged step.
  std::ifstream in(fs::path(t.run_dir()) / "metrics.jsonl");
  int with_layers = 0;
  for (std::string line; std::getline(in, line);) with_layers += nlohmann::json::parse(line).contains("layers");
  EXPECT_EQ(with_layers, 3);
}

TEST(StepObserver, HistogramsDecodeToTheirValuesInTheIndependentDecoder) {
  const std::string dir = fresh_temp_dir("step_observer_hist");
  const int probe = std::system((python() + " -c 'import google.protobuf' 2>/dev/null").c_str());
  ASSERT_EQ(probe, 0) << "python3 with google.protobuf is needed: apt-get install python3-protobuf (scripts/setup.sh)";
  std::ostringstream expected;
  expected.precision(17);
  expected << "{\"file_version\": \"brain.Event:2\", \"scalars\": [], \"histograms\": [";
  std::string path;
  {
    observe::TensorBoardWriter w(dir + "/tb");
    path = w.path();
    Generator gen(7);
    for (int k = 0; k < 3; ++k) {
      // Normal values, a run of exact zeros, a repeated maximum, and a NaN (left out).
      Tensor x = randn({200}, {}, gen);
      float* d = x.data_ptr<float>();
      for (int i = 0; i < 20; ++i) d[i] = 0;
      d[50] = d[51] = 3.5f;
      d[60] = std::nanf("");
      const observe::Histogram h = histogram("weights/w" + std::to_string(k), x, 7 + k);
      w.add_histograms({h}, 100 * k, 1.7e9 + k);
      expected << (k ? ", " : "") << "{\"tag\": \"" << h.tag << "\", \"step\": " << 100 * k << ", \"wall_time\": " << 1.7e9 + k
               << ", \"values\": [";
      bool first = true;
      for (double v : x.to_vector())
        if (std::isfinite(v)) expected << (first ? "" : ", ") << v, first = false;
      expected << "]}";
    }
  }
  expected << "]}";
  std::ofstream(dir + "/expected.json") << expected.str();
  EXPECT_EQ(run_decoder("'" + path + "' '" + dir + "/expected.json'"), 0);
  // A changed value moves a count or a sum: the decoder must notice.
  std::string wrong = expected.str();
  wrong.replace(wrong.find("3.5"), 3, "2.5");
  std::ofstream(dir + "/wrong.json") << wrong;
  EXPECT_EQ(run_decoder("'" + path + "' '" + dir + "/wrong.json'"), 1);
}

}  // namespace athanor::train
