#pragma once
// Token shards in llm.c's format: a 256 x i32 header (magic 20240520, version
// 1 = u16 tokens or 2 = u32 tokens, token count), then the tokens. Read by
// memory-mapping; every header field and the file length are validated.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "athanor/data/dataset.h"

namespace athanor::data {

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size);

class TokenShard {
 public:
  // Errors name the file and what is wrong (bad magic, truncated, a token >= vocab_size at position i).
  TokenShard(const std::string& path, int64_t vocab_size);
  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  int64_t size() const { return count_; }
  int32_t operator[](int64_t i) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* tokens_ = nullptr;
  int64_t count_ = 0;
  int bytes_per_token_ = 2;
};

// Non-overlapping windows of block_size+1 tokens over one shard:
// input = tokens[i*T : i*T+T], target = tokens[i*T+1 : i*T+T+1].
std::shared_ptr<Dataset> token_windows(std::shared_ptr<TokenShard> shard, int64_t block_size);

// `athanor prepare`: tokenizes a text file into train/val shards (val = the last
// val_fraction of the text). Returns the two shard paths.
std::pair<std::string, std::string> prepare_text(const std::string& text_path, const std::string& out_dir,
                                                 const std::string& tokenizer_kind, const std::string& tokenizer_dir,
                                                 double val_fraction);

}  // namespace athanor::data
