// Fashion-MNIST (Xiao et al. 2017) from Debian's dataset-fashion-mnist: four
// gzipped IDX files, read once into memory as u8. get() normalizes on the fly:
// image [1, 28, 28] f32 = (x / 255 - 0.2860) / 0.3530, label [] i64 in 0..9
// (normalize = false: the raw pixel values 0..255 as f32).
#include <algorithm>
#include <cstring>
#include <filesystem>

#include "athanor/core/error.h"
#include "athanor/data/dataset.h"
#include "data/idx.h"

namespace athanor::data {
namespace {

constexpr const char* kOp = "fashion_mnist";
constexpr const char* kInstallHint = "install the data set: apt-get install dataset-fashion-mnist (or pass the directory that holds the four *-ubyte.gz files)";
constexpr int64_t kRows = 28, kCols = 28;
constexpr float kMean = 0.2860f, kStd = 0.3530f;

class FashionMnist final : public Dataset {
 public:
  FashionMnist(const std::string& dir, bool train, bool normalize) : train_(train), normalize_(normalize) {
    namespace fs = std::filesystem;
    ATH_CHECK(fs::is_directory(dir), kOp, "Fashion-MNIST directory not found: ", dir, Hint{kInstallHint});
    const std::string prefix = train ? "train" : "t10k";
    const std::string images_path = (fs::path(dir) / (prefix + "-images-idx3-ubyte.gz")).string();
    const std::string labels_path = (fs::path(dir) / (prefix + "-labels-idx1-ubyte.gz")).string();
    for (const auto& p : {images_path, labels_path})
      ATH_CHECK(fs::exists(p), kOp, "Fashion-MNIST file not found: ", p, Hint{kInstallHint});

    IdxArray images = read_idx_u8(images_path, 3);
    IdxArray labels = read_idx_u8(labels_path, 1);
    ATH_CHECK(images.dims[1] == kRows && images.dims[2] == kCols, kOp, images_path, " holds images of ", images.dims[1], "x",
              images.dims[2], " pixels, expected 28x28", Hint{"this is not a Fashion-MNIST images file"});
    ATH_CHECK(images.dims[0] == labels.dims[0], kOp, images_path, " has ", images.dims[0], " images but ", labels_path, " has ",
              labels.dims[0], " labels", Hint{"the two files belong to different splits or one is damaged; reinstall the package"});
    for (size_t i = 0; i < labels.data.size(); ++i)
      ATH_CHECK(labels.data[i] <= 9, kOp, labels_path, ": label ", int(labels.data[i]), " at index ", i,
                " is out of range 0..9", Hint{"the file is damaged; reinstall the package"});
    count_ = images.dims[0];
    pixels_ = std::move(images.data);
    labels_ = std::move(labels.data);
  }

  int64_t size() const override { return count_; }

  Sample get(int64_t index) const override {
    check_index(index);
    Sample s;
    s.input = empty({1, kRows, kCols}, DType::f32);
    s.target = empty({}, DType::i64);
    write_sample(index, s.input.data_ptr<float>(), s.target.data_ptr<int64_t>());
    return s;
  }

  // The batch filled in place: rows of one [N, 1, 28, 28] tensor, labels of one [N].
  std::optional<Batch> get_batch(const std::vector<int64_t>& ids) const override {
    ATH_CHECK(!ids.empty(), kOp, "no indices for a batch of ", describe(), Hint{"a batch needs at least one sample"});
    for (int64_t id : ids) check_index(id);
    const auto n = static_cast<int64_t>(ids.size());
    Batch b;
    b.input = empty({n, 1, kRows, kCols}, DType::f32);
    b.target = empty({n}, DType::i64);
    float* images = b.input.data_ptr<float>();
    int64_t* labels = b.target.data_ptr<int64_t>();
    // The images of a shuffled batch are scattered over the 47 MB of pixels: each one is
    // a round trip to memory, so the loop asks for a few images ahead. 128 images: 78 ->
    // 11 us (with the arithmetic below instead of a table lookup; /tmp harness, medians of
    // 2000 batches). A loader thread building a batch takes a core from the step: the
    // MLP's first GEMM ran 110 us longer with loader threads than without.
    constexpr int64_t kAhead = 4;
    for (int64_t i = 0; i < std::min(n, kAhead); ++i) prefetch_image(ids[i]);
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n) prefetch_image(ids[i + kAhead]);
      write_sample(ids[i], images + i * kRows * kCols, labels + i);
    }
    b.sample_ids = ids;
    b.num_targets = n;
    return b;
  }

  std::string describe() const override {
    return std::string("fashion-mnist ") + (train_ ? "train" : "test") + " (" + std::to_string(count_) + " images)";
  }

 private:
  void check_index(int64_t index) const {
    ATH_CHECK(index >= 0 && index < count_, kOp, "index ", index, " is out of range for ", describe(),
              Hint{"valid indices are 0 .. size()-1"});
  }
  void prefetch_image(int64_t index) const {
    const uint8_t* src = pixels_.data() + index * kRows * kCols;
    for (int64_t at = 0; at < kRows * kCols; at += 64) __builtin_prefetch(src + at);
    __builtin_prefetch(src + kRows * kCols - 1);
  }
  // (x / 255 - mean) / std in f32, computed per pixel rather than looked up in a 256-entry
  // table: the loop vectorizes, and each operation is exactly rounded, so the values are
  // bitwise those of the table it replaced.
  void write_sample(int64_t index, float* image, int64_t* label) const {
    const uint8_t* src = pixels_.data() + index * kRows * kCols;
    if (normalize_)
      for (int64_t i = 0; i < kRows * kCols; ++i) image[i] = (static_cast<float>(src[i]) / 255.0f - kMean) / kStd;
    else
      for (int64_t i = 0; i < kRows * kCols; ++i) image[i] = static_cast<float>(src[i]);
    *label = labels_[index];
  }

  bool train_;
  bool normalize_;
  int64_t count_ = 0;
  std::vector<uint8_t> pixels_, labels_;
};

}  // namespace

std::string default_fashion_mnist_dir() { return "/usr/share/datasets/fashion-mnist"; }

std::shared_ptr<Dataset> fashion_mnist(const std::string& dir, bool train, bool normalize) {
  return std::make_shared<FashionMnist>(dir, train, normalize);
}

}  // namespace athanor::data
