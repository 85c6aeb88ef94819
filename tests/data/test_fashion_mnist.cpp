// IDX parsing on synthetic (valid, corrupted, truncated) gzip files, and the
// real Fashion-MNIST from Debian's dataset-fashion-mnist when installed.
#include <cmath>
#include <optional>

#include "athanor/data/dataset.h"
#include "data/idx.h"
#include "data_test_util.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
using namespace athanor::data;

namespace {

std::vector<uint8_t> idx_header(uint8_t ndim, const std::vector<uint32_t>& dims, uint8_t type = 0x08) {
  std::vector<uint8_t> h = {0, 0, type, ndim};
  for (uint32_t d : dims) {
    h.push_back(uint8_t(d >> 24));
    h.push_back(uint8_t(d >> 16));
    h.push_back(uint8_t(d >> 8));
    h.push_back(uint8_t(d));
  }
  return h;
}

std::vector<uint8_t> images_file(uint32_t n, uint32_t rows = 28, uint32_t cols = 28, int64_t drop = 0) {
  auto b = idx_header(3, {n, rows, cols});
  for (uint32_t i = 0; i < n * rows * cols; ++i) b.push_back(uint8_t((i * 7 + i / 784) % 256));
  b.resize(b.size() - drop);
  return b;
}

std::vector<uint8_t> labels_file(const std::vector<uint8_t>& labels) {
  auto b = idx_header(1, {uint32_t(labels.size())});
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

// A synthetic train split in `dir`.
void write_split(const TempDir& dir, const std::vector<uint8_t>& images, const std::vector<uint8_t>& labels) {
  write_gzip(dir.file("train-images-idx3-ubyte.gz"), images);
  write_gzip(dir.file("train-labels-idx1-ubyte.gz"), labels);
}

}  // namespace

TEST(Idx, ReadsASyntheticGzipFile) {
  TempDir dir;
  write_gzip(dir.file("a.gz"), images_file(3));
  IdxArray a = read_idx_u8(dir.file("a.gz"), 3);
  EXPECT_EQ(a.dims, (std::vector<int64_t>{3, 28, 28}));
  ASSERT_EQ(a.data.size(), 3u * 784);
  EXPECT_EQ(a.data[5], 35);
}

TEST(Idx, ErrorsNameTheFile) {
  TempDir dir;
  // bad magic
  auto bad = images_file(2);
  bad[0] = 0x1f;
  write_gzip(dir.file("bad-magic.gz"), bad);
  auto msg = error_message([&] { read_idx_u8(dir.file("bad-magic.gz"), 3); });
  EXPECT_NE(msg.find("bad-magic.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("magic"), std::string::npos) << msg;
  // wrong element type
  write_gzip(dir.file("int32.gz"), idx_header(1, {4}, 0x0C));
  msg = error_message([&] { read_idx_u8(dir.file("int32.gz"), 1); });
  EXPECT_NE(msg.find("int32.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("element type"), std::string::npos) << msg;
  // wrong number of dimensions
  write_gzip(dir.file("labels.gz"), labels_file({1, 2, 3}));
  msg = error_message([&] { read_idx_u8(dir.file("labels.gz"), 3); });
  EXPECT_NE(msg.find("labels.gz has 1 dimensions, expected 3"), std::string::npos) << msg;
  // payload truncated
  write_gzip(dir.file("short.gz"), images_file(3, 28, 28, 100));
  msg = error_message([&] { read_idx_u8(dir.file("short.gz"), 3); });
  EXPECT_NE(msg.find("short.gz is truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2352 data bytes, the file has 2252"), std::string::npos) << msg;
  // header truncated
  write_gzip(dir.file("tiny.gz"), {0, 0, 8, 3, 0, 0});
  msg = error_message([&] { read_idx_u8(dir.file("tiny.gz"), 3); });
  EXPECT_NE(msg.find("tiny.gz is truncated"), std::string::npos) << msg;
  // trailing garbage
  auto longer = labels_file({1, 2});
  longer.push_back(9);
  write_gzip(dir.file("long.gz"), longer);
  msg = error_message([&] { read_idx_u8(dir.file("long.gz"), 1); });
  EXPECT_NE(msg.find("long.gz has 1 unexpected bytes"), std::string::npos) << msg;
  // empty file
  write_bytes(dir.file("empty.gz"), {});
  msg = error_message([&] { read_idx_u8(dir.file("empty.gz"), 1); });
  EXPECT_NE(msg.find("empty.gz is too short"), std::string::npos) << msg;
  // missing
  msg = error_message([&] { read_idx_u8(dir.file("nope.gz"), 1); });
  EXPECT_NE(msg.find("nope.gz"), std::string::npos) << msg;
}

TEST(Idx, CorruptOrTruncatedGzipStreamIsAnError) {
  TempDir dir;
  write_gzip(dir.file("ok.gz"), images_file(20));
  auto gz = read_bytes(dir.file("ok.gz"));
  ASSERT_GT(gz.size(), 100u);
  // cut the compressed stream in the middle
  write_bytes(dir.file("cut.gz"), std::vector<uint8_t>(gz.begin(), gz.begin() + gz.size() / 2));
  auto msg = error_message([&] { read_idx_u8(dir.file("cut.gz"), 3); });
  EXPECT_NE(msg.find("cut.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gzip"), std::string::npos) << msg;
  // flip bytes inside the deflate data (CRC or data error)
  auto bad = gz;
  for (size_t i = 20; i < 40; ++i) bad[i] ^= 0x5a;
  write_bytes(dir.file("flipped.gz"), bad);
  msg = error_message([&] { read_idx_u8(dir.file("flipped.gz"), 3); });
  EXPECT_NE(msg.find("flipped.gz"), std::string::npos) << msg;
}

TEST(FashionMnistSynthetic, LoadsAndNormalizes) {
  TempDir dir;
  write_split(dir, images_file(3), labels_file({7, 0, 9}));
  auto ds = fashion_mnist(dir.str(), true);
  EXPECT_EQ(ds->size(), 3);
  EXPECT_EQ(ds->describe(), "fashion-mnist train (3 images)");
  Sample s = ds->get(2);
  EXPECT_EQ(s.input.sizes(), (Shape{1, 28, 28}));
  EXPECT_EQ(s.input.dtype(), DType::f32);
  EXPECT_EQ(s.target.sizes(), Shape{});
  EXPECT_EQ(s.target.dtype(), DType::i64);
  EXPECT_EQ(s.target.item<int64_t>(), 9);
  const auto raw = images_file(3);
  const float* px = s.input.data_ptr<float>();
  // Every pixel, exactly: the image's bytes (7 i mod 256) take all 256 values.
  for (int i = 0; i < 784; ++i) {
    const float x = raw[16 + 2 * 784 + i];
    ASSERT_EQ(px[i], (x / 255.0f - 0.2860f) / 0.3530f) << i;
  }
  auto msg = error_message([&] { ds->get(3); });
  EXPECT_NE(msg.find("index 3 is out of range"), std::string::npos) << msg;
}

// The loader's fast path fills the batch directly; it must equal collate() of
// get() (the per-sample path, itself checked against the raw bytes above).
TEST(FashionMnistSynthetic, GetBatchEqualsCollateOfGet) {
  TempDir dir;
  write_split(dir, images_file(5), labels_file({7, 0, 9, 3, 3}));
  auto ds = fashion_mnist(dir.str(), true);
  const std::vector<int64_t> ids{4, 0, 2, 2};
  std::vector<Sample> samples;
  for (int64_t id : ids) samples.push_back(ds->get(id));
  const Batch expected = collate(samples, ids);
  const std::optional<Batch> got = ds->get_batch(ids);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->input.sizes(), expected.input.sizes());
  EXPECT_EQ(got->input.dtype(), expected.input.dtype());
  EXPECT_EQ(got->target.sizes(), expected.target.sizes());
  EXPECT_EQ(got->target.dtype(), expected.target.dtype());
  EXPECT_EQ(got->input.to_vector(), expected.input.to_vector());
  EXPECT_EQ(got->target.to_vector(), expected.target.to_vector());
  EXPECT_EQ(got->sample_ids, expected.sample_ids);
  EXPECT_EQ(got->num_targets, expected.num_targets);
  auto msg = error_message([&] { ds->get_batch({1, 5}); });
  EXPECT_NE(msg.find("index 5 is out of range"), std::string::npos) << msg;
}

TEST(FashionMnistSynthetic, InconsistentFilesNameTheFiles) {
  {
    TempDir dir;
    write_split(dir, images_file(3), labels_file({1, 2}));
    auto msg = error_message([&] { fashion_mnist(dir.str(), true); });
    EXPECT_NE(msg.find("train-images-idx3-ubyte.gz has 3 images but"), std::string::npos) << msg;
    EXPECT_NE(msg.find("train-labels-idx1-ubyte.gz has 2 labels"), std::string::npos) << msg;
  }
  {
    TempDir dir;
    write_split(dir, images_file(2, 32, 32), labels_file({1, 2}));
    auto msg = error_message([&] { fashion_mnist(dir.str(), true); });
    EXPECT_NE(msg.find("32x32 pixels, expected 28x28"), std::string::npos) << msg;
  }
  {
    TempDir dir;
    write_split(dir, images_file(2), labels_file({1, 12}));
    auto msg = error_message([&] { fashion_mnist(dir.str(), true); });
    EXPECT_NE(msg.find("label 12 at index 1"), std::string::npos) << msg;
  }
  {
    TempDir dir;
    write_split(dir, images_file(2, 28, 28, 1), labels_file({1, 2}));
    auto msg = error_message([&] { fashion_mnist(dir.str(), true); });
    EXPECT_NE(msg.find("train-images-idx3-ubyte.gz is truncated"), std::string::npos) << msg;
  }
}

TEST(FashionMnistSynthetic, MissingDirOrFileSaysWhatToInstall) {
  TempDir dir;
  auto msg = error_message([&] { fashion_mnist(dir.file("absent"), true); });
  EXPECT_NE(msg.find(dir.file("absent")), std::string::npos) << msg;
  EXPECT_NE(msg.find("apt-get install dataset-fashion-mnist"), std::string::npos) << msg;
  write_gzip(dir.file("train-images-idx3-ubyte.gz"), images_file(1));
  msg = error_message([&] { fashion_mnist(dir.str(), true); });
  EXPECT_NE(msg.find("train-labels-idx1-ubyte.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("apt-get install dataset-fashion-mnist"), std::string::npos) << msg;
  msg = error_message([&] { fashion_mnist(dir.str(), false); });
  EXPECT_NE(msg.find("t10k-images-idx3-ubyte.gz"), std::string::npos) << msg;
}

namespace {
bool have_fashion_mnist() {
  return std::filesystem::exists(default_fashion_mnist_dir() + "/train-images-idx3-ubyte.gz");
}
std::shared_ptr<Dataset> fashion_train() {
  static auto ds = fashion_mnist(default_fashion_mnist_dir(), true);  // loaded once per test binary
  return ds;
}
}  // namespace

TEST(FashionMnist, SizesAndFirstLabels) {
  ATHANOR_SKIP_IF_MISSING(!have_fashion_mnist(), "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)");
  EXPECT_EQ(default_fashion_mnist_dir(), "/usr/share/datasets/fashion-mnist");
  auto train = fashion_train();
  auto test = fashion_mnist(default_fashion_mnist_dir(), false);
  EXPECT_EQ(train->size(), 60000);
  EXPECT_EQ(test->size(), 10000);
  EXPECT_EQ(train->describe(), "fashion-mnist train (60000 images)");
  EXPECT_EQ(test->describe(), "fashion-mnist test (10000 images)");
  EXPECT_EQ(train->get(0).target.item<int64_t>(), 9);  // ankle boot
  EXPECT_EQ(train->get(1).target.item<int64_t>(), 0);  // t-shirt/top
  EXPECT_EQ(test->get(0).target.item<int64_t>(), 9);
  EXPECT_EQ(test->get(1).target.item<int64_t>(), 2);   // pullover
}

TEST(FashionMnist, PixelStatisticsMatchTheNormalization) {
  ATHANOR_SKIP_IF_MISSING(!have_fashion_mnist(), "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)");
  auto train = fashion_train();
  // The normalization constants are the training set's mean and std, so the
  // normalized pixels have mean ~0 and std ~1; each class holds 6000 images.
  double sum = 0, sum2 = 0;
  std::vector<int64_t> per_class(10, 0);
  const float lo = (0.0f - 0.2860f) / 0.3530f, hi = (1.0f - 0.2860f) / 0.3530f;
  float mn = 1e9f, mx = -1e9f;
  for (int64_t i = 0; i < train->size(); ++i) {
    Sample s = train->get(i);
    const float* p = s.input.data_ptr<float>();
    double row = 0, row2 = 0;
    for (int k = 0; k < 784; ++k) {
      row += p[k];
      row2 += double(p[k]) * p[k];
      mn = std::min(mn, p[k]);
      mx = std::max(mx, p[k]);
    }
    sum += row;
    sum2 += row2;
    ++per_class[s.target.item<int64_t>()];
  }
  const double n = 60000.0 * 784.0, mean = sum / n, stdev = std::sqrt(sum2 / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 2e-3);
  EXPECT_NEAR(stdev, 1.0, 2e-3);
  EXPECT_FLOAT_EQ(mn, lo);
  EXPECT_FLOAT_EQ(mx, hi);
  for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], 6000) << "class " << c;
}

}  // namespace athanor
