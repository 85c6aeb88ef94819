// safetensors: round trip of every dtype, reading files written by another
// writer (the Python fixture generator), and a clear error for each corruption.
#include <cstring>
#include <filesystem>
#include <fstream>

#include "athanor/ckpt/safetensors.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
namespace fs = std::filesystem;

namespace {
std::string tmp(const std::string& name) { return (fs::temp_directory_path() / ("athanor_st_" + name)).string(); }
std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
std::string with_header(const std::string& json, const std::string& data) {
  std::string h = json;
  h.append((8 - h.size() % 8) % 8, ' ');
  uint64_t n = h.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + h + data;
}
}  // namespace

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  ckpt::NamedTensors in;
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8, DType::boolean}) {
    Tensor t = dt == DType::boolean ? from_vector(std::vector<double>{1, 0, 1, 1, 0, 0}, {2, 3}, TensorOptions(dt))
                                    : from_vector(std::vector<double>{1, -2, 3.5, 4, 5, 6}, {2, 3}, TensorOptions(dt));
    if (dt == DType::u8) t = from_vector(std::vector<double>{1, 2, 3, 4, 5, 250}, {2, 3}, TensorOptions(dt));
    in.emplace_back(std::string("t_") + dtype_name(dt), t);
  }
  in.emplace_back("scalar", scalar_tensor(7.0));
  in.emplace_back("empty", zeros({0, 4}));
  in.emplace_back("transposed", from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}).t());  // non-contiguous
  const std::string path = tmp("roundtrip.safetensors");
  ckpt::save_safetensors(path, in, {{"format", "pt"}, {"step", "12"}});
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  const std::string bytes = read_file(path);
  uint64_t len;
  std::memcpy(&len, bytes.data(), 8);
  EXPECT_EQ(len % 8, 0u);  // header padded to 8 bytes
  auto f = ckpt::load_safetensors(path);
  EXPECT_EQ(f.metadata.at("step"), "12");
  ASSERT_EQ(f.tensors.size(), in.size());
  for (auto& [name, t] : in) {
    SCOPED_TRACE(name);
    const Tensor* got = f.find(name);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(got->dtype(), t.dtype());
    EXPECT_EQ(got->sizes(), t.sizes());
    EXPECT_EQ(got->to_vector(), t.to_vector());
  }
}

TEST(Safetensors, ReadsFilesFromAnotherWriter) {
  auto f = ckpt::load_safetensors(std::string(ATHANOR_FIXTURES_DIR) + "/gpt_tiny.safetensors");
  ASSERT_NE(f.find("transformer.wte.weight"), nullptr);
  EXPECT_EQ(f.find("transformer.wte.weight")->sizes(), (Shape{37, 16}));
  EXPECT_EQ(f.metadata.at("n_layer"), "2");
}

TEST(Safetensors, U16LoadsAsI32) {
  std::string data(4, '\0');
  const uint16_t v[2] = {65535, 7};
  std::memcpy(data.data(), v, 4);
  auto f = ckpt::parse_safetensors(with_header(R"({"x":{"dtype":"U16","shape":[2],"data_offsets":[0,4]}})", data), "mem");
  EXPECT_EQ(f.find("x")->to_vector(), (std::vector<double>{65535, 7}));
}

TEST(Safetensors, EveryCorruptionIsAClearError) {
  const std::string good_json = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  const std::string data(12, '\0');
  EXPECT_NO_THROW(ckpt::parse_safetensors(with_header(good_json, data), "ok"));
  struct Case {
    std::string bytes, expect;
  };
  std::string huge_len(8, '\0');
  const uint64_t big = 1ull << 40;
  std::memcpy(huge_len.data(), &big, 8);
  std::string past_end(8, '\0');
  const uint64_t pe = 1000;
  std::memcpy(past_end.data(), &pe, 8);
  const std::vector<Case> cases = {
      {"abc", "too short"},
      {huge_len + "{}", "exceeds the 100 MiB limit"},
      {past_end + "{}", "larger than the file"},
      {with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", data), "not valid JSON"},
      {with_header(R"([1,2])", ""), "must be a JSON object"},
      {with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", data), "appears twice"},
      {with_header(R"({"a":{"dtype":"Q8","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')), "unsupported dtype"},
      {with_header(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0')), "invalid dimension"},
      {with_header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')), "needs 12"},
      {with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data), "overlap"},
      {with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data), "trailing bytes"},
      {with_header(good_json, std::string(10, '\0')), "fall outside the data block"},
      {with_header(R"({"a":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\x07')), "BOOL but holds"},
      {with_header(R"({"__metadata__":{"k":3}})", ""), "not a string"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.expect);
    const std::string msg = error_message([&] { ckpt::parse_safetensors(c.bytes, "model.safetensors"); });
    EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
  }
}

TEST(Safetensors, TruncatedAndBitFlippedFilesOnDisk) {
  const std::string path = tmp("trunc.safetensors");
  ckpt::save_safetensors(path, {{"w", ones({64})}, {"b", zeros({3})}});
  std::string bytes = read_file(path);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 5);
  EXPECT_NE(error_message([&] { ckpt::load_safetensors(path); }).find(path), std::string::npos);
  std::string flipped = bytes;
  flipped[8] ^= 0x55;  // the header's opening brace: no longer JSON (a flip inside a name can stay valid;
                       // the checkpoint manifest's checksum catches those)
  std::ofstream(path, std::ios::binary | std::ios::trunc) << flipped;
  EXPECT_NE(error_message([&] { ckpt::load_safetensors(path); }).find(path), std::string::npos);
  EXPECT_NE(error_message([&] { ckpt::load_safetensors("/nonexistent/x.safetensors"); }).find("/nonexistent/x.safetensors"), std::string::npos);
}

}  // namespace athanor
