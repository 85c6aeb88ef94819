// The byte tokenizer: token id = byte value (vocab 256). Lossless for any bytes.
#include "athanor/core/error.h"
#include "athanor/data/tokenizer.h"

namespace athanor::data {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out(ids.size(), '\0');
    for (size_t i = 0; i < ids.size(); ++i) {
      ATH_CHECK(ids[i] >= 0 && ids[i] < 256, "byte_tokenizer.decode", "token ", ids[i], " at position ", i,
                " is not a byte (the byte tokenizer's vocabulary is 0..255)",
                Hint{"decode ids with the tokenizer that produced them"});
      out[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
    }
    return out;
  }
  int64_t vocab_size() const override { return 256; }
  std::string name() const override { return "byte"; }
};

}  // namespace

std::unique_ptr<Tokenizer> byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

}  // namespace athanor::data
