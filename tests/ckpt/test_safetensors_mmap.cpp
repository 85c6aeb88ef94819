// load_safetensors on files above kSafetensorsMmapThreshold: memory-mapped, tensors
// aliasing the map where aligned, same values and the same validation as small files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "athanor/ckpt/safetensors.h"
#include "test_util.h"

namespace athanor {
namespace {
namespace fs = std::filesystem;

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

Tensor random_f32(int64_t n, uint64_t seed) {
  std::vector<float> v = testing::random_floats(n, seed, 1.0);
  Tensor t = empty({n}, TensorOptions(DType::f32));
  std::memcpy(t.raw_data(), v.data(), v.size() * 4);
  return t;
}

// ~1.6 MB: an aligned f32, a 3-byte u8 that leaves the next f32 misaligned, i64, bool.
ckpt::NamedTensors large_set() {
  Tensor ids = empty({1000}, TensorOptions(DType::i64));
  for (int64_t i = 0; i < 1000; ++i) ids.data_ptr<int64_t>()[i] = i * 7919 - 3;
  Tensor odd = empty({3}, TensorOptions(DType::u8));
  for (int i = 0; i < 3; ++i) odd.data_ptr<uint8_t>()[i] = static_cast<uint8_t>(200 + i);
  Tensor flags = empty({5}, TensorOptions(DType::boolean));
  for (int i = 0; i < 5; ++i) static_cast<uint8_t*>(flags.raw_data())[i] = i % 2;
  return {{"weight", random_f32(300000, 1).reshape({600, 500})},
          {"odd", odd},
          {"misaligned", random_f32(100000, 2)},
          {"ids", ids},
          {"flags", flags}};
}

TEST(SafetensorsMmap, LargeFileLoadsEqualAndAliasesTheMap) {
  const std::string path = testing::fresh_temp_dir("st_mmap_equal") + "/big.safetensors";
  const ckpt::NamedTensors in = large_set();
  ckpt::save_safetensors(path, in, {{"k", "v"}});
  ASSERT_GE(fs::file_size(path), ckpt::kSafetensorsMmapThreshold);

  const ckpt::SafetensorsFile f = ckpt::load_safetensors(path);
  EXPECT_EQ(f.metadata.at("k"), "v");
  ASSERT_EQ(f.tensors.size(), in.size());
  for (const auto& [name, t] : in) {
    const Tensor* got = f.find(name);
    ASSERT_NE(got, nullptr) << name;
    EXPECT_TRUE(bitwise_equal(*got, t)) << name;
  }
  // Zero-copy where aligned; copied where the file offset is misaligned for the dtype.
  EXPECT_FALSE(f.find("weight")->storage()->owned());
  EXPECT_TRUE(f.find("misaligned")->storage()->owned());
}

TEST(SafetensorsMmap, TensorsOutliveTheFileAndWritesStayPrivate) {
  const std::string path = testing::fresh_temp_dir("st_mmap_private") + "/big.safetensors";
  const ckpt::NamedTensors in = large_set();
  ckpt::save_safetensors(path, in);
  Tensor w;
  {
    w = ckpt::load_safetensors(path).tensors.front().second;  // the SafetensorsFile is gone after this
  }
  fs::remove(path);  // the map keeps the unlinked file's pages
  EXPECT_TRUE(bitwise_equal(w, in.front().second));
  ckpt::save_safetensors(path, in);
  Tensor again = ckpt::load_safetensors(path).tensors.front().second;
  again.fill_(3.0);  // copy-on-write: the file keeps its bytes
  EXPECT_TRUE(bitwise_equal(ckpt::load_safetensors(path).tensors.front().second, in.front().second));
}

TEST(SafetensorsMmap, ErrorsInLargeFilesNameTheFile) {
  const std::string dir = testing::fresh_temp_dir("st_mmap_errors");
  const std::string good = dir + "/good.safetensors";
  ckpt::save_safetensors(good, large_set());
  const uint64_t size = fs::file_size(good);

  const std::string truncated = dir + "/truncated.safetensors";
  fs::copy_file(good, truncated);
  fs::resize_file(truncated, size - 100);
  std::string msg = testing::error_message([&] { ckpt::load_safetensors(truncated); });
  EXPECT_NE(msg.find(truncated), std::string::npos) << msg;
  EXPECT_NE(msg.find("fall outside the data block"), std::string::npos) << msg;

  const std::string longer = dir + "/longer.safetensors";
  fs::copy_file(good, longer);
  std::ofstream(longer, std::ios::binary | std::ios::app) << "trailing";
  msg = testing::error_message([&] { ckpt::load_safetensors(longer); });
  EXPECT_NE(msg.find(longer), std::string::npos) << msg;
  EXPECT_NE(msg.find("trailing bytes"), std::string::npos) << msg;

  const std::string bad_len = dir + "/bad_len.safetensors";
  fs::copy_file(good, bad_len);
  {
    std::fstream f(bad_len, std::ios::binary | std::ios::in | std::ios::out);
    const uint64_t huge = size;  // header "longer" than the file allows
    f.write(reinterpret_cast<const char*>(&huge), 8);
  }
  msg = testing::error_message([&] { ckpt::load_safetensors(bad_len); });
  EXPECT_NE(msg.find(bad_len), std::string::npos) << msg;
  EXPECT_NE(msg.find("is larger than the file"), std::string::npos) << msg;

  const std::string bad_bool = dir + "/bad_bool.safetensors";
  fs::copy_file(good, bad_bool);
  {
    std::fstream f(bad_bool, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(size - 1));  // "flags" is last: its final byte
    f.put(7);
  }
  msg = testing::error_message([&] { ckpt::load_safetensors(bad_bool); });
  EXPECT_NE(msg.find(bad_bool), std::string::npos) << msg;
  EXPECT_NE(msg.find("'flags' is BOOL but holds the byte 7"), std::string::npos) << msg;

  msg = testing::error_message([&] { ckpt::load_safetensors(dir); });  // a directory, not a file
  EXPECT_NE(msg.find(dir), std::string::npos) << msg;
}

}  // namespace
}  // namespace athanor
