// load_safetensors_into: a file read straight into existing tensors (how a resume
// restores a model) must give the same values as load_safetensors, and refuse a
// file that does not fit before writing anything.
#include <filesystem>

#include "athanor/ckpt/safetensors.h"
#include "athanor/ops.h"
#include "test_util.h"

namespace athanor {
using ckpt::NamedTensors;

namespace {
NamedTensors sample_tensors() {
  manual_seed(3);
  return {{"a", randn({64, 1024})}, {"b", randn({300}).to(DType::bf16)}, {"c", arange(0, 10, TensorOptions(DType::i64))},
          {"d", gt(randn({7}), 0.0)}};
}
NamedTensors zeros_like_all(const NamedTensors& ts) {
  NamedTensors out;
  for (const auto& [n, t] : ts) out.emplace_back(n, zeros(t.sizes(), TensorOptions(t.dtype())));
  return out;
}
bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() && std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}
}  // namespace

TEST(SafetensorsInto, FillsExistingTensorsWithTheFilesBytes) {
  const std::string dir = testing::fresh_temp_dir("st_into");
  const std::string path = dir + "/m.safetensors";
  const NamedTensors src = sample_tensors();
  ckpt::save_safetensors(path, src);
  NamedTensors dst = zeros_like_all(src);
  const int64_t v0 = dst[0].second.version();
  ckpt::load_safetensors_into(path, dst);
  const auto ref = ckpt::load_safetensors(path);  // the independent path (mmap/read + copy)
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(dst[i].second, src[i].second)) << src[i].first;
    EXPECT_TRUE(bitwise_equal(dst[i].second, *ref.find(src[i].first))) << src[i].first;
  }
  EXPECT_GT(dst[0].second.version(), v0);  // in-place write is visible to saved-tensor checks
}

TEST(SafetensorsInto, RefusesAFileThatDoesNotFitAndWritesNothing) {
  const std::string dir = testing::fresh_temp_dir("st_into_bad");
  const std::string path = dir + "/m.safetensors";
  const NamedTensors src = sample_tensors();
  ckpt::save_safetensors(path, src);
  auto expect_error = [&](NamedTensors dst, const std::string& needle) {
    try {
      ckpt::load_safetensors_into(path, dst);
      FAIL() << "no error; expected: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
    EXPECT_EQ(sum(abs(dst[0].second)).item(), 0.0);  // untouched
  };
  NamedTensors wrong_shape = zeros_like_all(src);
  wrong_shape[0].second = zeros({64, 1000});
  expect_error(wrong_shape, "do not fit");
  NamedTensors wrong_name = zeros_like_all(src);
  wrong_name[1].first = "bb";
  expect_error(wrong_name, "missing tensors: bb");
  NamedTensors fewer = zeros_like_all(src);
  fewer.pop_back();
  expect_error(fewer, "holds 4 tensors");
  // A truncated file is caught by the header validation.
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 100);
  expect_error(zeros_like_all(src), "data_offsets");
}

}  // namespace athanor
