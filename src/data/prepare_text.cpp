// prepare_text (`athanor prepare`): text file -> tokens -> train.bin + val.bin.
// The whole text is tokenized once; val is the last val_fraction of the tokens
// (the tail of the text), train the rest.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "athanor/core/error.h"
#include "athanor/data/token_shard.h"
#include "athanor/data/tokenizer.h"

namespace athanor::data {

std::pair<std::string, std::string> prepare_text(const std::string& text_path, const std::string& out_dir,
                                                 const std::string& tokenizer_kind, const std::string& tokenizer_dir,
                                                 double val_fraction) {
  namespace fs = std::filesystem;
  const char* op = "prepare_text";
  ATH_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, op, "val_fraction must be in [0, 1), got ", val_fraction,
            Hint{"e.g. 0.1 keeps the last 10% of the tokens for validation"});
  std::ifstream f(text_path, std::ios::binary);
  ATH_CHECK(f.good(), op, "cannot open text file ", text_path, Hint{"check the path"});
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  ATH_CHECK(!text.empty(), op, text_path, " is empty", Hint{"prepare a file that holds some text"});

  auto tok = make_tokenizer(tokenizer_kind, tokenizer_dir);
  const std::vector<int32_t> ids = tok->encode(text);
  const auto n = static_cast<int64_t>(ids.size());
  const auto n_val = static_cast<int64_t>(std::llround(static_cast<double>(n) * val_fraction));
  ATH_CHECK(val_fraction == 0.0 || (n_val > 0 && n_val < n), op, text_path, " gives ", n, " tokens, too few to split with val_fraction ",
            val_fraction, Hint{"use more text or another val_fraction"});

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  ATH_CHECK(!ec && fs::is_directory(out_dir), op, "cannot create output directory ", out_dir, ": ", ec.message(),
            Hint{"check the path and permissions"});
  const std::string train_path = (fs::path(out_dir) / "train.bin").string();
  const std::string val_path = (fs::path(out_dir) / "val.bin").string();
  write_token_shard(train_path, std::vector<int32_t>(ids.begin(), ids.end() - n_val), tok->vocab_size());
  write_token_shard(val_path, std::vector<int32_t>(ids.end() - n_val, ids.end()), tok->vocab_size());
  return {train_path, val_path};
}

}  // namespace athanor::data
