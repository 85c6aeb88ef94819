#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace athanor::cli {

int train(const std::string& config_path, const std::vector<std::string>& overrides);
int eval(const std::string& run_dir, const std::vector<std::string>& overrides);
int generate(const std::string& run_dir, const std::string& prompt, int64_t tokens, const std::vector<std::string>& overrides);
int prepare(const std::string& corpus, const std::string& out_dir, const std::string& tokenizer,
            const std::string& tokenizer_dir, const std::string& corpus_dir, double val_fraction);

}  // namespace athanor::cli
